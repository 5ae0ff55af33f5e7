"""A training workdir: the checks before writing into one, atomic JSON files, and loading a trained
one (config, tokenizer, model config and the weights to serve) for evaluate, predict and visualize.

A workdir holds config.json, tokenizer.json and vocab.txt, checkpoints/ and best/ (see
`checkpoints`), metrics.jsonl and tensorboard/, eval_test.json, baseline.json and scripts.json
(training's; scripts.json: which scripts its training texts are written in), evaluate_*.json
(evaluate's), curves.png and visualize/.
"""

import collections
import dataclasses
import json
import os
import shutil
import unicodedata
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from attn import classifier
from experiments import checkpoints
from experiments.cli import UserError
from experiments.data import encoding, tokenizers

MIN_FREE_BYTES = 64 << 20
# What a resumed run may change: where the data is, how long to train, how often to evaluate,
# save and log. Every other field decides what is trained (the model's are checked against the
# checkpoint, `checkpoints.resume`), so a run continued with another value would be another run.
MAY_CHANGE_ON_RESUME = frozenset(
    {
        "data.data_dir",
        "data.eval_batch_size",
        "data.max_bad_fraction",
        "optim.max_nonfinite",
        "train.num_epochs",
        "train.max_steps",
        "train.eval_every_steps",
        "train.checkpoint_every_steps",
        "train.log_every_steps",
        "train.keep_checkpoints",
        "train.baseline",
    }
)
# config.model fields that are not the model's (`optimization.RUN_FIELDS`), so no checkpoint's model
# config holds them: checked here with the rest of config.json.
_NOT_IN_CHECKPOINT = frozenset({"model.init_from", "model.embeddings_from"})
# tokenizer.json field -> the config field it was built from
_TOKENIZER_FIELDS = {
    "kind": "data.tokenizer",
    "lowercase": "data.lowercase",
    "min_freq": "data.min_freq",
    "max_vocab": "data.max_vocab",
}
# Fields added after workdirs were first written -> the value runs from before them used: a saved
# config.json without one is read with it, so resuming such a run with a config that sets another
# value is refused like any other change.
_ADDED_LATER = {
    "data.label_names": [],
    "data.tail_len": 0,
    "data.bag_len": 0,
    "optim.bag_init": "zeros",
    "optim.adversarial_relative": False,
    "model.init_from": "",
    "model.embeddings_from": "",
    "train.patience": 0,
    "optim.warm_lr_scale": 1.0,
}
# Shapes only: init runs under jax.eval_shape. Not a key made at import, which would start JAX's
# backend before a process of several can join the others.
KEY = jax.ShapeDtypeStruct((2,), jax.numpy.uint32)


def check_writable(workdir: str) -> None:
    """Fails before any work when the workdir cannot hold checkpoints."""
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write_test{jax.process_index()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"workdir {workdir!r} is not writable: {e.strerror}") from None
    free = shutil.disk_usage(workdir).free
    if free < MIN_FREE_BYTES:
        raise UserError(f"workdir {workdir!r} has only {free >> 20} MiB free; need 64 MiB")


def remove_if_unused(workdir: str) -> None:
    """Deletes `workdir` when it holds no file (folders only): what a run refused before writing
    anything leaves behind. Call it only for a workdir that run created."""
    if os.path.isdir(workdir) and not any(files for _, _, files in os.walk(workdir)):
        shutil.rmtree(workdir)


def check_same_run(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Refuses to continue the run in `workdir` with other data, tokenizer, optimizer or seed than
    its config.json and tokenizer.json record, naming every differing field (model fields are the
    checkpoint's to check). Fields in MAY_CHANGE_ON_RESUME may differ."""
    saved = {}
    config_path = os.path.join(workdir, "config.json")
    if os.path.exists(config_path):
        saved.update(_flat(read_config(config_path).to_dict()))
    tokenizer_path = os.path.join(workdir, "tokenizer.json")
    if os.path.exists(tokenizer_path):  # what the saved vocabulary was really built with
        tok = read_json(tokenizer_path)
        saved.update({field: tok[k] for k, field in _TOKENIZER_FIELDS.items() if k in tok})
    current = _flat(json.loads(json.dumps(config.to_dict())))  # tuples as JSON has them
    diff = [
        f"{k}: workdir {v!r} vs config {current.get(k)!r}"
        for k, v in sorted(saved.items())
        if (not k.startswith("model.") or k in _NOT_IN_CHECKPOINT)
        and k not in MAY_CHANGE_ON_RESUME
        and current.get(k) != v
    ]
    if diff:
        raise UserError(
            f"workdir {workdir!r} holds a run with another config ({'; '.join(diff)}); "
            "use a new --workdir or the original config"
        )


def read_config(path: str) -> ml_collections.ConfigDict:
    """A workdir's config.json, with the fields it predates set as its run used them."""
    return ml_collections.ConfigDict(complete(read_json(path)))


def complete(saved: dict) -> dict:
    """A config saved as JSON, with the fields it predates set as its run used them."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    for name, old in _ADDED_LATER.items():
        section, field = name.split(".")
        if section in out:
            out[section].setdefault(field, old)
    return out


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} is not a JSON object")
    return obj


def _flat(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write_json(path: str, obj: object) -> None:
    """Writes `obj` to `path` whole or not at all (a temporary file, then a rename)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class Trained:
    config: ml_collections.ConfigDict
    cfg: classifier.ModelConfig
    params: Any  # the weight average when the run kept one
    tokenizer: tokenizers.Tokenizer
    label_names: tuple[str, ...]
    step: int
    source: str  # which checkpoint this is, for the user: see `_describe`
    scripts: dict | None = None  # `script_shares` of the training texts; None in older workdirs


def load(workdir: str, which: str = checkpoints.BEST) -> Trained:
    """All that evaluate, predict and visualize need; UserError when the workdir lacks it.

    Only the weights are read: no optimizer or train state is built.
    """
    if not os.path.isdir(workdir):
        raise UserError(f"workdir {workdir!r} does not exist; train first with experiments.train")
    config_path = os.path.join(workdir, "config.json")
    if not os.path.exists(config_path):
        raise UserError(f"{workdir!r} has no config.json; is it a training workdir?")
    config = read_config(config_path)
    step = checkpoints.latest_step(workdir, which)
    if step is None and which == checkpoints.BEST:  # a run stopped before its first evaluation
        which = checkpoints.LAST
        step = checkpoints.latest_step(workdir, which)
    if step is None:
        raise UserError(f"{workdir!r} holds no checkpoint yet; train (or resume) first")
    with checkpoints.reader(workdir, which) as mngr:
        meta = checkpoints.read_meta(mngr, step)
        if meta.get("objective") == checkpoints.MASKED_LM:
            raise UserError(
                f"{workdir!r} is a pretraining workdir: it predicts hidden tokens, not labels; "
                f"fine-tune it first with experiments.train --config.model.init_from={workdir}"
            )
        cfg = model_config(meta, f"checkpoint {step} in {workdir!r}")
        tok = tokenizers.load_tokenizer(workdir)
        if tok.vocab_size != cfg.vocab_size:
            raise UserError(
                f"vocabulary in {workdir!r} has {tok.vocab_size} ids but the checkpoint expects "
                f"{cfg.vocab_size}; the workdir is inconsistent"
            )
        # Only the weights to serve: the weight average when the run kept one.
        served = "ema" if meta.get("ema", False) else "params"
        target = {served: jax.eval_shape(lambda key: classifier.init(key, cfg), KEY)}
        state, _ = checkpoints.restore(mngr, step, target, partial=True)
    source = _describe(workdir, which, step, meta)
    scripts_path = os.path.join(workdir, SCRIPTS_FILE)
    scripts = read_json(scripts_path) if os.path.exists(scripts_path) else None
    return Trained(
        config, cfg, state[served], tok, tuple(meta["label_names"]), step, source, scripts
    )


def _describe(workdir: str, which: str, step: int, meta: dict) -> str:
    """E.g. "the best checkpoint (step 60, validation accuracy 0.8125) of runs/x; training has not
    finished (last checkpoint: step 100)": a half-trained workdir answers, but says so."""
    if which == checkpoints.BEST:
        what = f"the best checkpoint (step {step}, validation accuracy "
        what += f"{meta['best_val_accuracy']:.4f})"
    else:
        what = f"the last checkpoint (step {step})"
    what += f" of {workdir}"
    if not os.path.exists(os.path.join(workdir, "eval_test.json")):  # written when training ends
        last = checkpoints.latest_step(workdir, checkpoints.LAST)
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
    raw = [trained.tokenizer.encode(encoding.check_text(text))]
    bags = encoding.bag_cut(raw, trained.config.data, trained.cfg.pooling == "cls")
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
    tokens = trained.tokenizer.tokens(ids_L.tolist())
    # PAD, UNK and CLS say nothing about the text, and neither do spaces between unknown words.
    known = sum(
        int(i) > tokenizers.CLS and bool(t.strip()) for i, t in zip(ids_L, tokens, strict=True)
    )
    unknown = int(np.sum(ids_L == tokenizers.UNK))
    notes = []
    if not known:
        notes.append(NO_KNOWN_TOKENS)
    elif unknown > known:
        notes.append(
            f"mostly unknown: {unknown} of {known + unknown} tokens read are outside the "
            f"vocabulary, so the answer rests on the other {known}"
        )
    elif trained.scripts:
        notes.extend(_foreign_script(trained.scripts, text))
    whole = len(trained.tokenizer.encode(encoding.check_text(text)))
    add_cls = trained.cfg.pooling == "cls"
    data = trained.config.data
    if whole > trained.cfg.max_len - add_cls:
        note = f"read {_part_read(trained.cfg.max_len - add_cls, data.tail_len)} of {whole} tokens"
        if trained.cfg.bag_buckets and data.bag_len:  # the bag reads more than attention does
            bag = encoding.bag_window(data, add_cls)
            bag_keep = bag["max_len"] - add_cls
            bag_read = "all" if whole <= bag_keep else _part_read(bag_keep, bag["tail_len"])
            note += f" (its bag: {bag_read})"
        notes.append(note)
    return Reading(whole, known, notes)


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


def _foreign_script(trained_scripts: dict, text: str) -> list[str]:
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


def _part_read(keep: int, tail_len: int) -> str:
    """What `encoding.cut` keeps of a longer text, in words."""
    head = keep - tail_len
    if not tail_len:
        return f"the first {head}"
    return f"the first {head} and last {tail_len}" if head else f"the last {tail_len}"


def model_config(meta: dict, where: str) -> classifier.ModelConfig:
    """The model config a checkpoint's meta records; UserError (naming `where`) if unusable."""
    try:
        model = meta["model"]
        return classifier.ModelConfig(
            **{**model, "ngram_orders": tuple(model.get("ngram_orders", ()))}
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{where} has an unusable model config: {e}") from None
