"""Labelled text a user brings: a CSV / TSV / JSONL file, or a folder of .txt files (aclImdb style).

Files: `.csv` (RFC 4180 quoting), `.tsv` (tab-separated, no quoting: quotes are text), `.jsonl` /
`.ndjson` (one JSON object per line). The first CSV/TSV row is the header; the text and label
columns are named by `text_field` / `label_field`. UTF-8 (a BOM is fine); LF, CRLF and CR line
endings may be mixed.

Folders: `<dir>/<label>/*.txt`, one review per file, or split subfolders
`<dir>/{train,test}/<label>/` (and optionally `validation/`). An `unsup/` folder (aclImdb's
unlabelled reviews) is ignored.

Labels are strings (a column of 0/1 gives the label names ("0", "1"); JSON true/false give
"false", "true"); the label names are the sorted distinct labels of the whole file unless given.
Splits: the text's stable hash decides (`splits.split_of`, 80/10/10); a `train` folder without
a `validation` sibling gives 10% of its texts (`splits.held_out`) to validation.

Malformed rows (missing field, more fields than the header, empty text, empty or unknown label,
undecodable bytes, NUL bytes, invalid JSON) are skipped and counted; more than `max_bad_fraction`
of them is a UserError, fewer is a warning on stderr. Both name the first few by line number (or
file, for folders). A CSV quote left open would make the lines up to where it closes (or the end
of the file) one field: that row is named, and every line it swallowed counts as a malformed row.
"""

import collections
import csv
import difflib
import functools
import io
import json
import math
import os
import re
import sys
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from experiments.data.splits import SPLITS, held_out, split_of
from experiments.errors import UserError

FILE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
_SHOW_BAD = 5  # how many malformed rows a message names
_LINE_END = re.compile(r"\r\n|\r|\n")

# (where, text, label, split hint, error): text/label None when missing; error set when unparsable;
# where None for a row that counts but is not named (a line swallowed by another row's quote).
Row = tuple["str | None", "str | None", "str | None", "str | None", "str | None"]


class Flags(NamedTuple):
    """How the caller's command line names the file and its two columns, for error messages."""

    path: str = "data.path"
    text_field: str = "data.text_field"
    label_field: str = "data.label_field"


CONFIG_FLAGS = Flags()  # training reads the file through config.data


def load_splits(
    path: str,
    splits: Sequence[str],
    *,
    text_field: str = "text",
    label_field: str = "label",
    max_bad_fraction: float = 0.01,
    label_names: Sequence[str] | None = None,
) -> dict[str, tuple[list[str], np.ndarray, tuple[str, ...]]]:
    """Several splits from one read of the file (bad rows are reported once, not per split)."""
    for split in splits:
        if split not in SPLITS:
            raise UserError(f"split={split!r} is not one of {SPLITS}")
    loaded = load(
        path,
        text_field=text_field,
        label_field=label_field,
        max_bad_fraction=max_bad_fraction,
        label_names=label_names,
    )
    for split in splits:
        if not loaded[split][0]:
            total = sum(len(t) for t, _, _ in loaded.values())
            raise UserError(
                f"data.path={path!r}: split {split!r} is empty ({total} usable examples in all; "
                "the 80/10/10 hash split needs more)"
            )
    return {split: loaded[split] for split in splits}


def load(
    path: str,
    *,
    text_field: str = "text",
    label_field: str = "label",
    max_bad_fraction: float = 0.01,
    label_names: Sequence[str] | None = None,
    flags: Flags = CONFIG_FLAGS,
) -> dict[str, tuple[list[str], np.ndarray, tuple[str, ...]]]:
    """All three splits of a user's data: {split: (texts, labels int32 [N], label names)}."""
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise UserError(f"data.max_bad_fraction must be in [0, 1], got {max_bad_fraction!r}")
    if not str(path or "").strip():
        raise UserError(f"{flags.path} is empty: set it to a CSV/TSV/JSONL file or a folder")
    named = f"{flags.path}={path!r}"  # how every message names the file
    p = Path(path)
    if not p.exists():
        raise UserError(f"{named} does not exist")
    if p.is_dir():
        rows = _folder_rows(p, named)
    elif p.suffix.lower() in FILE_SUFFIXES:
        rows = _file_rows(p, named, (text_field, label_field), flags)
    else:
        raise UserError(
            f"{named}: unknown file type {p.suffix!r}; expected a folder or one of "
            f"{', '.join(FILE_SUFFIXES)}"
        )

    good, bad = _check_rows(rows, label_names)
    if bad:
        named_bad = [(where, why) for where, why in bad if where is not None]
        shown = "; ".join(f"{where}: {why}" for where, why in named_bad[:_SHOW_BAD])
        more = len(named_bad) - _SHOW_BAD
        more = f" (and {more} more)" if more > 0 else ""
        msg = f"{named}: {len(bad)} of {len(rows)} rows malformed: {shown}{more}"
        if len(bad) > max_bad_fraction * len(rows):
            raise UserError(f"{msg}; that is more than data.max_bad_fraction={max_bad_fraction}")
        _warn(f"{msg}; skipped them")

    if not label_names:
        _refuse_rare_labels(named, rows, good, len(bad), max_bad_fraction)
    names = tuple(label_names) if label_names else tuple(sorted({lab for _, lab, _ in good}))
    if len(names) < 2:
        raise UserError(
            f"{named}: every row has the label {names[0]!r}; a classifier needs at "
            "least two labels (is the file sorted by label and cut short?)"
        )
    ids = {name: i for i, name in enumerate(names)}
    has_validation = any(hint == "validation" for _, _, hint in good)
    out: dict[str, tuple[list[str], list[int]]] = {s: ([], []) for s in SPLITS}
    for text, label, hint in good:
        split = _assign_split(text, hint, has_validation)
        out[split][0].append(text)
        out[split][1].append(ids[label])
    return {s: (t, np.asarray(y, np.int32), names) for s, (t, y) in out.items()}


def _refuse_rare_labels(
    named: str, rows: list[Row], good: list, bad: int, max_bad_fraction: float
) -> None:
    """A label on a few rows among many is most likely a typo (`neutral` among pos/neg, `Pos` or
    `negativ` for `pos`/`negative`), yet it would become a class of its own and could even score
    well (its rows share the typo, not the sentiment): refuse, naming each such label with its
    rows and, when it is spelt nearly like a common label, the label likely meant, and say both
    fixes: correct the rows, or declare the labels (data.label_names), which skips the others as
    malformed rows or, listed, keeps a small class on purpose. `bad`: the rows already skipped."""
    counts = collections.Counter(label for _, label, _ in good)
    if len(good) < 10:
        return
    # Rare next to the whole file and to the largest class: many small classes are no typos.
    top = max(counts.values())
    rare = sorted(
        label
        for label, n in counts.items()
        if n == 1 or (n < RARE_LABEL * len(good) and n < top / 10)
    )
    if not rare:
        return
    common = tuple(label for label in sorted(counts) if label not in rare)
    named_labels = []
    for label in rare:
        n = counts[label]
        wheres = [r[0] for r in rows if r[2] is not None and r[2].strip() == label]
        meant = _likely_meant(label, [c for c in common if counts[c] > n])
        like = f"; spelt like {meant!r}, {counts[meant]} rows" if meant is not None else ""
        named_labels.append(f"{label!r} ({n} row{'s' * (n > 1)}: {_lines(wheres)}{like})")
    skipped = bad + sum(counts[label] for label in rare)
    flag = f'--config.data.label_names="{common!r}"'
    if skipped > max_bad_fraction * len(rows):  # skipping them must not refuse the file instead
        flag += f" --config.data.max_bad_fraction={math.ceil(100 * skipped / len(rows)) / 100}"
    what = (
        "a label on only a few of {n} rows, most likely a mistake, would become a class of its own"
        if len(rare) == 1
        else "labels on only a few of {n} rows, most likely mistakes, would become classes of "
        "their own"
    ).format(n=len(good))
    rows_word = "that row" if skipped - bad == 1 else "those rows"
    raise UserError(
        f"{named}: {what}: {', '.join(named_labels)}. Fix {rows_word}, or declare the labels: "
        f"{flag} skips {rows_word} as malformed (add a label to that list to keep it as a class)"
    )


RARE_LABEL = 0.02  # a label on fewer than this fraction of the rows may be a mistake


def _likely_meant(label: str, others: Sequence[str]) -> str | None:
    """The label among `others` that `label` is most likely a misspelling of: equal but for case
    or spaces, else the closest by difflib's ratio (0.6: `postive`/`positive` 0.93, `Pos`/`pos`
    1.0, `neutral`/`negative` 0.4); None when none is close."""
    key = lambda x: re.sub(r"[\s_-]+", "", x.lower())
    by_key = {key(o): o for o in others}
    close = difflib.get_close_matches(key(label), list(by_key), n=1, cutoff=0.6)
    return by_key[close[0]] if close else None


def _lines(wheres: Sequence[str]) -> str:
    more = len(wheres) - _SHOW_BAD
    return ", ".join(wheres[:_SHOW_BAD]) + (f" and {more} more" if more > 0 else "")


@functools.cache
def _warn(msg: str) -> None:
    """Prints a warning once per process: a run reads its file twice (defaults chosen from the
    data, then the splits), and the same warning twice reads like two problems."""
    print(f"warning: {msg}", file=sys.stderr)


def _assign_split(text: str, hint: str | None, has_validation: bool) -> str:
    if hint is None:
        return split_of(text)
    if hint == "train" and not has_validation:
        return "validation" if held_out(text) else "train"
    return hint


def _check_rows(
    rows: list[Row], label_names: Sequence[str] | None
) -> tuple[list[tuple[str, str, str | None]], list[tuple[str | None, str]]]:
    """Splits rows into good (text, label, split hint) and bad (where, reason)."""
    known = set(label_names) if label_names else None
    good, bad = [], []
    for where, text, label, hint, error in rows:
        why = error
        if why is not None:
            pass
        elif text is None:
            why = "missing text field"
        elif label is None:
            why = "missing label field"
        elif "\x00" in text or "\x00" in label:
            why = "NUL byte"
        elif _has_undecodable(text) or _has_undecodable(label):
            why = "undecodable bytes (not UTF-8)"
        elif not text.strip():
            why = "empty text"
        elif not label.strip():
            why = "empty label"
        elif known is not None and label.strip() not in known:
            why = f"unknown label {label.strip()!r} (label names: {sorted(known)})"
        if why is None:
            good.append((text.strip(), label.strip(), hint))
        else:
            bad.append((where, why))
    return good, bad


# `surrogateescape` decoding maps each invalid byte to a lone surrogate U+DC80..U+DCFF.
_UNDECODABLE = re.compile("[\udc80-\udcff]")


def _has_undecodable(s: str) -> bool:
    return _UNDECODABLE.search(s) is not None


def _decode(raw: bytes) -> str:
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    return raw.decode("utf-8", "surrogateescape")


def _not_text(raw: bytes) -> str | None:
    """Why a file cannot be read as UTF-8 text, judged from its start, or None if it can."""
    head = raw[:8192]
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or _utf16_without_bom(head):
        return "is UTF-16 text; save it as UTF-8 (iconv -f UTF-16 -t UTF-8 does)"
    if sum(b < 32 and b not in b"\t\n\r\f\v" for b in head) > 0.1 * len(head):
        return "looks binary, not UTF-8 text"
    # Mostly ASCII with a few accents, each invalid, is as surely not UTF-8 as Chinese in GBK.
    invalid = len(_UNDECODABLE.findall(head.decode("utf-8", "surrogateescape")))
    if invalid > 0.1 * len(head) or invalid >= 8 and invalid > 0.5 * sum(b > 0x7F for b in head):
        if guess := _legacy_encoding(head):
            name, iconv = guess
            return f"is not UTF-8 but {name}; save it as UTF-8 (iconv -f {iconv} -t UTF-8 does)"
        return "is not UTF-8, nor any encoding recognised; save it as UTF-8"
    return None


def _utf16_without_bom(head: bytes) -> bool:
    """Mostly ASCII in UTF-16 puts a NUL in every other byte."""
    halves = head[0::2], head[1::2]
    return len(head) >= 64 and any(h.count(0) > 0.4 * len(h) for h in halves)


# Encodings a spreadsheet saves text in where it does not write UTF-8 (Excel on Chinese, Taiwanese,
# Japanese and Western Windows): (name in messages, iconv's name, Python's codec).
_LEGACY = (
    ("GBK/GB18030 (Chinese)", "GB18030", "gb18030"),
    ("Big5 (traditional Chinese)", "BIG5", "big5"),
    ("Shift-JIS (Japanese)", "SHIFT_JIS", "shift_jis"),
    ("Windows-1252 or Latin-1", "WINDOWS-1252", "cp1252"),
)
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _legacy_encoding(head: bytes) -> tuple[str, str] | None:
    """The encoding of `head` among _LEGACY, judged by what its non-ASCII characters decode to.

    Their byte ranges overlap, so nearly any of them decodes another's text without an error,
    into rare characters: GBK's pairs read as Big5 or Shift-JIS are rare or half-width kana,
    Big5's trail bytes below 0xA1 are GBK extensions, Latin-1's accents before an ASCII letter
    are rare GBK or Big5 pairs, and CJK read as Windows-1252 is a run of accented letters and
    symbols. So each candidate's score is the share of non-ASCII characters that are common in
    the script it is for; the best is named only when nearly all of them are.
    """
    scores = {}
    for name, iconv, codec in _LEGACY:
        text = _decode_prefix(head, codec)
        if text is None:
            continue
        if codec == "cp1252":  # isolated accents in words, not runs of them
            runs = _NON_ASCII.findall(text)
            common = sum(len(r) for r in runs if len(r) <= 3 and all(map(_latin, r)))
        else:  # accents inside a Latin word decode to CJK characters between ASCII letters
            padded = f" {text} "
            common = sum(
                _common(c, codec)
                and not (_ascii_letter(padded[i]) and _ascii_letter(padded[i + 2]))
                for i, c in enumerate(text)
                if ord(c) > 0x7F
            )
        scores[(name, iconv)] = common / max(sum(ord(c) > 0x7F for c in text), 1)
    best = max(scores, key=scores.get, default=None)
    return best if best is not None and scores[best] >= 0.9 else None


def _decode_prefix(head: bytes, codec: str) -> str | None:
    """`head` decoded strictly, allowing a character cut at its end; None if it does not decode."""
    for cut in range(4):
        try:
            return head[: len(head) - cut].decode(codec)
        except UnicodeDecodeError:
            continue
    return None


def _ascii_letter(c: str) -> bool:
    return c.isascii() and c.isalpha()


def _latin(c: str) -> bool:
    return (
        unicodedata.category(c).startswith("L")
        and "LATIN" in unicodedata.name(c, "")
        or (c in "\xa0«»‘’‚“”„–—…€£°·§¿¡")
    )


# Per codec, the lead bytes of its common characters: punctuation and the frequent-character
# level (GB2312's hanzi; Big5's level 1; JIS level 1 kanji, hiragana, katakana and symbols).
_COMMON_LEADS = {
    "gb18030": (range(0xA1, 0xA4), range(0xB0, 0xF8)),
    "big5": (range(0xA1, 0xA4), range(0xA4, 0xC7)),
    "shift_jis": (range(0x81, 0x85), range(0x88, 0x99)),
}


def _common(c: str, codec: str) -> bool:
    if codec == "gb18030":  # GBK also holds traditional characters, outside GB2312
        return _common_in(c, "gb2312", "gb18030") or _common_in(c, "big5", "big5")
    return _common_in(c, codec, codec)


def _common_in(c: str, codec: str, leads: str) -> bool:
    try:
        encoded = c.encode(codec)
    except UnicodeEncodeError:
        return False
    return len(encoded) == 2 and any(encoded[0] in r for r in _COMMON_LEADS[leads])


def _read_text_file(p: Path, named: str) -> str:
    raw = p.read_bytes()
    if not raw.strip():
        raise UserError(f"{named} is empty")
    if why := _not_text(raw):
        raise UserError(f"{named} {why}")
    return _decode(raw)


def _file_rows(p: Path, named: str, fields: tuple[str, str], flags: Flags) -> list[Row]:
    """Rows of a CSV/TSV/JSONL file; `fields` are the text and label columns, `named` and
    `flags` how messages name the file and its columns."""
    text = _read_text_file(p, named)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_rows(named, text, fields, flags)
    return _table_rows(named, text, fields, flags, tsv=suffix == ".tsv")


def _table_rows(
    named: str, text: str, fields: tuple[str, str], flags: Flags, *, tsv: bool
) -> list[Row]:
    text_field, label_field = fields
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tsv else {}
    reader = csv.reader(io.StringIO(text, newline=""), **dialect)
    try:
        header = next(reader)
        while not header:  # leading blank lines
            header = next(reader)
        header = [h.strip() for h in header]
        # A spreadsheet's export may separate fields by ';' or tabs: the header is then one cell.
        sep = next((c for c in ";\t|" if len(header) == 1 and c in header[0]), None)
        hint = (
            f" (its fields look separated by {sep!r}: a .csv needs commas, a .tsv tabs)"
            if sep
            else ""
        )
        for field, flag in zip(fields, (flags.text_field, flags.label_field), strict=True):
            if field not in header:
                raise UserError(
                    f"{named}: no column {field!r} ({flag}); the header has {header}{hint}"
                )
        records = []  # (first line, last line, fields)
        start = reader.line_num + 1
        for record in reader:
            if record:
                records.append((start, reader.line_num, record))
            start = reader.line_num + 1
    except csv.Error as e:
        raise UserError(f"{named}: unreadable at line {reader.line_num}: {e}") from e
    if not records:
        raise UserError(f"{named} has a header but no data rows")
    ti, li = header.index(text_field), header.index(label_field)
    lines = io.StringIO(text, newline="").readlines()  # as the reader counts them
    # Labels of one-line rows: a line inside a quoted field that ends in one of them is a row.
    labels = {r[li].strip() for a, b, r in records if a == b and len(r) == len(header)}
    separator = "a tab" if tsv else "a comma"
    rows: list[Row] = []
    for first, last, record in records:
        where = f"line {first}"
        swallowed = [ln for ln in lines[first:last] if ln.strip()]
        inner = lines[first : last - 1]  # the last line, where a quote closes, always looks a row
        one_field = f"so lines {first}-{last} would be read as one field"
        if swallowed and last == len(lines) and quote_never_closes(lines[first - 1 :], dialect):
            why = f"a quote opens here and never closes, {one_field}"
        elif any(_looks_like_a_row(ln, dialect, len(header), li, labels) for ln in inner):
            why = f"a quote opens here and closes only on line {last}, {one_field}"
        elif len(record) > len(header):
            why = (
                f"{len(record)} fields where the header has {len(header)} "
                f"({separator} in the text?)"
            )
        else:
            text_v = record[ti] if ti < len(record) else None
            label_v = record[li] if li < len(record) else None
            rows.append((where, text_v, label_v, None, None))
            continue
        rows.append((where, None, None, None, why))
        # Each line the quote swallowed is a row lost: they count against max_bad_fraction.
        rows.extend((None, None, None, None, why) for _ in swallowed)
    return rows


def quote_never_closes(lines: list[str], dialect: dict) -> bool:
    """Whether the file's end, read from the first of `lines`, is inside a quoted field."""
    try:
        list(csv.reader(lines, strict=True, **dialect))
    except csv.Error as e:
        return "unexpected end of data" in str(e)
    return False


def _looks_like_a_row(line: str, dialect: dict, width: int, li: int, labels: set[str]) -> bool:
    """A line inside a quoted field that parses alone as a whole row with a label seen elsewhere:
    a quote left open swallowed it. A review's own line breaks seldom end in `,pos`."""
    fields = next(csv.reader([line], **dialect), [])
    return len(fields) == width and fields[li].strip() in labels


def _jsonl_rows(named: str, text: str, fields: tuple[str, str], flags: Flags) -> list[Row]:
    text_field, label_field = fields
    rows: list[Row] = []
    keys: set[str] = set()  # of the rows that are JSON objects
    objects = 0
    for n, line in enumerate(_LINE_END.split(text), start=1):
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            rows.append((where, None, None, None, f"invalid JSON ({e.msg})"))
            continue
        if not isinstance(obj, dict):
            rows.append((where, None, None, None, "not a JSON object"))
            continue
        objects += 1
        keys |= obj.keys()
        t, lab = obj.get(text_field), obj.get(label_field)
        if t is not None and not isinstance(t, str):
            rows.append((where, None, None, None, f"text is a {type(t).__name__}, not a string"))
            continue
        if isinstance(lab, bool):
            lab = json.dumps(lab)  # the labels "false" and "true", as JSON spells them
        elif lab is not None and not isinstance(lab, (str, int)):
            rows.append((where, None, None, None, f"label {lab!r} is not a string or integer"))
            continue
        rows.append((where, t, None if lab is None else str(lab), None, None))
    if not rows:
        raise UserError(f"{named} is empty")
    # Only when some row is an object: otherwise the malformed-row report says what is wrong.
    for field, flag in zip(fields, (flags.text_field, flags.label_field), strict=True):
        if objects and field not in keys:
            raise UserError(f"{named}: no row has the field {field!r} ({flag})")
    return rows


def _folder_rows(root: Path, named: str) -> list[Row]:
    split_dirs = [s for s in SPLITS if (root / s).is_dir()]
    parts = [(root / s, s) for s in split_dirs] if split_dirs else [(root, None)]
    rows: list[Row] = []
    for folder, hint in parts:
        for label_dir in sorted(d for d in folder.iterdir() if d.is_dir() and d.name != "unsup"):
            for f in sorted(label_dir.glob("*.txt")):
                raw = f.read_bytes()
                where = os.path.relpath(f, root)
                rows.append((where, _decode(raw), label_dir.name, hint, None))
    if not rows:
        raise UserError(f"{named} has no <label>/*.txt files (nor train/<label>/*.txt)")
    return rows


def read_text(p: Path, named: str) -> str:
    """A whole text file, decoded (a UTF-8 BOM dropped); a UserError naming it (`named`) when it
    is empty, binary or not UTF-8."""
    return _read_text_file(p, named)


def texts(p: Path, named: str, text_field: str) -> list[str]:
    """The `text_field` column (or JSON key) of a CSV/TSV/JSONL file, for unlabeled text; rows
    without it are skipped."""
    flags = Flags(text_field="data.text_field", label_field="data.text_field")
    return [
        text for _, text, _, _, _ in _file_rows(p, named, (text_field, text_field), flags) if text
    ]
