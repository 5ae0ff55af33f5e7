"""A SentencePiece model file (the spm.model that DeBERTa-v3 checkpoints ship as their only
tokenizer file) read without the sentencepiece package: the few protobuf fields a tokenizer needs
are parsed here, and `tokenizer` builds from them the Hugging Face `tokenizers` Tokenizer that
transformers' own converter builds (DebertaV2Converter, what AutoTokenizer loads for such a
checkpoint), so its ids are transformers' ids:

    normalize   [lowercase,] strip, the model's precompiled character map, runs of spaces -> one
    split       [punctuation isolated,] "▁" before every word
    model       unigram over the file's pieces and scores, unknown text -> its unk piece
    added       control pieces (e.g. [CLS]) special, user-defined pieces plain, then the special
                tokens the checkpoint names, those the file lacks (e.g. [MASK]) after its pieces

As in that converter, a model trained with byte fallback gives its unk piece where the
sentencepiece library would spell unknown characters in bytes.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from experiments.errors import UserError

__all__ = ["Model", "read", "tokenizer"]

# Field numbers in sentencepiece_model.proto.
_MODEL_PIECES, _MODEL_TRAINER, _MODEL_NORMALIZER = 1, 2, 3
_PIECE_TEXT, _PIECE_SCORE, _PIECE_TYPE = 1, 2, 3
_TRAINER_MODEL_TYPE, _TRAINER_UNK_ID = 3, 40
_NORMALIZER_CHARSMAP = 2
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


@dataclasses.dataclass(frozen=True)
class Model:
    """What a tokenizer needs of a SentencePiece model: its pieces (text, score, type) in id
    order, its algorithm ("unigram", "bpe", ...), the id of its unknown piece and its precompiled
    normalization (empty when it has none)."""

    pieces: tuple[tuple[str, float, int], ...]
    model_type: str
    unk_id: int
    charsmap: bytes


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("a varint runs past the end")
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message: varints as ints, everything else as its
    bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, i = _varint(buf, i)
        elif wire in (_FIXED64, _FIXED32):
            n = 8 if wire == _FIXED64 else 4
            value, i = buf[i : i + n], i + n
        elif wire == _BYTES:
            n, i = _varint(buf, i)
            value, i = buf[i : i + n], i + n
        else:
            raise ValueError(f"field {number} has wire type {wire}, which no message here uses")
        if i > len(buf):
            raise ValueError(f"field {number} runs past the end")
        yield number, value


def _message(value: int | bytes, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError(f"{what} is not a message")
    return value


def _piece(buf: bytes) -> tuple[str, float, int]:
    text, score, kind = "", 0.0, _NORMAL
    for number, value in _fields(buf):
        if number == _PIECE_TEXT:
            text = _message(value, "a piece's text").decode("utf-8")
        elif number == _PIECE_SCORE:
            if not isinstance(value, bytes) or len(value) != 4:
                raise ValueError("a piece's score is not a float")
            score = struct.unpack("<f", value)[0]
        elif number == _PIECE_TYPE:
            kind = int(value) if isinstance(value, int) else -1
    return text, score, kind


def read(path: str | Path) -> Model:
    """The SentencePiece model in `path`; UserError in one line when it is not one."""
    path = Path(path)
    try:
        buf = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e}") from None
    pieces, model_type, unk_id, charsmap = [], 1, 0, b""
    try:
        for number, value in _fields(buf):
            if number == _MODEL_PIECES:
                pieces.append(_piece(_message(value, "a piece")))
            elif number == _MODEL_TRAINER:
                for n, v in _fields(_message(value, "trainer_spec")):
                    if n == _TRAINER_MODEL_TYPE and isinstance(v, int):
                        model_type = v
                    elif n == _TRAINER_UNK_ID and isinstance(v, int):
                        unk_id = v
            elif number == _MODEL_NORMALIZER:
                for n, v in _fields(_message(value, "normalizer_spec")):
                    if n == _NORMALIZER_CHARSMAP:
                        charsmap = _message(v, "precompiled_charsmap")
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a SentencePiece model: {e}") from None
    if not pieces:
        raise UserError(f"{path} is not a SentencePiece model: it has no pieces")
    if not 0 <= unk_id < len(pieces):
        raise UserError(f"{path}: its unk_id {unk_id} is not one of its {len(pieces)} pieces")
    kind = _MODEL_TYPES.get(model_type, f"type {model_type}")
    return Model(tuple(pieces), kind, unk_id, charsmap)


def tokenizer(
    path: str | Path,
    specials: Iterable[str],
    *,
    lowercase: bool = False,
    split_by_punct: bool = False,
):
    """The `tokenizers.Tokenizer` of the unigram SentencePiece model in `path` (module
    docstring), with `specials` (the checkpoint's special token names) as special tokens: those
    the model has keep its ids, the others follow its pieces in the order given. lowercase and
    split_by_punct: tokenizer_config.json's do_lower_case and split_by_punct."""
    import tokenizers as hf
    from tokenizers import decoders, normalizers, pre_tokenizers

    m = read(path)
    if m.model_type != "unigram":
        raise UserError(
            f"{path} is a {m.model_type} SentencePiece model; attn reads unigram ones (as "
            "DeBERTa-v3 ships), or a tokenizer.json beside it"
        )
    tok = hf.Tokenizer(hf.models.Unigram([(p, s) for p, s, _ in m.pieces], m.unk_id, False))
    norms = [normalizers.Lowercase()] if lowercase else []
    norms.append(normalizers.Strip())
    if m.charsmap:
        norms.append(normalizers.Precompiled(m.charsmap))
    norms.append(normalizers.Replace(hf.Regex(" {2,}"), " "))
    tok.normalizer = normalizers.Sequence(norms)
    split = [pre_tokenizers.Punctuation("isolated")] if split_by_punct else []
    split.append(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(split)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_tokens(
        [
            hf.AddedToken(p, normalized=False, special=kind == _CONTROL)
            for p, _, kind in m.pieces
            if kind in (_CONTROL, _USER_DEFINED)
        ]
    )
    # The unk piece is matched in the normalized text, the rest in the raw text, as
    # transformers' DeBERTa-v2 tokenizer registers them ("a [UNK]" keeps its "▁" before it).
    unk = m.pieces[m.unk_id][0]
    tok.add_special_tokens(
        [hf.AddedToken(s, normalized=s == unk, special=True) for s in dict.fromkeys(specials)]
    )
    return tok
