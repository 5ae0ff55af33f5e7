"""A trained run, served: its config, tokenizer, model config and the weights to serve (loaded
from a workdir for evaluate, predict, visualize and faithfulness, or from a transformers sequence
classifier with no workdir, `load_pretrained`), and a user text as the model reads it (`read`,
from one call of the tokenizer): converted as the run converted its texts (data.convert, or the
commands' --convert: `converting`), its ids encoded as training encoded texts, what its bag
reads, its words and what the answer rests on.
"""

import dataclasses
import os
from typing import Any

import ml_collections
import numpy as np

from attn import encoder_classifier, encoders, models
from configs import finetune
from experiments.data import checkpoint_tokenizer, conversion, encoding, scripts, tokenizers
from experiments.errors import UserError
from experiments.training import checkpoints, workdir_reader


@dataclasses.dataclass(frozen=True)
class Trained:
    config: ml_collections.ConfigDict
    cfg: models.AnyConfig  # attn.classifier's or attn.encoder_classifier's: `models.family` says
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


def load_pretrained(path: str) -> Trained:
    """A transformers ...ForSequenceClassification directory or hub id (an exported workdir
    among them) served as it is: its head, labels and own tokenizer
    (`attn.encoder_classifier.load`), reading up to its encoder's positions from the text's start
    as transformers truncates; UserError in one line for what that load refuses."""
    try:
        params, cfg, names = encoder_classifier.load(path)
        ck = encoders.open_checkpoint(path)
    except encoders.CheckpointError as e:
        raise UserError(f"--pretrained: {e}") from None
    tok = checkpoint_tokenizer.CheckpointTokenizer(ck.directory)
    config = finetune.get_config()
    with config.unlocked():
        config.model.pretrained = str(path)
        config.model.pooling = cfg.pooling
        config.data.max_len = cfg.max_len
        config.data.tail_len = 0
        # Doubling lengths: a new text length compiles at most log2(max_len) programs.
        config.data.buckets = tuple(1 << k for k in range(4, cfg.max_len.bit_length()))
    source = f"the sequence classifier {str(path)!r} ({ck.weights}) as it is (no workdir)"
    return Trained(config, cfg, params, tok, names, 0, source)


def converting(trained: Trained, name: str | None) -> Trained:
    """`trained` converting every text by OpenCC's conversion `name` ("" for none) in place of
    its run's data.convert (the commands' --convert); None keeps the run's. UserError in one line
    for a name OpenCC lacks."""
    if name is None:
        return trained
    conversion.converter(name, "--convert")
    config = ml_collections.ConfigDict(trained.config.to_dict())
    config.data.convert = name
    return dataclasses.replace(trained, config=config)


def converted(trained: Trained, texts: list[str]) -> tuple[list[str], int]:
    """`texts` as the model reads them (data.convert), and how many of them that changed."""
    return conversion.convert_all(trained.config.data.convert, texts)


def text_read(trained: Trained, text: str) -> str:
    """A user's text as the model reads it: checked (`encoding.check_text`), then converted."""
    return conversion.converter(trained.config.data.convert)(encoding.check_text(text))


def framing_ids(trained: Trained) -> np.ndarray:
    """int32: the ids that are no token of a text, which no ranking picks and no erasure removes:
    PAD and the tokens put around a text (CLS, or a checkpoint's [CLS] and [SEP])."""
    return np.array(sorted(trained.tokenizer.specials.framing), np.int32)


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


def cut(trained: Trained, raw_n: np.ndarray) -> encoding.Cut:
    """What the model reads of a whole text's ids [n] (its tokenizer's `encode`), cut as
    training cut texts (truncation, CLS or [CLS] ... [SEP], the bag's longer window)."""
    return encoding.cut_text(
        raw_n,
        trained.config.data,
        max_len=trained.cfg.max_len,
        add_cls=trained.cfg.pooling == "cls",
        frame=trained.tokenizer.specials.frame,
    )


def encode(trained: Trained, text: str) -> np.ndarray:
    """Token ids of one user text as the model saw texts in training (truncation, CLS)."""
    return cut(trained, trained.tokenizer.encode(text_read(trained, text))).ids_L


def encode_bag(trained: Trained, text: str) -> np.ndarray | None:
    """What the model's bag reads of one user text, when it reads more than `encode` gives."""
    return cut(trained, trained.tokenizer.encode(text_read(trained, text))).bag_G


@dataclasses.dataclass(frozen=True)
class Words:
    """The words of what the model reads of one text, for showing where its attention went."""

    of_L: np.ndarray  # int32 [L]: each position's word in `texts`; -1: framing, PAD, UNK, blank
    texts: list[str]  # each word as the text writes it


NO_KNOWN_TOKENS = (
    "no known tokens: every token of the text but whitespace is outside the vocabulary"
)


@dataclasses.dataclass(frozen=True)
class Reading:
    """What the model reads of one text, for whoever reads its answer."""

    text_tokens: int  # tokens of the whole text (CLS not counted)
    known_tokens: int  # of those read: in the vocabulary, neither whitespace nor PAD/UNK/CLS
    notes: list[str]  # when the answer reads less than it seems: mostly unknown tokens, a cut
    cut: bool = False  # the text is longer than the model reads


@dataclasses.dataclass(frozen=True)
class Read:
    """One text as the model reads it, from one call of its tokenizer: all that predict (with
    --explain) and visualize take from a text."""

    ids_L: np.ndarray  # int32 [L]: what attention reads (`encode`)
    bag_G: np.ndarray | None  # int32 [G]: what the bag reads, when more (`encode_bag`)
    source_G: np.ndarray | None  # int32 [G]: each bag token's place in ids_L (`encoding.Cut`)
    tokens_L: list[str]  # each id as the tokenizer writes it
    words: Words
    reading: Reading
    converted: bool  # data.convert changed the text: its words are the converted ones


def read(trained: Trained, text: str) -> Read:
    """`text` read once: its ids, what its bag reads, its words and what the answer rests on."""
    seen = text_read(trained, text)
    pieces = trained.tokenizer.encode_words(seen)
    c = cut(trained, pieces.ids)
    tokens_L = trained.tokenizer.tokens(c.ids_L.tolist())
    summary = _summary(trained, seen, c.ids_L, whole=len(pieces.ids))
    words = _words(trained, c, pieces, tokens_L)
    return Read(c.ids_L, c.bag_G, c.source_G, tokens_L, words, summary, seen != text)


def _words(
    trained: Trained, c: encoding.Cut, pieces: tokenizers.Pieces, tokens_L: list[str]
) -> Words:
    """The words of what `c` reads: a pretrained tokenizer's word pieces ("toast" "##er") make
    one word ("toaster"), as the text writes it; attn's own tokens (a character, a word) are each
    their own. Tokens that are no part of the text or say nothing of it (framing, PAD, unknown,
    whitespace) belong to none."""
    silent = trained.tokenizer.specials.silent
    index: dict[int, int] = {}
    texts: list[str] = []
    of_L = np.full(len(c.ids_L), -1, np.int32)
    for p, (i, id_, shown) in enumerate(zip(c.index_L, c.ids_L, tokens_L, strict=True)):
        if i < 0 or int(id_) in silent or not shown.strip():
            continue
        w = int(pieces.word_n[i])
        if w not in index:
            index[w] = len(texts)
            texts.append(pieces.words[w])
        of_L[p] = index[w]
    return Words(of_L, texts)


def reading(trained: Trained, text: str, ids_L: np.ndarray) -> Reading:
    """What the answer to `text` rests on, `ids_L` being `encode(trained, text)` (`read` gives
    it with the rest, from its one call of the tokenizer)."""
    seen = text_read(trained, text)
    return _summary(trained, seen, ids_L, len(trained.tokenizer.encode(seen)))


def known_tokens(trained: Trained, ids_L: np.ndarray) -> int:
    """How many of the ids [L] are tokens of the text that the vocabulary knows: PAD, UNK and
    the ids put around the text say nothing about it, and neither do spaces between unknown
    words."""
    tok = trained.tokenizer
    return sum(
        int(i) not in tok.specials.silent and bool(t.strip())
        for i, t in zip(ids_L, tok.tokens(ids_L.tolist()), strict=True)
    )


def _summary(trained: Trained, text: str, ids_L: np.ndarray, whole: int) -> Reading:
    """A note says what was read of a text of `whole` tokens cut to max_len, and that most (or
    all) of what was read is outside the vocabulary: an answer resting on few tokens, or on
    none."""
    specials = trained.tokenizer.specials
    known = known_tokens(trained, ids_L)
    unknown = int(np.sum(ids_L == specials.unk))
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
    add_cls = trained.cfg.pooling == "cls"
    framing = _framing(trained)
    data = trained.config.data
    keep = trained.cfg.max_len - framing
    if whole > keep:
        only = "only " if 2 * keep < whole else ""  # most of the text unread: said loudly
        note = f"read {only}{_part_read(keep, data.tail_len)} of {whole} tokens"
        if trained.cfg.bag_buckets and data.bag_len:  # the bag reads more than attention does
            bag = encoding.bag_window(data, add_cls, specials.frame)
            bag_keep = bag["max_len"] - framing
            bag_read = "all" if whole <= bag_keep else _part_read(bag_keep, bag["tail_len"])
            note += f" (its bag: {bag_read})"
        notes.append(note)
    return Reading(whole, known, notes, cut=whole > keep)


def _framing(trained: Trained) -> int:
    """How many of the tokens the model reads are put around the text: CLS, or [CLS] [SEP]."""
    around = encoding.around(trained.tokenizer.specials.frame, trained.cfg.pooling == "cls")
    return sum(map(len, around))


def longest_input(cfg: models.AnyConfig) -> int | None:
    """The most tokens the model can read, special ones included: its encoder's positions (a
    pretrained one), its learned position table (attn's); None when nothing bounds it (attn's
    sinusoidal or no positions)."""
    if models.family(cfg) != models.OWN:
        return cfg.encoder.max_length
    return cfg.max_len if cfg.positions == "learned" else None


def reading_up_to(trained: Trained, max_len: int) -> Trained:
    """`trained` reading up to `max_len` tokens of a text (special tokens included) instead of
    the length it was trained with; UserError when the model cannot read that many."""
    limit = longest_input(trained.cfg)
    if limit is not None and max_len > limit:
        why = (
            "its learned positions end there; to read more, train with a longer data.max_len"
            if models.family(trained.cfg) == models.OWN
            else "its encoder's positions end there"
        )
        raise UserError(f"--max_len={max_len}: the model reads at most {limit} tokens ({why})")
    least = _framing(trained) + trained.config.data.tail_len + 1
    if max_len < least:
        raise UserError(
            f"--max_len={max_len}: the model needs at least {least} (its special tokens, the "
            "text's tail it keeps, one more)"
        )
    config = ml_collections.ConfigDict(trained.config.to_dict())
    config.data.max_len = max_len
    cfg = dataclasses.replace(trained.cfg, max_len=max_len)
    return dataclasses.replace(trained, config=config, cfg=cfg)


def read_more(trained: Trained, whole: int) -> str:
    """For a text of `whole` tokens that the model reads in part: how to read more of it
    (predict --max_len), or why the model cannot."""
    limit = longest_input(trained.cfg)
    needed = whole + _framing(trained)
    if limit is not None and limit <= trained.cfg.max_len:
        table = "learned" if models.family(trained.cfg) == models.OWN else "encoder's"
        return f"the model reads no more: its {table} positions end at {limit}"
    more = needed if limit is None else min(needed, limit)
    what = "all of it" if more == needed else "as much as its encoder's positions allow"
    return f"it reads {trained.cfg.max_len} tokens (max_len): --max_len={more} reads {what}"


def _part_read(keep: int, tail_len: int) -> str:
    """What `encoding.cut` keeps of a longer text, in words."""
    head = keep - tail_len
    if not tail_len:
        return f"the first {head}"
    return f"the first {head} and last {tail_len}" if head else f"the last {tail_len}"
