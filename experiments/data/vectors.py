"""Pretrained word vectors -> the token embedding table [V, d_model] (`model.embeddings_from`).

Files: the word2vec / GloVe / fastText text format, one row per line: the word, then D numbers,
separated by single spaces (0x20: a word may hold other whitespace, such as U+00A0). word2vec and
fastText (`.vec`) begin with a header line "N D" (a first line of two integers); GloVe has none,
and its first row sets D. A row with more than D + 1 fields is a word with spaces in it (GloVe
840B has a few): its last D fields are the vector. A gzip file (`.gz`, found by its magic bytes) is
read the same. UTF-8; CRLF endings and a trailing space (fastText) are fine.

Matching: each vocabulary token is looked up exactly; a token without an exact row takes the first
row (in file order, which is frequency order in the common files) whose word lower-cases
(str.lower, as the tokenizer's `lowercase` does) to the same string, in either direction: vocab
"Paris" takes file "paris", vocab "paris" takes "Paris". So a lower-cased vocabulary and a cased
one need no flag. The reserved ids PAD, UNK, CLS never take a file row (a file may have "<unk>",
which means something else there). A char vocabulary (Chinese characters) matches the same way,
one token string per row.

Rows the file gives are centred (their mean is a direction shared by all words, which carries no
meaning for a classifier), brought to d_model dims, and scaled by one factor so their RMS is the
model's init stddev: a table of another scale would drown or be drowned by the position and
n-gram embeddings added to it. One factor for the whole table keeps the relative row norms.
Width D -> d_model:
  D == d_model  unchanged
  D >  d_model  PCA: the top d_model principal directions of the rows the vocabulary found
  D <  d_model  a random (seeded) orthonormal embedding of the D dims into d_model: an isometry,
                so the found rows keep all their geometry; the other directions start empty
Every other row (PAD, UNK, CLS and the words the file lacks) is the model's init distribution:
row i of `layers.embed_init(jax.random.key(seed), V, d_model)`. Padding is masked everywhere, so
PAD's row only has to be what the model would have had; UNK, CLS and missing words learn from the
same start as without a file.

The file is streamed once; only rows whose word (or its lower-case form) is in the vocabulary are
kept, so memory is about that many vectors. The numbers are parsed on those rows alone: a bad
number elsewhere cannot change the table, and parsing every row would take about three times as
long. Every row's field count is checked.

Errors (one line, naming the file and, for a row, its line number): no such file, an empty file or
a header without rows, a header whose width or row count the rows contradict, a row with fewer
than D numbers, a kept row with a non-number or a non-finite number, NUL bytes (binary), a `.bin`
name (binary word2vec / fastText: convert it to text first), no vocabulary word found. Not errors
but counted in `summary()`: a repeated word (the first row is kept), a word that is not UTF-8
(no token can equal it: skipped).
"""

import dataclasses
import gzip
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import jax
import numpy as np
from tqdm import tqdm

from attn import layers
from experiments.data.tokenizers import CLS, PAD, RESERVED
from experiments.errors import UserError

FLAG = "model.embeddings_from"
INIT_STDDEV = 1.0  # layers.embed_init's default: the stddev of classifier.init's token table
_BAR_BYTES = 64 << 20  # files at least this large show a progress bar
_BAR_EVERY = 8192  # lines between progress bar updates


@dataclasses.dataclass(frozen=True, eq=False)
class Loaded:
    """The embedding table and what the file gave to it."""

    table_VxD: np.ndarray  # float32 [V, d_model]: row i for vocab[i]
    found_V: np.ndarray  # bool [V]: row i came from the file
    path: str
    exact: int  # vocabulary words matched exactly
    folded: int  # ... matched by lower-casing
    words: int  # vocabulary words that could match (the vocabulary less the reserved ids)
    rows: int  # vector rows in the file
    dim: int  # the file's width D
    projection: str  # "none" | "pca" | "embed" (see the module docstring)
    variance_kept: float  # share of the found rows' variance the projection keeps
    duplicates: int  # rows repeating a vocabulary word already read (the first one is kept)
    not_utf8: int  # rows skipped because their word is not UTF-8 (no token can equal it)
    token_coverage: float | None  # share of training tokens whose id has a file row

    @property
    def found(self) -> int:
        return self.exact + self.folded

    @property
    def coverage(self) -> float:
        return self.found / self.words

    def summary(self) -> str:
        """One line for the train log."""
        d_model = self.table_VxD.shape[1]
        tokens = (
            f", {self.token_coverage:.1%} of training tokens"
            if self.token_coverage is not None
            else ""
        )
        width = {
            "none": f"{self.dim}-d as is",
            "pca": f"{self.dim}-d projected to {d_model} by PCA "
            f"({self.variance_kept:.1%} of the variance)",
            "embed": f"{self.dim}-d embedded in {d_model} by a random rotation",
        }[self.projection]
        extra = "".join(
            f"; {n:,} {what}"
            for n, what in (
                (self.duplicates, "repeated words (the first row kept)"),
                (self.not_utf8, "rows skipped, their word not UTF-8"),
            )
            if n
        )
        return (
            f"{FLAG}={self.path!r}: {self.found:,} of {self.words:,} words ({self.coverage:.1%}) "
            f"have a vector ({self.exact:,} exact, {self.folded:,} case-folded){tokens}; "
            f"{width}, scaled to RMS {INIT_STDDEV:g} like the model's init{extra}"
        )


def load(
    path: str,
    vocab: Sequence[str],
    d_model: int,
    *,
    seed: int,
    token_counts: Sequence[int] | np.ndarray | None = None,
    progress: bool = True,
) -> Loaded:
    """The token table for `vocab` (a tokenizer's id-ordered tokens, the reserved ones first).

    token_counts: optional [V] counts of each id in the training texts, for `token_coverage`
    (PAD and CLS are not text and are left out of it; UNK is text without a vector).
    progress: show a progress bar for a large file (pass False on all but one process).
    """
    if tuple(vocab[: len(RESERVED)]) != RESERVED:
        raise ValueError(f"vocab must start with {RESERVED}, got {tuple(vocab[:3])}")
    counts_V = None if token_counts is None else np.asarray(token_counts, np.int64)
    if counts_V is not None:
        text = counts_V.sum() - counts_V[PAD] - counts_V[CLS] if counts_V.ndim == 1 else 0
        if counts_V.shape != (len(vocab),) or text <= 0:
            raise ValueError(f"token_counts must be [{len(vocab)}] counts of text tokens")
    named = f"{FLAG}={path!r}"
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{named} {'is a folder' if p.is_dir() else 'does not exist'}")
    if p.name.lower().endswith((".bin", ".bin.gz")):
        raise UserError(
            f"{named}: binary word2vec/fastText (.bin) is not read; convert it to the text format "
            "(e.g. gensim: KeyedVectors.load_word2vec_format(f, binary=True)"
            ".save_word2vec_format(out, binary=False))"
        )

    ids = {w: i for i, w in enumerate(vocab) if i >= len(RESERVED)}
    keys: dict[str, int] = {}  # lower-cased vocabulary word -> key index
    key_of = {i: keys.setdefault(w.lower(), len(keys)) for w, i in ids.items()}
    scan = _scan(p, named, ids, keys, progress)

    V = len(vocab)
    found_V = np.zeros(V, bool)
    chosen: list[np.ndarray] = []
    for i in range(len(RESERVED), V):
        vec = scan.exact.get(i)
        if vec is None:
            vec = scan.folded.get(key_of[i])
        if vec is not None:
            found_V[i] = True
            chosen.append(vec)
    exact = len(scan.exact)
    if not chosen:
        raise UserError(
            f"{named}: none of the {len(ids):,} vocabulary words has a row in its "
            f"{scan.rows:,} (wrong language, or a tokenizer with another vocabulary?)"
        )

    x_NxW = np.stack(chosen)
    if (x_NxW == x_NxW[0]).all():  # nothing left once centred
        raise UserError(f"{named}: the {len(chosen):,} vectors the vocabulary found are all equal")
    rows_NxD, projection, kept = _project(x_NxW, d_model, np.random.default_rng(seed))
    rms = float(np.sqrt(np.mean(np.square(rows_NxD))))
    table_VxD = np.array(layers.embed_init(jax.random.key(seed), V, d_model), np.float32)
    table_VxD[found_V] = rows_NxD * (INIT_STDDEV / rms)

    token_coverage = None if counts_V is None else float(counts_V[found_V].sum() / text)
    return Loaded(
        table_VxD=table_VxD,
        found_V=found_V,
        path=str(path),
        exact=exact,
        folded=len(chosen) - exact,
        words=len(ids),
        rows=scan.rows,
        dim=scan.dim,
        projection=projection,
        variance_kept=kept,
        duplicates=scan.duplicates,
        not_utf8=scan.not_utf8,
        token_coverage=token_coverage,
    )


def _project(x_NxW: np.ndarray, d_model: int, rng: np.random.Generator):
    """Centred rows brought to d_model dims -> (rows [N, d_model], kind, variance share kept)."""
    x_NxW = x_NxW.astype(np.float64)
    x_NxW -= x_NxW.mean(0)
    dim = x_NxW.shape[1]
    if dim == d_model:
        return x_NxW, "none", 1.0
    if dim < d_model:
        q_DxW, _ = np.linalg.qr(rng.standard_normal((d_model, dim)))
        return x_NxW @ q_DxW.T, "embed", 1.0
    # Eigenvectors of the W x W scatter matrix: cheap for any N, and all W of them exist even
    # when fewer than d_model rows were found.
    var_W, vecs_WxW = np.linalg.eigh(x_NxW.T @ x_NxW)  # ascending
    top_WxD = vecs_WxW[:, ::-1][:, :d_model]
    total = var_W.sum()
    kept = float(var_W[::-1][:d_model].sum() / total) if total > 0 else 1.0
    return x_NxW @ top_WxD, "pca", kept


@dataclasses.dataclass
class _Scan:
    exact: dict[int, np.ndarray]  # vocabulary id -> its exact row
    folded: dict[int, np.ndarray]  # key index -> the first row whose lower-cased word is the key
    rows: int = 0
    dim: int = 0
    duplicates: int = 0
    not_utf8: int = 0


def _scan(p: Path, named: str, ids: dict, keys: dict, progress: bool) -> _Scan:
    scan = _Scan({}, {})
    header_rows = None
    source = ""  # where the width comes from, for messages
    for lineno, line in _lines(p, named, progress):
        # Counting spaces, not splitting, on every line: most rows are not kept.
        numbers = line.count(b" ")
        if not scan.dim:  # the first line: a header "N D", or a GloVe row that sets D
            first = line.split(b" ")
            if numbers == 1 and first[0].isdigit() and first[1].isdigit():
                header_rows, scan.dim = int(first[0]), int(first[1])
                source = f"the header (line {lineno}) says {scan.dim}"
                if scan.dim == 0:
                    raise UserError(f"{named}: the header (line {lineno}) says 0 numbers a row")
                continue
            scan.dim = numbers
            source = f"line {lineno} has {scan.dim}"
            if scan.dim == 0:
                raise UserError(f"{named}: line {lineno} has a word but no numbers")
        dim = scan.dim
        if numbers < dim or (numbers > dim and not scan.rows and header_rows is not None):
            raise UserError(f"{named}: line {lineno} has {numbers} numbers where {source}")
        scan.rows += 1
        # More fields than D + 1: a word with spaces in it (GloVe 840B has a few).
        raw = line[: line.index(b" ")] if numbers == dim else line.rsplit(b" ", dim)[0]
        try:
            word = raw.decode("utf-8")
        except UnicodeDecodeError:
            scan.not_utf8 += 1
            continue
        i, k = ids.get(word), keys.get(word.lower())
        if i is None and k is None:
            continue
        if i is not None and i in scan.exact:
            scan.duplicates += 1
            continue
        fields = line.split(b" ")[-dim:]
        try:
            vec = np.array(fields, np.float32)
        except ValueError:
            bad = next(f for f in fields if not _is_float(f))
            raise UserError(
                f"{named}: line {lineno}: {bad.decode('utf-8', 'replace')!r} is not a number"
            ) from None
        if not np.isfinite(vec).all():
            raise UserError(f"{named}: line {lineno} has a number that is not finite")
        if i is not None:
            scan.exact[i] = vec
        if k is not None:
            scan.folded.setdefault(k, vec)
    if not scan.dim:
        raise UserError(f"{named} is empty")
    if not scan.rows:
        raise UserError(f"{named} has a header but no vector rows")
    if header_rows is not None and header_rows != scan.rows:
        raise UserError(
            f"{named}: the header says {header_rows:,} rows but the file has {scan.rows:,} "
            "(cut short, or a wrong header?)"
        )
    return scan


def _is_float(field: bytes) -> bool:
    try:
        float(field)
        return True
    except ValueError:
        return False


def _lines(p: Path, named: str, progress: bool) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its end and trailing spaces) of each non-blank line."""
    size = p.stat().st_size
    with open(p, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        f: BinaryIO = gzip.GzipFile(fileobj=raw) if gz else raw
        bar = tqdm(
            total=size,
            desc=p.name,
            unit="B",
            unit_scale=True,
            mininterval=1,
            disable=not progress or size < _BAR_BYTES,
        )
        with bar:
            try:
                for lineno, line in enumerate(f, 1):
                    if lineno % _BAR_EVERY == 0:
                        bar.update(raw.tell() - bar.n)
                    if b"\0" in line:
                        raise UserError(
                            f"{named}: line {lineno} has NUL bytes: a binary file, not the "
                            "word-vector text format"
                        )
                    line = line.rstrip(b"\r\n ")
                    if line:
                        yield lineno, line
            except (OSError, EOFError) as e:  # a corrupt or cut-short gzip stream
                raise UserError(f"{named}: unreadable: {e}") from None
            bar.update(size - bar.n)
