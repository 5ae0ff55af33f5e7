"""Names in the code: shape letters in names (``q_LxK``, ``logits_BxC``) come from the legend in
attn's docstring, and every `attn.` path a docstring or comment names (``attn.encoders.blocks``,
``attn.multihead.Steps``) exists."""

import ast
import dataclasses
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
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


# A dotted path from the package: attn.encoders.bert.model.encode, attn.Attention.
PATH = re.compile(r"(?<![\w.])attn(?:\.[A-Za-z_]\w*)+")
PROSE = ("attn", "experiments", "benchmarks", "configs", "tests")


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def _exists(path: str) -> bool:
    """Whether `path` is a module, or an attribute (a dataclass's field included) reached from
    the longest module it starts with."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for name in parts[n:]:
            fields = (
                {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else ()
            )
            if not hasattr(obj, name) and name not in fields:
                return False
            obj = getattr(obj, name, None)
        return True
    return False


def test_every_attn_path_a_docstring_or_comment_names_exists():
    checked, wrong = 0, []
    folders = [p for folder in PROSE for p in sorted((ROOT / folder).rglob("*.py"))]
    for path in folders + sorted(ROOT.glob("*.py")):
        for number, text in _prose(path):
            for name in PATH.findall(text):
                checked += 1
                if not _exists(name):
                    wrong.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert checked > 100, "the scan found almost no attn paths: is PATH still right?"
    assert not wrong, "docstrings and comments naming what attn does not have:\n" + "\n".join(wrong)


def test_a_path_that_is_not_there_is_caught():
    assert _exists("attn.encoders.bert.model.encode") and _exists("attn.encoders.Family.score")
    assert not _exists("attn.encoders.bert_keys")
    assert not _exists("attn.encoders.bert.model.no_such_function")
    assert PATH.findall("see `attn.encoders.hub`, not xattn.y or .attn.z") == ["attn.encoders.hub"]
