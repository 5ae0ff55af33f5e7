"""Texts to token ids: the one place where a tokenizer is built or loaded and texts are encoded.

Training builds the tokenizer from its train split and saves it into the workdir once its checks
pass; a resumed run, evaluate, predict and visualize use the saved one, so ids mean the same thing
everywhere.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments.data import datasets, tokenizers
from experiments.data.splits import SPLITS
from experiments.data.tokenizers import CLS
from experiments.errors import UserError


@dataclasses.dataclass(frozen=True)
class Split:
    texts: list[str]
    ids: list[np.ndarray]  # int32 [n <= max_len] per text
    labels: np.ndarray  # int32 [N]
    # int32 [n <= bag_len] per text: what the bag reads when data.bag_len > 0, else None (the ids)
    bag_ids: list[np.ndarray] | None = None


@dataclasses.dataclass(frozen=True)
class Encoded:
    tokenizer: tokenizers.Tokenizer
    label_names: tuple[str, ...]
    splits: dict[str, Split]


def load(
    data: Any,
    splits: Sequence[str] = SPLITS,
    *,
    add_cls: bool,
    tokenizer: tokenizers.Tokenizer | None = None,
    workdir: str | None = None,
) -> Encoded:
    """`splits` of `data.dataset` (config.data), read and encoded.

    The tokenizer is `tokenizer` if given, else the one saved in `workdir` (a resumed run), else
    one built from the train split (not saved: the caller saves it when its run is accepted).
    """
    examples = datasets.load_splits(data, splits)
    if tokenizer is None:
        tokenizer = _tokenizer(data, examples, workdir)
    encoded = {
        s: encode_split(tokenizer, texts, labels, data, add_cls=add_cls)
        for s, (texts, labels, _) in examples.items()
    }
    return Encoded(tokenizer, next(iter(examples.values()))[2], encoded)


def encode_split(
    tokenizer: tokenizers.Tokenizer,
    texts: list[str],
    labels: np.ndarray,
    data: Any,
    *,
    add_cls: bool,
) -> Split:
    """Texts and their labels (int32 [N]) encoded as config.data `data` cuts them."""
    raw = [tokenizer.encode(t) for t in texts]
    frame = tokenizer.specials.frame
    ids = cut(raw, max_len=data.max_len, add_cls=add_cls, tail_len=data.tail_len, frame=frame)
    return Split(texts, ids, labels, bag_cut(raw, data, add_cls, frame))


def encode(
    tokenizer: tokenizers.Tokenizer,
    texts: Sequence[str],
    *,
    max_len: int,
    add_cls: bool,
    tail_len: int = 0,
) -> list[np.ndarray]:
    """Token ids per text, int32 [n <= max_len]; CLS (if any) counts (see `cut`). Anything with an
    `encode` will do: one without a `Specials` record is framed as attn's own tokenizers are."""
    raw = [tokenizer.encode(t) for t in texts]
    frame = getattr(tokenizer, "specials", tokenizers.OWN).frame
    return cut(raw, max_len=max_len, add_cls=add_cls, tail_len=tail_len, frame=frame)


def around(
    frame: tuple[Sequence[int], Sequence[int]] | None, add_cls: bool
) -> tuple[Sequence[int], Sequence[int]]:
    """(ids before, ids after) that `cut` puts around a text: `frame` (a checkpoint's [CLS] and
    [SEP]), else CLS when add_cls."""
    return frame if frame is not None else ([CLS] * add_cls, [])


def cut(
    raw: Sequence[np.ndarray],
    *,
    max_len: int,
    add_cls: bool,
    tail_len: int = 0,
    frame: tuple[Sequence[int], Sequence[int]] | None = None,
) -> list[np.ndarray]:
    """Whole texts' ids -> int32 [n <= max_len] per text, CLS (if any) first and counted; with
    `frame` (ids before, ids after: a checkpoint's [CLS] and [SEP]) those instead of CLS.

    A longer text keeps its first max_len - tail_len tokens (CLS included) and its last tail_len:
    a review often states its verdict at the end (Sun et al. 2019 keep head and tail on IMDB).
    """
    before, after = around(frame, add_cls)
    framing = len(before) + len(after)
    if max_len < 1 + framing:
        raise ValueError(f"max_len must be >= {1 + framing}, got {max_len}")
    keep = max_len - framing
    if not (isinstance(tail_len, int) and 0 <= tail_len <= keep):
        what = "CLS" if frame is None else "the special tokens"
        raise UserError(
            f"data.tail_len must be an integer in [0, {keep}] (max_len less {what}), got "
            f"{tail_len!r}"
        )
    prefix, suffix = np.array(before, np.int32), np.array(after, np.int32)
    return [np.concatenate([prefix, _cut(ids_L, keep, tail_len), suffix]) for ids_L in raw]


def bag_cut(
    raw: Sequence[np.ndarray],
    data: Any,
    add_cls: bool,
    frame: tuple[Sequence[int], Sequence[int]] | None = None,
) -> list[np.ndarray] | None:
    """What the bag reads of each whole text, int32 [m <= data.bag_len], framed as `cut` frames
    the attention's ids; None when data.bag_len is 0 and the bag reads `cut`'s ids."""
    return cut(raw, **bag_window(data, add_cls, frame)) if data.bag_len else None


def bag_window(
    data: Any, add_cls: bool, frame: tuple[Sequence[int], Sequence[int]] | None = None
) -> dict:
    """`cut`'s keyword arguments for what the bag reads: data.bag_len tokens, of which a longer
    text keeps the same share from its end as the attention's window does."""
    if not (isinstance(data.bag_len, int) and data.bag_len >= data.max_len):
        raise UserError(
            f"data.bag_len must be 0 or an integer >= max_len ({data.max_len}), got "
            f"{data.bag_len!r}"
        )
    framing = sum(map(len, around(frame, add_cls)))
    keep, bag_keep = data.max_len - framing, data.bag_len - framing
    return {
        "max_len": data.bag_len,
        "add_cls": add_cls,
        "tail_len": data.tail_len * bag_keep // keep if keep else 0,
        "frame": frame,
    }


@dataclasses.dataclass(frozen=True)
class Cut:
    """One whole text's ids as the model reads them, and where each came from in the text."""

    ids_L: np.ndarray  # int32 [L]: what attention reads (`cut`)
    bag_G: np.ndarray | None  # int32 [G]: what the bag reads (`bag_cut`); None: the bag reads ids_L
    index_L: np.ndarray  # int32 [L]: each position's token in the whole text; -1: put around it
    # int32 [G]: each bag token's position in ids_L, -1 for those only the bag reads; the ids put
    # around the text are where attention has them. None with bag_G.
    source_G: np.ndarray | None


def cut_text(
    raw_n: np.ndarray,
    data: Any,
    *,
    max_len: int,
    add_cls: bool,
    frame: tuple[Sequence[int], Sequence[int]] | None = None,
) -> Cut:
    """`cut` and `bag_cut` of one whole text's ids [n], and the same cuts of its token indices,
    so that what attention reads, what the bag reads and the text line up exactly."""
    ids_L = cut([raw_n], max_len=max_len, add_cls=add_cls, tail_len=data.tail_len, frame=frame)[0]
    before, after = around(frame, add_cls)
    unmarked = ([-1] * len(before), [-1] * len(after))  # what is put around the text: no index
    text_n = np.arange(len(raw_n), dtype=np.int32)
    index_L = cut(
        [text_n], max_len=max_len, add_cls=add_cls, tail_len=data.tail_len, frame=unmarked
    )[0]
    if not data.bag_len:
        return Cut(ids_L, None, index_L, None)
    window = bag_window(data, add_cls, frame)
    bag_G = cut([raw_n], **window)[0]
    index_G = cut([text_n], **{**window, "frame": unmarked})[0]
    at_n = np.full(len(raw_n) + 1, -1, np.int32)  # each token's position in ids_L; [-1]: none
    inside = np.flatnonzero(index_L >= 0)
    at_n[index_L[inside]] = inside
    source_G = at_n[index_G]
    source_G[: len(before)] = np.arange(len(before))
    source_G[len(bag_G) - len(after) :] = np.arange(len(ids_L) - len(after), len(ids_L))
    return Cut(ids_L, bag_G, index_L, source_G)


def _cut(ids_L: np.ndarray, keep: int, tail_len: int) -> np.ndarray:
    if len(ids_L) <= keep:
        return ids_L
    return np.concatenate([ids_L[: keep - tail_len], ids_L[len(ids_L) - tail_len :]])


def check_text(text: str) -> str:
    """A text a user wants classified, or a UserError saying why it cannot be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError("text is not valid UTF-8") from None
    if not text.strip():
        raise UserError("text is empty")
    return text


def _tokenizer(data: Any, examples: dict, workdir: str | None) -> tokenizers.Tokenizer:
    if workdir and tokenizers.saved(workdir):
        return tokenizers.load_tokenizer(workdir)
    if "train" not in examples:
        raise ValueError("building a tokenizer needs the train split")
    return tokenizer_for(data, examples["train"][0], None)


def tokenizer_for(data: Any, texts: Sequence[str], workdir: str | None) -> tokenizers.Tokenizer:
    """The tokenizer saved in `workdir` (a resumed run), else one built from `texts` as config.data
    `data` says (not saved: the caller saves it when its run is accepted)."""
    if workdir and tokenizers.saved(workdir):
        return tokenizers.load_tokenizer(workdir)
    return tokenizers.build_tokenizer(
        data.tokenizer,
        texts,
        lowercase=data.lowercase,
        min_freq=data.min_freq,
        max_vocab=data.max_vocab,
    )
