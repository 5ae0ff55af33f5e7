"""Text -> int32 token ids: `byte`, `char` and `word` tokenizers, and their vocabulary files.

Ids 0, 1, 2 are PAD, UNK, CLS for every kind; real tokens start at 3.
  byte  UTF-8 bytes + 3: no vocabulary, never UNK, vocab_size 259.
  char  Unicode code points (an emoji or a CJK character is one token); vocabulary from training
        texts.
  word  runs of letters/digits, each CJK character alone (Chinese and Japanese have no spaces),
        each other symbol alone; vocabulary from training texts.
Vocabularies keep tokens seen >= min_freq times, most frequent first (ties by code point order),
cut so that vocab_size <= max_vocab (max_vocab counts the 3 reserved ids; 0 = no cap).

What a tokenizer's kind decides about the ids that are no token of a text (what is put around a
text, the unknown token's) is the record `Specials` that every tokenizer carries.

Saved as `tokenizer.json` (kind, lowercase, sizes) and `vocab.txt` (line i = token with id i, with
"\\" and every whitespace or non-printable character written as `\\uXXXXXX`, 6 hex digits).
"""

import collections
import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from experiments.errors import UserError

PAD, UNK, CLS = 0, 1, 2
RESERVED = ("<pad>", "<unk>", "<cls>")
KINDS = ("byte", "char", "word")
_FORMAT = 1

# Kana and Han (incl. extensions): one token per character. CJK punctuation is non-word, so it is
# one token per character anyway.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff"
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")


@dataclasses.dataclass(frozen=True)
class Specials:
    """The ids a tokenizer's kind sets apart from a text's own tokens, decided once where the
    tokenizer is made: its readers ask this record, never the tokenizer's other attributes."""

    # (ids before, ids after) each text: a checkpoint's [CLS] and [SEP]; None: attn's own, which
    # `encoding.cut` frames with CLS when the model pools it.
    frame: tuple[tuple[int, ...], tuple[int, ...]] | None
    unk: int  # a token outside the vocabulary

    @functools.cached_property  # asked once per token read
    def framing(self) -> frozenset[int]:
        """PAD and the ids put around a text (CLS, or [CLS] and [SEP]): no token of the text."""
        before, after = self.frame if self.frame is not None else ((CLS,), ())
        return frozenset((PAD, *before, *after))

    @functools.cached_property
    def silent(self) -> frozenset[int]:
        """The ids that say nothing of a text: the framing ones and the unknown token's."""
        return self.framing | {self.unk}


OWN = Specials(frame=None, unk=UNK)  # attn's byte, char and word tokenizers


@dataclasses.dataclass(frozen=True)
class Pieces:
    """A whole text's ids from one call of its tokenizer, and the word each id is a piece of:
    a checkpoint's pieces ("toast" "##er") make one word as the text writes it ("toaster");
    attn's own tokens are each a word, as the vocabulary writes it."""

    ids: np.ndarray  # int32 [n]: `encode`'s
    word_n: np.ndarray  # int32 [n]: each id's word in `words`
    words: tuple[str, ...]


class Tokenizer(Protocol):
    kind: str
    lowercase: bool
    specials: Specials

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> np.ndarray: ...

    def encode_words(self, text: str) -> Pieces:
        """`encode`'s ids and their words, from the one call of the tokenizer."""
        ...

    def tokens(self, ids: Iterable[int]) -> list[str]: ...

    def save(self, directory: str | Path) -> None: ...


def _own_pieces(tok: Tokenizer, ids: np.ndarray) -> Pieces:
    """`Pieces` of attn's own tokenizers: one word per token."""
    return Pieces(ids, np.arange(len(ids), dtype=np.int32), tuple(tok.tokens(ids.tolist())))


def split_words(text: str) -> list[str]:
    """Word tokenizer's pieces: letter/digit runs, single CJK characters, single symbols."""
    return _WORD.findall(text)


_SPLITTERS: dict[str, Callable[[str], list[str]]] = {"char": list, "word": split_words}


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes shifted by 3; `lowercase` applies str.lower() before encoding."""

    lowercase: bool = False
    kind: str = dataclasses.field(default="byte", init=False)
    specials = OWN

    @property
    def vocab_size(self) -> int:
        return 256 + len(RESERVED)

    def encode(self, text: str) -> np.ndarray:
        text = text.lower() if self.lowercase else text
        raw = text.encode("utf-8", "surrogatepass")
        return np.frombuffer(raw, np.uint8).astype(np.int32) + len(RESERVED)

    def encode_words(self, text: str) -> Pieces:
        return _own_pieces(self, self.encode(text))

    def tokens(self, ids: Iterable[int]) -> list[str]:
        return [_byte_display(int(i)) for i in ids]

    def save(self, directory: str | Path) -> None:
        _write(directory, self, [_byte_display(i) for i in range(self.vocab_size)], {})


def _byte_display(i: int) -> str:
    if i < len(RESERVED):
        return RESERVED[i]
    b = i - len(RESERVED)
    if not 0 <= b < 256:
        return RESERVED[UNK]
    return chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}"


@dataclasses.dataclass(frozen=True)
class VocabTokenizer:
    """A `char` or `word` tokenizer with a fixed vocabulary; vocab[i] is the token with id i."""

    kind: str
    vocab: tuple[str, ...]
    lowercase: bool = False
    min_freq: int = 1
    max_vocab: int = 0
    _ids: dict[str, int] = dataclasses.field(init=False, repr=False, compare=False)
    specials = OWN

    def __post_init__(self):
        if self.kind not in _SPLITTERS:
            raise ValueError(f"kind must be one of {tuple(_SPLITTERS)}, got {self.kind!r}")
        if self.vocab[: len(RESERVED)] != RESERVED:
            raise ValueError(f"vocab must start with {RESERVED}, got {self.vocab[:3]}")
        ids = {t: i for i, t in enumerate(self.vocab) if i >= len(RESERVED)}
        if len(ids) != len(self.vocab) - len(RESERVED):
            raise ValueError("vocab has duplicate tokens")
        object.__setattr__(self, "_ids", ids)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def split(self, text: str) -> list[str]:
        return _SPLITTERS[self.kind](text.lower() if self.lowercase else text)

    def encode(self, text: str) -> np.ndarray:
        get = self._ids.get
        return np.array([get(t, UNK) for t in self.split(text)], np.int32)

    def encode_words(self, text: str) -> Pieces:
        return _own_pieces(self, self.encode(text))

    def tokens(self, ids: Iterable[int]) -> list[str]:
        n = len(self.vocab)
        return [self.vocab[i] if 0 <= i < n else RESERVED[UNK] for i in map(int, ids)]

    def save(self, directory: str | Path) -> None:
        extra = {"min_freq": self.min_freq, "max_vocab": self.max_vocab}
        _write(directory, self, list(self.vocab), extra)


def build_tokenizer(
    kind: str, texts: Sequence[str], *, lowercase: bool, min_freq: int, max_vocab: int
) -> ByteTokenizer | VocabTokenizer:
    """A tokenizer of `kind`; char/word vocabularies are counted over `texts` (the train split)."""
    if kind == "pretrained":  # a checkpoint's own: read, not built (`checkpoint_tokenizer`)
        raise UserError(
            "data.tokenizer=pretrained reads the tokenizer of model.pretrained, which is empty: "
            "set --config.model.pretrained=DIR"
        )
    if kind not in KINDS:
        raise UserError(f"data.tokenizer={kind!r} is unknown; valid: {', '.join(KINDS)}")
    if kind == "byte":
        return ByteTokenizer(lowercase=lowercase)
    if not isinstance(min_freq, int) or min_freq < 1:
        raise UserError(f"data.min_freq must be an integer >= 1, got {min_freq!r}")
    if not isinstance(max_vocab, int) or (max_vocab != 0 and max_vocab <= len(RESERVED)):
        raise UserError(
            f"data.max_vocab must be 0 (no cap) or an integer > {len(RESERVED)}, got {max_vocab!r}"
        )
    splitter = _SPLITTERS[kind]
    counts: collections.Counter[str] = collections.Counter()
    for text in texts:
        counts.update(splitter(text.lower() if lowercase else text))
    kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
    if max_vocab:
        kept = kept[: max_vocab - len(RESERVED)]
    return VocabTokenizer(kind, RESERVED + tuple(kept), lowercase, min_freq, max_vocab)


# vocab.txt escaping: one token per line, so line breaks (and, for legibility, all whitespace and
# non-printables) become `\uXXXXXX`; a literal backslash is escaped too so decoding is unambiguous.
def escape(token: str) -> str:
    return "".join(
        f"\\u{ord(c):06x}" if c == "\\" or c.isspace() or not c.isprintable() else c for c in token
    )


_ESCAPE = re.compile(r"\\u([0-9a-f]{6})")


def unescape(line: str) -> str:
    """Inverse of `escape`; ValueError for a backslash that starts no valid escape."""
    if line.count("\\") != len(_ESCAPE.findall(line)):
        raise ValueError(f"bad escape in {line!r}")
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), line)


def _write(directory: str | Path, tok: Tokenizer, vocab: list[str], extra: dict) -> None:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "vocab.txt").write_text("".join(escape(t) + "\n" for t in vocab), encoding="utf-8")
    meta = {
        "format": _FORMAT,
        "kind": tok.kind,
        "lowercase": tok.lowercase,
        "vocab_size": tok.vocab_size,
        **extra,
    }
    (d / "tokenizer.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def saved(directory: str | Path) -> bool:
    """Whether `directory` holds a saved tokenizer (its tokenizer.json)."""
    return (Path(directory) / "tokenizer.json").is_file()


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer `save` wrote into `directory` (a checkpoint's own, kind "pretrained", from
    the copy `checkpoint_tokenizer` saved); UserError if files are missing or corrupt."""
    d = Path(directory)
    meta = _read_meta(d / "tokenizer.json")
    if isinstance(meta, dict) and meta.get("kind") == "pretrained":
        from experiments.data import checkpoint_tokenizer  # a checkpoint's: its own files

        try:
            return checkpoint_tokenizer.load_saved(d, meta)
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise UserError(f"corrupt tokenizer files in {str(d)!r}: {e}") from e
    for name in ("tokenizer.json", "vocab.txt"):
        if not (d / name).is_file():
            raise UserError(f"no {name} in {str(d)!r}: not a saved tokenizer/checkpoint directory")
    try:
        meta = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
        kind, lowercase, size = meta["kind"], meta["lowercase"], meta["vocab_size"]
        raw = (d / "vocab.txt").read_bytes().decode("utf-8")
        lines = raw.split("\n")
        if lines[-1] != "":
            raise ValueError("vocab.txt does not end with a newline (truncated?)")
        vocab = tuple(unescape(line.removesuffix("\r")) for line in lines[:-1])
        if len(vocab) != size:
            raise ValueError(f"vocab.txt has {len(vocab)} tokens, tokenizer.json says {size}")
        if kind == "byte":
            tok = ByteTokenizer(lowercase=bool(lowercase))
            if vocab != tuple(_byte_display(i) for i in range(tok.vocab_size)):
                raise ValueError("vocab.txt is not the byte vocabulary")
            return tok
        return VocabTokenizer(
            kind, vocab, bool(lowercase), meta.get("min_freq", 1), meta.get("max_vocab", 0)
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise UserError(f"corrupt tokenizer files in {str(d)!r}: {e}") from e


def _read_meta(path: Path) -> object:
    """tokenizer.json's object; None when missing or not JSON (`load_tokenizer` says which)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
