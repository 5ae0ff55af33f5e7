"""Which scripts texts are written in: training records its texts' letters by script
(`SCRIPTS_FILE` in the workdir), and predict notes a text mostly in a script the model has hardly
read (the Chinese default answered English confidently: Latin letters being in its vocabulary,
nothing else said it had barely trained on any)."""

import collections
import unicodedata
from collections.abc import Sequence

SCRIPTS_FILE = "scripts.json"
RARE_SCRIPT = 0.1  # a text mostly in a script under this share of the training letters is noted
_MIN_LETTERS = 3  # fewer letters say nothing of a text's script
_CJK_SCRIPTS = ("CJK", "HIRAGANA", "KATAKANA", "HANGUL")


def script_of(c: str) -> str | None:
    """The script of a letter as Unicode names it ("LATIN", "CYRILLIC", ...; ideographs, kana and
    hangul are all "CJK"); None for what is not a letter (digits, punctuation, spaces, emoji)."""
    if not unicodedata.category(c).startswith("L"):
        return None
    script = unicodedata.name(c, "OTHER").split()[0]
    return "CJK" if script in _CJK_SCRIPTS else script


def script_shares(texts: Sequence[str]) -> dict:
    """{"letters": how many letters `texts` have, "shares": {script: fraction of them}}, largest
    share first. Written at training time (`SCRIPTS_FILE`) so that predict can tell a text in a
    script the model has hardly seen: the Chinese default answered English confidently, and
    Latin letters being in its vocabulary, nothing said it had barely trained on any."""
    scripts: dict[str, str | None] = {}  # a text of 17k reviews has a few thousand characters
    counts: collections.Counter = collections.Counter()
    for text in texts:
        for c in text:
            if c not in scripts:
                scripts[c] = script_of(c)
            if scripts[c]:
                counts[scripts[c]] += 1
    total = sum(counts.values())
    shares = {k: n / total for k, n in counts.most_common()} if total else {}
    return {"letters": total, "shares": shares}


def foreign_note(trained_scripts: dict, text: str) -> list[str]:
    """A note when most of `text`'s letters are in a script that few training letters were in."""
    mine = script_shares([text])
    if mine["letters"] < _MIN_LETTERS:
        return []
    script, share = next(iter(mine["shares"].items()))
    seen = trained_scripts.get("shares", {})
    if share <= 0.5 or seen.get(script, 0.0) >= RARE_SCRIPT or not seen:
        return []
    name = lambda s: s if s == "CJK" else s.title()
    return [
        f"written in {name(script)} letters, which were {seen.get(script, 0.0):.1%} of the "
        f"letters the model was trained on (mostly {name(next(iter(seen)))}), so it knows little "
        "of such text"
    ]
