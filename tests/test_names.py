"""Shape letters in names (``q_LxK``, ``logits_BxC``) come from the legend in attn's docstring."""

import re
from pathlib import Path

import attn

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("attn", "experiments", "benchmarks")
# A legend entry: four spaces, the letter, two spaces, its meaning.
ENTRY = re.compile(r"^ {4}([A-Z])  \S", re.MULTILINE)
# A name whose part after its last underscore holds an uppercase letter: x_xLxD, p_nxC, m_L1.
NAME = re.compile(r"\b_*[a-z][a-z0-9_]*?_([0-9a-z]*[A-Z][A-Za-z0-9]*)\b")


def _legend() -> list[str]:
    return ENTRY.findall(attn.__doc__)


def test_the_legend_gives_each_letter_one_meaning():
    letters = _legend()
    assert len(letters) > 10, "attn.__doc__ lost its shape legend"
    twice = sorted({x for x in letters if letters.count(x) > 1})
    assert not twice, f"letters with more than one entry in attn's legend: {twice}"


def test_every_shape_letter_in_a_name_is_in_the_legend():
    legend = set(_legend())
    unknown = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for number, line in enumerate(text.splitlines(), 1):
                for m in NAME.finditer(line):
                    missing = sorted(set(re.findall("[A-Z]", m.group(1))) - legend)
                    if missing:
                        where = f"{path.relative_to(ROOT)}:{number}"
                        unknown.append(f"{where}: {m.group(0)} uses {', '.join(missing)}")
    assert not unknown, (
        "shape letters missing from the legend in attn/__init__.py (add the letter there, with "
        "one meaning, or use the legend's):\n" + "\n".join(unknown)
    )
