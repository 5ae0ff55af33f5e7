"""Texts converted between Chinese scripts before a model reads them, by OpenCC (the converter
Wikipedia and most Chinese input tools use): `data.convert` for every text a run reads, and the
serving commands' --convert for a workdir trained without it.

A name is one of OpenCC's conversions: t2s (traditional characters to simplified), s2t (the
reverse), tw2s and hk2s (Taiwan's and Hong Kong's standards to simplified), tw2sp (also Taiwan's
phrases), ... OpenCC is imported only when a conversion is asked for (`pip install opencc`).
"""

import functools
import sys
from collections.abc import Callable, Sequence

from experiments.errors import UserError


def names(where: str, name: str) -> list[str]:
    """OpenCC's conversions, sorted; UserError naming `where`=`name` when it is not installed."""
    try:
        import opencc
    except ImportError:
        raise UserError(
            f"{where}={name!r} converts texts with OpenCC, which is not installed: "
            "pip install opencc"
        ) from None
    return sorted(c.removesuffix(".json") for c in opencc.CONFIGS)


@functools.cache
def converter(name: str, where: str = "data.convert") -> Callable[[str], str]:
    """str -> str: OpenCC's conversion `name` (e.g. "t2s"); "" converts nothing. UserError in one
    line for a name OpenCC lacks, or OpenCC not installed; `where` is the setting named there."""
    if not name:
        return lambda text: text
    known = names(where, name)
    if name not in known:
        raise UserError(f"{where}={name!r} is not an OpenCC conversion; known: {', '.join(known)}")
    import opencc

    return opencc.OpenCC(name).convert


def convert_all(
    name: str, texts: Sequence[str], where: str = "data.convert"
) -> tuple[list[str], int]:
    """`texts` converted by `name` (`converter`), and how many of them the conversion changed."""
    convert = converter(name, where)
    out = [convert(t) for t in texts]
    return out, sum(a != b for a, b in zip(out, texts, strict=True))


def summary(name: str, changed: int, total: int, what: str = "texts") -> str:
    """What a conversion did, in one line for the user: input is never changed silently."""
    return f"OpenCC {name} changed {changed:,} of {total:,} {what} before the model read them"


def report(name: str, changed: int, total: int) -> None:
    """Prints `summary` on stderr when `name` converted the texts; nothing for "" (none)."""
    if name:
        print(summary(name, changed, total), file=sys.stderr)


@functools.cache
def say(line: str) -> None:
    """Prints `line` on stderr once per process: a run reads its splits more than once (fields
    chosen from the data, then the run), and one conversion said twice reads like two."""
    print(line, file=sys.stderr)
