"""predict --path: every row of a CSV / TSV / JSONL file classified in batches, its other columns
kept.

A row is one record of the file, whatever line breaks its quoted fields hold (CSV: RFC 4180
quoting; TSV: tab-separated, no quoting; JSONL: one JSON object per line). Each output row is the
input row with PREDICTED (the label, or `unknown` for a text with no token the model knows),
PROBABILITY and one `prob_<label>` column per class added, then ERROR: empty unless the row could
not be classified (no text, an empty or undecodable one, a record wider than the header, a line
that is no JSON object), which stderr also says in one line. The rows are written in input order
to a new .csv or .jsonl file (under a temporary name, renamed when whole), or to stdout as CSV.
Texts are converted as the run converted its own (data.convert, or predict's --convert), cut to
the model's length as training cut them, and batched as evaluate batches them.
"""

import csv
import dataclasses
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from tqdm import tqdm

from experiments import parallel, serving
from experiments.data import encoding, user_files
from experiments.errors import UserError
from experiments.training import classify

PREDICTED, PROBABILITY, ERROR = "predicted", "probability", "error"
UNKNOWN = "unknown"
SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
OUT_SUFFIXES = (".csv", ".jsonl")


@dataclasses.dataclass
class Row:
    where: str  # "line N", for messages
    values: dict[str, Any]  # the input's columns (a JSON object's keys), as read
    text: str | None = None
    error: str | None = None


@dataclasses.dataclass
class Table:
    columns: list[str]  # the input's, in order (JSONL: as keys first appear)
    rows: list[Row]


def read(path: str, text_field: str) -> Table:
    """Every row of the file at `path`; UserError in one line for a file that cannot be read as
    a table with a `text_field` column. A row that cannot be classified carries its `error`."""
    p = Path(path)
    if not p.is_file():
        what = "is a folder: predict reads one file" if p.exists() else "no such file"
        raise UserError(f"--path={path}: {what}")
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise UserError(f"--path={path}: predict reads {', '.join(SUFFIXES)} files")
    text = user_files.read_text(p, f"--path={path}")
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl(path, text, text_field)
    return _table(path, text, text_field, tsv=suffix == ".tsv")


def _table(path: str, text: str, text_field: str, *, tsv: bool) -> Table:
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tsv else {}
    reader = csv.reader(io.StringIO(text, newline=""), **dialect)
    rows = []
    try:
        header = next((h for h in reader if h), None)
        if header is None:
            raise UserError(f"--path={path} has no header row")
        header = [h.strip() for h in header]
        if text_field not in header:
            raise UserError(
                f"--path={path}: no column {text_field!r} (--text_field); the header has {header}"
            )
        start = reader.line_num + 1
        for record in reader:
            if record:
                values = dict(zip(header, record, strict=False))
                row = Row(f"line {start}", values, values.get(text_field))
                if len(record) > len(header):
                    sep = "a tab" if tsv else "a comma"
                    row.error = (
                        f"{len(record)} fields where the header has {len(header)} "
                        f"({sep} in the text?)"
                    )
                rows.append(row)
                first = start
            start = reader.line_num + 1
    except csv.Error as e:
        raise UserError(f"--path={path}: unreadable at line {reader.line_num}: {e}") from None
    lines = io.StringIO(text, newline="").readlines()
    if rows and first < len(lines) and user_files.quote_never_closes(lines[first - 1 :], dialect):
        # The rest of the file went into this row's field: a row for it would be made up.
        rows[-1].error = (
            f"a quote opens here and never closes, so lines {first}-{len(lines)} would be read "
            "as one field"
        )
    return Table(header, rows)


def _jsonl(path: str, text: str, text_field: str) -> Table:
    columns: dict[str, None] = {}  # ordered set
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            rows.append(Row(f"line {n}", {}, error=f"invalid JSON ({e.msg})"))
            continue
        if not isinstance(obj, dict):
            rows.append(Row(f"line {n}", {}, error="not a JSON object"))
            continue
        columns.update(dict.fromkeys(obj))
        t = obj.get(text_field)
        row = Row(f"line {n}", obj, t if isinstance(t, str) else None)
        if t is not None and not isinstance(t, str):
            row.error = f"{text_field!r} is not a string ({type(t).__name__})"
        rows.append(row)
    if columns and text_field not in columns:
        raise UserError(f"--path={path}: no row has the field {text_field!r} (--text_field)")
    return Table(list(columns), rows)


def check_out(out: str | None, path: str, table: Table, label_names: tuple[str, ...]) -> None:
    """Refuses, before any text is classified, an --out that exists or is not .csv/.jsonl, and
    an input column that the added ones would overwrite."""
    if out is not None:
        if Path(out).suffix.lower() not in OUT_SUFFIXES:
            raise UserError(f"--out={out}: predict writes {' or '.join(OUT_SUFFIXES)} files")
        if os.path.exists(out):
            raise UserError(f"--out={out} exists: predict writes a new file, choose another name")
    taken = set(table.columns) & set(added_columns(label_names))
    if taken:
        raise UserError(
            f"--path={path} already has the column(s) {sorted(taken)} that predict adds: rename "
            "them"
        )


def added_columns(label_names: tuple[str, ...]) -> list[str]:
    return [PREDICTED, PROBABILITY, *(f"prob_{n}" for n in label_names), ERROR]


def predict(trained: serving.Trained, table: Table) -> int:
    """Fills each row's answer in place: `values` gains the added columns (`added_columns`).
    Returns how many texts data.convert changed before the model read them."""
    names = trained.label_names
    todo = []
    for row in table.rows:
        if row.error is None:
            try:
                row.text = encoding.check_text(row.text if row.text is not None else "")
                todo.append(row)
            except UserError as e:
                row.error = "no text" if row.text is None else str(e)
    tok, data, add_cls = trained.tokenizer, trained.config.data, trained.cfg.pooling == "cls"
    # Each row tokenized once, for its ids alone: `serving.read`'s words and notes, which no row
    # shows, cost more than the forward pass (0.8 s against 0.1 s a 1,000 short rows, tiny model).
    texts, changed = serving.converted(trained, [r.text for r in todo])
    raw = [tok.encode(t) for t in tqdm(texts, desc="tokenize", unit="text", leave=False)]
    frame = tok.specials.frame
    ids = encoding.cut(
        raw, max_len=trained.cfg.max_len, add_cls=add_cls, tail_len=data.tail_len, frame=frame
    )
    bag_ids = encoding.bag_cut(raw, data, add_cls, frame)
    probs_NxC = np.zeros((0, len(names)), np.float32)
    if todo:
        dp = parallel.data_parallel(data)
        params = parallel.replicate(trained.params, dp)
        labels = np.zeros(len(ids), np.int32)
        probs_NxC, _ = classify.probabilities(
            params, trained.cfg, ids, labels, data=data, dp=dp, bag_ids=bag_ids, desc="predict"
        )
    for row, ids_L, probs_C in zip(todo, ids, probs_NxC, strict=True):
        if serving.known_tokens(trained, ids_L):
            row.values[PREDICTED] = names[int(probs_C.argmax())]
            row.values[PROBABILITY] = float(probs_C.max())
            row.values.update({f"prob_{n}": float(p) for n, p in zip(names, probs_C, strict=True)})
        else:
            row.values[PREDICTED] = UNKNOWN
    for row in table.rows:
        if row.error is not None:
            row.values[ERROR] = row.error
    return changed


def write(table: Table, label_names: tuple[str, ...], out: str | None) -> None:
    """The rows to `out` (.csv or .jsonl; written whole under a temporary name, then renamed),
    or to stdout as CSV."""
    if out is None:
        _write(table, label_names, sys.stdout, jsonl=False)
        return
    tmp = os.path.join(os.path.dirname(os.path.abspath(out)), f".predict-{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            _write(table, label_names, f, jsonl=out.lower().endswith(".jsonl"))
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write(table: Table, label_names: tuple[str, ...], f: TextIO, *, jsonl: bool) -> None:
    if jsonl:
        for row in table.rows:
            f.write(json.dumps(row.values, ensure_ascii=False) + "\n")
        return
    columns = table.columns + added_columns(label_names)
    writer = csv.DictWriter(f, columns, restval="", extrasaction="ignore")
    writer.writeheader()
    for row in table.rows:
        writer.writerow({k: _cell(v) for k, v in row.values.items()})


def _cell(v: Any) -> Any:
    """A JSON value in a CSV cell: strings and numbers as they are, the rest as JSON."""
    plain = isinstance(v, (str, int, float)) and not isinstance(v, bool)
    return v if plain else json.dumps(v, ensure_ascii=False)
