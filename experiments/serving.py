"""A trained run, served: its config, tokenizer, model config and the weights to serve (loaded
from a workdir for evaluate, predict, visualize and faithfulness), a user text encoded as training
encoded texts, and what the model reads of it.
"""

import dataclasses
import os
from typing import Any

import ml_collections
import numpy as np

from attn import models
from experiments import workdir_reader
from experiments.data import encoding, scripts, tokenizers
from experiments.data.tokenizers import CLS
from experiments.errors import UserError
from experiments.training import checkpoints


@dataclasses.dataclass(frozen=True)
class Trained:
    config: ml_collections.ConfigDict
    cfg: models.AnyConfig  # which: meta["family"]
    params: Any  # the weight average when the run kept one
    tokenizer: tokenizers.Tokenizer
    label_names: tuple[str, ...]
    step: int
    source: str  # which checkpoint this is, for the user: see `_describe`
    scripts: dict | None = None  # `scripts.script_shares` of its training texts; None: older


def load(workdir: str, which: str = checkpoints.BEST) -> Trained:
    """All that evaluate, predict and visualize need; UserError when the workdir lacks it.

    Only the weights are read: no optimizer or train state is built.
    """
    held = workdir_reader.read(workdir, which)
    if held.objective == checkpoints.MASKED_LM:
        raise UserError(
            f"{workdir!r} is a pretraining workdir: it predicts hidden tokens, not labels; "
            f"fine-tune it first with experiments.train --config.model.init_from={workdir}"
        )
    return Trained(
        held.config,
        held.cfg,
        held.weights(),
        held.tokenizer,
        held.label_names,
        held.step,
        _describe(held),
        held.scripts,
    )


def framing_ids(trained: Trained) -> np.ndarray:
    """int32: the ids that are no token of a text, which no ranking picks and no erasure removes:
    PAD and the tokens put around a text (CLS, or a checkpoint's [CLS] and [SEP])."""
    frame = encoding.frame_of(trained.tokenizer)
    around = [CLS] if frame is None else [*frame[0], *frame[1]]
    return np.array(sorted({tokenizers.PAD, *around}), np.int32)


def _describe(held: workdir_reader.Workdir) -> str:
    """E.g. "the best checkpoint (step 60, validation accuracy 0.8125) of runs/x; training has not
    finished (last checkpoint: step 100)": a half-trained workdir answers, but says so."""
    what = held.describe()
    if held.which == checkpoints.BEST:
        accuracy = held.meta["best_val_accuracy"]
        what = f"the best checkpoint (step {held.step}, validation accuracy {accuracy:.4f}) of "
        what += held.workdir
    if not os.path.exists(os.path.join(held.workdir, "eval_test.json")):  # written when it ends
        last = checkpoints.latest_step(held.workdir, checkpoints.LAST)
        what += "; training has not finished"
        what += f" (last checkpoint: step {last})" if last is not None else ""
    return what


def encode(trained: Trained, text: str) -> np.ndarray:
    """Token ids of one user text as the model saw texts in training (truncation, CLS)."""
    return encoding.encode(
        trained.tokenizer,
        [encoding.check_text(text)],
        max_len=trained.cfg.max_len,
        add_cls=trained.cfg.pooling == "cls",
        tail_len=trained.config.data.tail_len,
    )[0]


def encode_bag(trained: Trained, text: str) -> np.ndarray | None:
    """What the model's bag reads of one user text, when it reads more than `encode` gives."""
    tok = trained.tokenizer
    raw = [tok.encode(encoding.check_text(text))]
    add_cls = trained.cfg.pooling == "cls"
    bags = encoding.bag_cut(raw, trained.config.data, add_cls, encoding.frame_of(tok))
    return None if bags is None else bags[0]


NO_KNOWN_TOKENS = (
    "no known tokens: every token of the text but whitespace is outside the vocabulary"
)


@dataclasses.dataclass(frozen=True)
class Reading:
    """What the model reads of one text, for whoever reads its answer."""

    text_tokens: int  # tokens of the whole text (CLS not counted)
    known_tokens: int  # of those read: in the vocabulary, neither whitespace nor PAD/UNK/CLS
    notes: list[str]  # when the answer reads less than it seems: mostly unknown tokens, a cut


def reading(trained: Trained, text: str, ids_L: np.ndarray) -> Reading:
    """`ids_L` is `encode(trained, text)`. A note says what was read of a text cut to max_len,
    and that most (or all) of what was read is outside the vocabulary: an answer resting on
    few tokens, or on none."""
    tok = trained.tokenizer
    tokens = tok.tokens(ids_L.tolist())
    # PAD, UNK and CLS say nothing about the text, and neither do spaces between unknown words.
    special = getattr(tok, "special_ids", frozenset((tokenizers.PAD, tokenizers.UNK, CLS)))
    unk = getattr(tok, "unk_id", tokenizers.UNK)
    known = sum(
        int(i) not in special and int(i) > tokenizers.PAD and bool(t.strip())
        for i, t in zip(ids_L, tokens, strict=True)
    )
    unknown = int(np.sum(ids_L == unk))
    notes = []
    if not known:
        notes.append(NO_KNOWN_TOKENS)
    elif unknown > known:
        notes.append(
            f"mostly unknown: {unknown} of {known + unknown} tokens read are outside the "
            f"vocabulary, so the answer rests on the other {known}"
        )
    elif trained.scripts:
        notes.extend(scripts.foreign_note(trained.scripts, text))
    whole = len(trained.tokenizer.encode(encoding.check_text(text)))
    frame = encoding.frame_of(tok)
    add_cls = trained.cfg.pooling == "cls"
    specials = int(add_cls) if frame is None else sum(map(len, frame))  # CLS, or [CLS] [SEP]
    data = trained.config.data
    if whole > trained.cfg.max_len - specials:
        note = f"read {_part_read(trained.cfg.max_len - specials, data.tail_len)} of {whole} tokens"
        if (
            getattr(trained.cfg, "bag_buckets", 0) and data.bag_len
        ):  # the bag reads more than attention does
            bag = encoding.bag_window(data, add_cls, frame)
            bag_keep = bag["max_len"] - specials
            bag_read = "all" if whole <= bag_keep else _part_read(bag_keep, bag["tail_len"])
            note += f" (its bag: {bag_read})"
        notes.append(note)
    return Reading(whole, known, notes)


def _part_read(keep: int, tail_len: int) -> str:
    """What `encoding.cut` keeps of a longer text, in words."""
    head = keep - tail_len
    if not tail_len:
        return f"the first {head}"
    return f"the first {head} and last {tail_len}" if head else f"the last {tail_len}"
