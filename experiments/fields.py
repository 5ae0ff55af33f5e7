"""Every config field in one table: what it means, which values it takes, whether the data may
choose it, and what a resumed run may change. The config files set values; the commands read
each field's rules from here (`--print_config`, the checks before a run, `data.chosen`,
`workdirs.check_same_run`, `workdirs.read_config`). A new field is one row here and one line in
configs/default.py.

It is also where the config meets the library: `model_config` turns config.model into the frozen
`attn.classifier.ModelConfig` that `attn` reads, once, so `attn` never sees a ConfigDict.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections

from attn import classifier, distillation, masked_lm
from experiments.data import conversion
from experiments.errors import UserError

# What a resumed run may do with a field (`Field.resume`).
SAME = "same"  # keep it: another value would make another run (config.json says what it was)
MAY_CHANGE = "may change"  # change it: where the data is, how long, how often to evaluate or save
MODEL = "model"  # a field of the model config, which the checkpoint records and checks itself

_NONE = object()  # no value: a field the data cannot choose, or one every saved config has


@dataclasses.dataclass(frozen=True)
class Check:
    """A field's valid values: `ok(value)`, and what it asks for in words (`want`)."""

    ok: Callable[[Any], bool]
    want: str


def number(ok: Callable[[float], bool], want: str) -> Check:
    """An int or float (not a bool) for which ok holds."""
    return Check(lambda v: not isinstance(v, bool) and isinstance(v, int | float) and ok(v), want)


def integer(ok: Callable[[int], bool], want: str) -> Check:
    return Check(lambda v: not isinstance(v, bool) and isinstance(v, int) and ok(v), want)


def one_of(*values: str) -> Check:
    return Check(lambda v: v in values, f"one of {values}")


@dataclasses.dataclass(frozen=True)
class Field:
    meaning: str  # printed by --print_config
    check: Check | None = None  # None: the code that reads it checks it (model fields: attn's)
    auto: Any = _NONE  # the value that leaves the field to the data (`data.chosen`)
    resume: str = SAME
    before: Any = _NONE  # the value a config.json written before the field existed stands for


FIELDS: dict[str, Field] = {
    "data.dataset": Field(
        "chinese_reviews, imdb_reviews, glue/sst2 (TFDS) or file (data.path)",
    ),
    "data.data_dir": Field(
        'where TFDS keeps prepared datasets; "" = ~/tensorflow_datasets',
        resume=MAY_CHANGE,
    ),
    "data.path": Field(
        "your CSV/TSV/JSONL file or folder of <label>/*.txt, for dataset=file",
    ),
    "data.text_field": Field(
        "column (or JSON key) holding the text, for dataset=file",
    ),
    "data.label_field": Field(
        "column (or JSON key) holding the label, for dataset=file",
    ),
    "data.label_names": Field(
        "the labels a file's rows may have, in class order; rows with another are skipped as "
        "malformed; () = every label found, sorted (dataset=file)",
        before=[],
    ),
    "data.max_bad_fraction": Field(
        "stop when more than this fraction of a file's rows are malformed",
        resume=MAY_CHANGE,
    ),
    "data.convert": Field(
        "an OpenCC conversion applied to every text before it is read, e.g. t2s (traditional "
        'Chinese to simplified) or tw2s; "" = none. Saved with the run: its predict, evaluate and '
        "visualize convert too",
        check=Check(lambda v: isinstance(v, str), "an OpenCC conversion name such as 't2s', or ''"),
        before="",
    ),
    "data.tokenizer": Field(
        "char, word or byte; auto = chosen from the data (csv.py); pretrained = "
        "model.pretrained's own (finetune.py)",
        auto="auto",
    ),
    "data.lowercase": Field(
        "lowercase texts before tokenizing",
    ),
    "data.min_freq": Field(
        "keep tokens seen at least this often in train (char and word)",
    ),
    "data.max_vocab": Field(
        "vocabulary size cap, the 3 reserved ids included; 0 = no cap",
    ),
    "data.max_len": Field(
        "tokens per text (CLS included), longer ones are cut; 0 = from the data",
        auto=0,
    ),
    "data.tail_len": Field(
        "a cut text keeps this many tokens from its end, the rest from its start; -1 = from the "
        "data",
        auto=-1,
        before=0,
    ),
    "data.bag_len": Field(
        "tokens per text the bag reads (cut as max_len is), >= max_len; 0 = the same as "
        "attention; -1 = from the data",
        auto=-1,
        before=0,
    ),
    "data.unlabeled": Field(
        "unlabeled texts that pretraining reads, and a teacher labels for the student "
        "(distill.teacher): .txt (a text per line), .csv/.tsv/.jsonl (data.text_field), a folder "
        "(aclImdb's unsup/) or tfds:<name>:<split>",
    ),
    "data.buckets": Field(
        "lengths a batch is padded to (one compiled program each)",
    ),
    "data.batch_size": Field(
        "training examples per step, over all devices",
    ),
    "data.eval_batch_size": Field(
        "examples per evaluation batch, over all devices",
        resume=MAY_CHANGE,
    ),
    "model.d_model": Field(
        "width of the token vectors",
        resume=MODEL,
    ),
    "model.num_heads": Field(
        "attention heads per layer",
        resume=MODEL,
    ),
    "model.num_layers": Field(
        "encoder blocks (self-attention + feed-forward)",
        resume=MODEL,
    ),
    "model.d_ff": Field(
        "hidden width of the feed-forward layer",
        resume=MODEL,
    ),
    "model.positions": Field(
        "learned, sinusoidal or none",
        resume=MODEL,
    ),
    "model.pooling": Field(
        "token vectors to one vector: cls, mean, max or structured (Lin et al.)",
        resume=MODEL,
    ),
    "model.pool_hops": Field(
        "attention hops r of structured pooling",
        resume=MODEL,
    ),
    "model.pool_hidden": Field(
        "hidden width d_a of structured pooling",
        resume=MODEL,
    ),
    "model.dropout": Field(
        "dropout on residual branches and the pooled vector",
        resume=MODEL,
    ),
    "model.embed_dropout": Field(
        "dropout on the summed input embeddings",
        resume=MODEL,
    ),
    "model.score": Field(
        "query-key similarity: dot, scaled_dot, general, additive (alias concat) or mlp",
        resume=MODEL,
    ),
    "model.implementation": Field(
        "matrix, chunked (memory linear in length) or xla",
        resume=MODEL,
    ),
    "model.q_chunk": Field(
        "query rows per block of chunked attention",
        resume=MODEL,
    ),
    "model.k_chunk": Field(
        "key rows per block of chunked attention",
        resume=MODEL,
    ),
    "model.ngram_buckets": Field(
        "hashed n-gram embedding rows; 0 = no n-gram embeddings",
        resume=MODEL,
    ),
    "model.ngram_orders": Field(
        "n of the hashed n-grams",
        resume=MODEL,
    ),
    "model.dtype": Field(
        "compute dtype, float32 or bfloat16 (parameters stay float32)",
        resume=MODEL,
    ),
    "model.bag_buckets": Field(
        "rows of the linear model on the bag of hashed n-grams; 0 = none",
        resume=MODEL,
    ),
    "model.bag_orders": Field(
        "n of the bag's n-grams",
        resume=MODEL,
    ),
    "model.bag_dropout": Field(
        "fraction of the bag's n-grams dropped in training",
        resume=MODEL,
    ),
    "model.init_from": Field(
        "start the encoder from this workdir's (pretraining or trained), with its tokenizer; "
        "empty = random",
        before="",
    ),
    "model.pretrained": Field(
        "fine-tune this Hugging Face model directory or hub id (config.json, "
        "model.safetensors, flax_model.msgpack or pytorch_model.bin, tokenizer.json, vocab.txt "
        "or spm.model; any family attn.encoders reads) with a linear head, using "
        "model.pooling (cls or mean), dropout (the head's) and implementation; its own sizes "
        "replace the other model fields; empty = attn's own classifier",
        before="",
    ),
    "model.pretrained_layers": Field(
        "keep model.pretrained's first N layers; 0 = its embeddings alone, pooled (attention "
        "off); -1 = all",
        check=integer(lambda v: v >= -1, "an integer >= -1"),
        before=-1,
    ),
    "model.pretrained_init": Field(
        "checkpoint = model.pretrained's weights; random = its architecture and tokenizer with "
        "random weights (what pretraining is worth)",
        check=one_of("checkpoint", "random"),
        before="checkpoint",
    ),
    "model.embeddings_from": Field(
        "start the token embeddings from this word-vector file (word2vec, GloVe or fastText text "
        "format, .gz too); empty = random",
        before="",
    ),
    "optim.learning_rate": Field(
        "AdamW peak learning rate; -1 = from a pretrained encoder's width (fine-tuning)",
        check=number(lambda v: v > 0 or v == -1, "> 0 (or -1: from the encoder's width)"),
        auto=-1,
    ),
    "optim.warmup_steps": Field(
        "linear warmup steps before the cosine decay; -1 = from the data",
        check=number(
            lambda v: v >= -1 and float(v).is_integer(), "an integer >= 0 (or -1: from the data)"
        ),
        auto=-1,
    ),
    "optim.schedule": Field(
        "learning-rate decay after the warmup: cosine (to 1% of the peak) or linear (to 0)",
        check=one_of("cosine", "linear"),
        before="cosine",
    ),
    "optim.layer_decay": Field(
        "layer-wise learning-rate decay of a pretrained encoder: the head gets the rate, the "
        "top layer the rate times this, each layer below once more, the embeddings last; "
        "1 = off",
        check=number(lambda v: 0 < v <= 1, "in (0, 1] (1 = off)"),
        before=1.0,
    ),
    "optim.weight_decay": Field(
        "AdamW decoupled weight decay",
        check=number(lambda v: v >= 0, ">= 0"),
    ),
    "optim.clip_norm": Field(
        "global gradient-norm clip",
        check=number(lambda v: v > 0, "> 0"),
    ),
    "optim.label_smoothing": Field(
        "label smoothing of the cross-entropy",
        check=number(lambda v: 0 <= v < 1, "in [0, 1)"),
    ),
    "optim.adversarial_eps": Field(
        "norm of the adversarial embedding perturbation; 0 = off",
        check=number(lambda v: v >= 0, ">= 0 (0 = no adversarial loss)"),
    ),
    "optim.adversarial_relative": Field(
        "adversarial_eps is a fraction of each example's embedding norm (False: an absolute norm)",
        before=False,
    ),
    "optim.ema_decay": Field(
        "running average of the weights to evaluate and serve; 0 = off; -1 = from the run's "
        "length (over about its last eighth, at most 0.99)",
        check=number(
            lambda v: v == -1 or 0 <= v < 1, "in [0, 1) (0 = no running average; -1: from the data)"
        ),
        auto=-1,
    ),
    "optim.penalty_weight": Field(
        "weight of structured pooling's ||AA^T - I||^2 penalty",
        check=number(lambda v: v >= 0, ">= 0"),
    ),
    "optim.bag_init": Field(
        "the bag's starting table: zeros, or naive_bayes (log-count ratios of the training split)",
        check=one_of("zeros", "naive_bayes"),
        before="zeros",
    ),
    "optim.warm_lr_scale": Field(
        "learning-rate factor of what train starts from (model.init_from's encoder, "
        "model.embeddings_from's table); 0 = frozen",
        check=number(lambda v: v >= 0, ">= 0 (0 freezes what the run starts from)"),
        before=1.0,
    ),
    "optim.max_nonfinite": Field(
        "consecutive skipped (non-finite) steps before training stops",
        check=number(lambda v: v >= 1 and float(v).is_integer(), "an integer >= 1"),
        resume=MAY_CHANGE,
    ),
    "train.seed": Field(
        "initialisation, dropout and batch order",
    ),
    "train.num_epochs": Field(
        "passes over the training split (if max_steps is 0); 0 = from the data",
        auto=0,
        resume=MAY_CHANGE,
    ),
    "train.eval_every_steps": Field(
        "validation interval (best accuracy kept); 0 = from the data",
        auto=0,
        resume=MAY_CHANGE,
    ),
    "train.checkpoint_every_steps": Field(
        "checkpoint interval (resume starts there); 0 = from the data",
        auto=0,
        resume=MAY_CHANGE,
    ),
    "train.keep_checkpoints": Field(
        "how many recent checkpoints to keep",
        resume=MAY_CHANGE,
    ),
    "train.log_every_steps": Field(
        "metrics.jsonl and TensorBoard interval",
        resume=MAY_CHANGE,
    ),
    "train.max_steps": Field(
        "total steps; 0 = num_epochs in full",
        resume=MAY_CHANGE,
    ),
    "train.baseline": Field(
        "also fit TF-IDF + logistic regression on the same split; print both",
        resume=MAY_CHANGE,
    ),
    "train.patience": Field(
        "stop after this many evaluations in a row without a better validation accuracy; 0 = never",
        check=integer(lambda v: v >= 0, "an integer >= 0"),
        before=0,
    ),
    "pretrain.num_epochs": Field(
        "passes of masked-token pretraining over the training texts (and data.unlabeled) that "
        "train runs first, into WORKDIR/pretrain; 0 = none",
        check=number(lambda v: v >= 0, ">= 0"),
    ),
    "pretrain.max_steps": Field(
        "pretraining steps; 0 = pretrain.num_epochs in full",
        check=number(lambda v: v >= 0, ">= 0"),
    ),
    "pretrain.mask_rate": Field(
        "share of each text's tokens hidden and predicted (80% shown as UNK, 10% as a random "
        "token, 10% as they are)",
        check=number(lambda v: 0 < v < 1, "in (0, 1)"),
    ),
    "pretrain.head_vocab": Field(
        "the head predicts only the N most frequent tokens, rarer ones are never targets (the "
        "vocabulary softmax is most of a step); 0 = all",
        check=number(lambda v: v == 0 or v > masked_lm.FIRST_REAL, "0 or > 3"),
    ),
    "pretrain.learning_rate": Field(
        "AdamW peak learning rate of pretraining",
        check=number(lambda v: v > 0, "> 0"),
    ),
    "pretrain.warmup_steps": Field(
        "linear warmup steps of pretraining",
        check=number(lambda v: v >= 0 and float(v).is_integer(), "an integer >= 0"),
    ),
    "pretrain.eval_every_steps": Field(
        "pretraining's validation interval (masked-token accuracy)",
        check=number(lambda v: v >= 1, ">= 1"),
    ),
    "pretrain.checkpoint_every_steps": Field(
        "pretraining's checkpoint interval",
        check=number(lambda v: v >= 1, ">= 1"),
    ),
    "distill.teacher": Field(
        "the teacher attn's own model learns from: a trained workdir, or a transformers sequence "
        "classifier (a directory or hub id, as predict --pretrained serves); empty = none",
        before="",
    ),
    "distill.loss": Field(
        "what the student matches of the teacher: soft (its probabilities at distill.temperature) "
        "or mse (its logits, each text's centred)",
        check=one_of(*distillation.LOSSES),
        before="soft",
    ),
    "distill.temperature": Field(
        "softmax temperature of the soft targets (their loss is scaled by its square)",
        check=number(lambda v: v > 0, "> 0"),
        before=1.0,
    ),
    "distill.weight": Field(
        "weight of the teacher's term on a training text, the label's cross-entropy having the "
        "rest; an augmented or unlabeled text has the teacher's alone; 1 = the teacher alone",
        check=number(lambda v: 0 <= v <= 1, "in [0, 1]"),
        before=1.0,
    ),
    "distill.augment": Field(
        "augmented copies of each training text in the transfer set (masked units, n-grams); "
        "without a teacher they keep their text's label",
        check=integer(lambda v: v >= 0, "an integer >= 0"),
        before=0,
    ),
    "distill.mask_rate": Field(
        "chance that an augmented copy masks each character (Chinese, Japanese) or word",
        check=number(lambda v: 0 <= v < 1, "in [0, 1)"),
        before=0.1,
    ),
    "distill.ngram_rate": Field(
        "chance that an augmented copy is cut to a random n-gram of it (1-5 words or 1-10 "
        "characters)",
        check=number(lambda v: 0 <= v <= 1, "in [0, 1]"),
        before=0.25,
    ),
}


def auto_mark(name: str) -> Any:
    """The value of field `name` that leaves it to the data; None when the data cannot choose it."""
    mark = FIELDS[name].auto
    return None if mark is _NONE else mark


def left_to_data(config: ml_collections.ConfigDict) -> set[str]:
    """The fields of `config` (dotted names) that it leaves to the data."""
    return {
        name
        for name, f in FIELDS.items()
        if f.auto is not _NONE and _get(config, name, _NONE) == f.auto
    }


def run_fields() -> tuple[str, ...]:
    """config.model fields that say where a run's parameters start, not what the model is."""
    return tuple(
        name.split(".", 1)[1]
        for name, f in FIELDS.items()
        if name.startswith("model.") and f.resume != MODEL
    )


def check(config: ml_collections.ConfigDict) -> None:
    """The config's own mistakes, before any data is read: an unknown or missing field, a value
    outside its range, settings that contradict each other, a model attn would refuse."""
    given = set(flat(config.to_dict()))
    unknown = sorted(given - set(FIELDS))
    if unknown:
        raise UserError(
            f"unknown config field(s) {', '.join(unknown)}: experiments/fields.py has no row for "
            "them (a field of your own needs one there)"
        )
    missing = sorted(set(FIELDS) - given)
    if missing:
        raise UserError(
            f"the config lacks field(s) {', '.join(missing)}; start your config from "
            "configs/default.py's get_config()"
        )
    for name, f in FIELDS.items():
        if f.check is not None and not f.check.ok(_get(config, name)):
            raise UserError(f"config.{name} must be {f.check.want}; got {_get(config, name)!r}")
    conversion.converter(config.data.convert)  # a name OpenCC lacks: before any data is read
    if config.optim.bag_init == "naive_bayes" and not config.model.bag_buckets:
        raise UserError("optim.bag_init=naive_bayes needs a bag: set model.bag_buckets > 0")
    if config.data.bag_len and not config.model.bag_buckets:
        raise UserError("data.bag_len > 0 needs a bag: set model.bag_buckets > 0")
    if distills(config):
        check_distill(config)
    if config.model.pretrained:
        check_pretrained(config)
        return
    for name, off in (("pretrained_layers", -1), ("pretrained_init", "checkpoint")):
        if config.model[name] != off:
            raise UserError(f"model.{name} needs a pretrained encoder: set model.pretrained")
    if config.optim.layer_decay != 1:
        raise UserError("optim.layer_decay needs a pretrained encoder: set model.pretrained")
    check_model(config)


def distills(config: ml_collections.ConfigDict) -> bool:
    """Whether `config` trains on a transfer set: from a teacher, or on augmented copies."""
    d = config.get("distill")
    return bool(d and (d.teacher or d.augment))


def check_distill(config: ml_collections.ConfigDict) -> None:
    """What a distilled (or augmented) run cannot pair with."""
    if config.model.pretrained:
        raise UserError(
            "distill.teacher and distill.augment train attn's own model, and model.pretrained "
            f"fine-tunes {config.model.pretrained!r} instead: a student is attn's own (unset "
            "model.pretrained), a fine-tune is a teacher (distill.teacher=ITS_WORKDIR)"
        )
    if config.distill.teacher and config.optim.label_smoothing:
        raise UserError(
            "optim.label_smoothing with distill.teacher: the teacher's soft targets take its "
            "place; set optim.label_smoothing=0"
        )


# What fine-tuning a pretrained encoder (model.pretrained) does not have: field -> its off value.
PRETRAINED_OFF = {
    "model.ngram_buckets": 0,
    "optim.adversarial_eps": 0.0,
    "model.init_from": "",
    "model.embeddings_from": "",
    "pretrain.num_epochs": 0,
    "pretrain.max_steps": 0,
}


# What a pretrained encoder's own config.json decides in place of config.model's field.
PRETRAINED_OWN = (
    "model.d_model",
    "model.num_heads",
    "model.num_layers",
    "model.d_ff",
    "model.positions",
    "model.embed_dropout",
    "model.score",
)


# What a checkpoint's tokenizer decides in place of the vocabulary attn would build.
PRETRAINED_TOKENIZER_OWN = ("data.max_vocab", "data.min_freq")
CHECKPOINT_DECIDES = "(the checkpoint's)"  # --print_config's value of those fields


def fine_tunes(config: ml_collections.ConfigDict) -> bool:
    """Whether `config` fine-tunes a checkpoint: model.pretrained is set, or (configs/finetune.py
    before it is) the checkpoint's tokenizer is asked for."""
    return bool(config.model.get("pretrained")) or config.data.get("tokenizer") == "pretrained"


def check_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]) -> None:
    """Command-line overrides a run would silently drop: with model.pretrained, the fields its
    checkpoint decides (PRETRAINED_OWN). `overrides`: flat names, as config_flags records them."""
    if not config.model.pretrained:
        return
    dropped = sorted(name for name in overrides if name in PRETRAINED_OWN)
    if dropped:
        raise UserError(
            f"{', '.join(dropped)}: with model.pretrained the checkpoint's config.json decides "
            "these; model.pretrained_layers=N keeps its first N layers"
        )


def check_pretrained(config: ml_collections.ConfigDict) -> None:
    """model.pretrained's settings: every field it cannot honour is named, in one line."""
    faults = [
        f"{name}={_get(config, name)!r} (set {off!r})"
        for name, off in PRETRAINED_OFF.items()
        if _get(config, name) != off
    ]
    if config.model.pooling not in ("cls", "mean"):
        faults.append(f"model.pooling={config.model.pooling!r} (cls or mean)")
    if config.data.tokenizer != "pretrained":
        faults.append(f"data.tokenizer={config.data.tokenizer!r} (set 'pretrained')")
    if faults:
        raise UserError(
            "model.pretrained fine-tunes a pretrained encoder, which does not support "
            f"{'; '.join(faults)}: start from configs/finetune.py"
        )


def model_config(
    config: ml_collections.ConfigDict, vocab_size: int, num_classes: int
) -> classifier.ModelConfig:
    """The frozen model config: `config.model` plus what the data decides."""
    fields = {k: v for k, v in config.model.to_dict().items() if k not in run_fields()}
    try:
        return classifier.ModelConfig(
            vocab_size=vocab_size, num_classes=num_classes, max_len=config.data.max_len, **fields
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"config.model: {e}") from None


def check_model(config: ml_collections.ConfigDict) -> None:
    """config.model's mistakes before any data is read: the vocabulary, the classes and a length
    left to the data are stood in for by valid values."""
    probe = {"model": config.model.to_dict(), "data": {"max_len": max(config.data.max_len, 1)}}
    model_config(ml_collections.ConfigDict(probe), vocab_size=4, num_classes=2)


def describe(config: ml_collections.ConfigDict) -> str:
    """Every field as `section.field = value  # meaning`, one per line, overrides applied; for a
    fine-tune, the fields the checkpoint decides say so instead of a value that does not apply."""
    own = set(PRETRAINED_OWN + PRETRAINED_TOKENIZER_OWN) if fine_tunes(config) else set()
    rows = [
        (name, CHECKPOINT_DECIDES if name in own else repr(value))
        for name, value in flat(config.to_dict()).items()
    ]
    width = max(len(name) + len(value) for name, value in rows) + 4  # " = " and a space
    return "\n".join(
        f"{f'{name} = {value}':<{width}}# {FIELDS[name].meaning if name in FIELDS else ''}".rstrip()
        for name, value in rows
    )


def complete(saved: dict) -> dict:
    """A config saved as JSON, with the fields it predates set as its run used them."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    for name, f in FIELDS.items():
        section, field = name.split(".")
        if f.before is not _NONE and section in out:
            out[section].setdefault(field, f.before)
    return out


def compared_on_resume(name: str) -> bool:
    """Whether a resumed run must keep field `name` as config.json has it (the model's fields are
    the checkpoint's to compare; a field without a row, e.g. a removed one, is not compared)."""
    f = FIELDS.get(name)
    return f is not None and f.resume == SAME


def flat(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _get(config: Any, name: str, default: Any = None) -> Any:
    section, field = name.split(".")
    if section not in config or field not in config[section]:
        return default
    return config[section][field]
