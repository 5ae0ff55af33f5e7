"""A sentence classifier over a pretrained encoder of any family in `attn.encoders`: encode ->
pool -> the classifier head (`attn.head`), for fine-tuning a checkpoint or serving a fine-tuned
one.

    h = encoders.encode(ids)                  [B, L, D]
    v = family head(h) | mean(h, real)        [B, D]   pooling "cls": the family's own
                                                       ...ForSequenceClassification head
                                                       (`attn.encoders.heads`: BERT's pooler,
                                                       RoBERTa's dense + tanh, ...); "mean":
                                                       the mean over real tokens (ModernBERT's
                                                       head reads that mean, its
                                                       classifier_pooling "mean")
    logits = W Dropout(v) + b                 [B, C]   the class's final linear layer
           (+ bag.logits(ids)                 [B, C]   with bag_buckets > 0)

So a fine-tune with pooling "cls" (and ModernBERT's with either) is the family's transformers
classifier, tensor for tensor: `load` reads such a checkpoint, head included, and
`checkpoint_tensors` writes one. A mean-pooled classifier of another family is
`attn.encoders.heads.MEAN_POOLED` (base model, masked mean, dropout, `classifier`).

With bag_buckets > 0, the logits of `attn.bag` (a linear model on the bag of hashed n-grams of the
token ids) are added to the head's, as `attn.classifier` adds them to its own: the encoder reads
the text in context, the bag every distinct n-gram of it, however long.

Token ids are attn's: 0 pads, as in every attn batch. They are the checkpoint's ids with its
padding id and 0 exchanged (`to_checkpoint`, an involution), so a checkpoint that pads with
another id (RoBERTa's 1) reads its own ids; for BERT's [PAD] = 0 nothing changes.

Params (plain dicts, float32): {"encoder": the family's params (`attn.encoders.load`), "pool": the
family head's own params, when it has any (RoBERTa's dense layer, ...), "head": {"w": [D, C],
"b": [C]}, "bag": [bag_buckets, C] if bag_buckets}.

`apply`, `embed` and `attention_steps` have `attn.classifier`'s signatures (and `apply` its
aux), so one train step, evaluation, the pictures and `attn.importance` serve both models.
"""

import dataclasses
import functools
import numbers
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn import bag, encoders, head, multihead, pooling
from attn.attention import IMPLEMENTATIONS, Attention
from attn.encoders import heads, hub

__all__ = [
    "PAD",
    "POOLINGS",
    "Config",
    "apply",
    "architecture",
    "attend",
    "attention_steps",
    "bag_ids",
    "checkpoint_rules",
    "checkpoint_tensors",
    "embed",
    "init",
    "load",
    "stored_pool",
    "to_checkpoint",
]

PAD = 0
POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class Config:
    """The encoder's config (any family's) and the classifier's own fields; frozen and hashable
    (a jit static argument)."""

    encoder: Any
    num_classes: int = 2
    max_len: int = 512  # tokens per text, special tokens included
    pooling: str = "mean"  # "cls" (the family's classification head) | "mean"
    dropout: float = 0.1  # on the pooled vector
    implementation: str = "matrix"  # attention's: "matrix" | "chunked" | "xla"
    bag_buckets: int = 0  # >0 adds the logits of a linear model on the bag of hashed n-grams
    bag_orders: tuple[int, ...] = (1, 2)
    bag_dropout: float = 0.0  # drops whole n-grams from the bag in training

    def __post_init__(self):
        try:
            encoders.family(self.encoder)
        except ValueError as e:
            raise ValueError(f"Config.encoder: {e}") from None
        for name, lo in (("num_classes", 2), ("max_len", 1), ("bag_buckets", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
                raise ValueError(f"Config.{name} must be an integer >= {lo}; got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.max_len > self.encoder.max_length:
            raise ValueError(
                f"Config.max_len={self.max_len} is longer than the encoder reads: at most "
                f"{self.encoder.max_length} tokens"
            )
        if self.pooling not in POOLINGS:
            raise ValueError(f"Config.pooling must be one of {POOLINGS}; got {self.pooling!r}")
        for name in ("dropout", "bag_dropout"):
            d = getattr(self, name)
            if isinstance(d, bool) or not isinstance(d, numbers.Real) or not 0.0 <= d < 1.0:
                raise ValueError(f"Config.{name} must be a float in [0, 1); got {d!r}")
            object.__setattr__(self, name, float(d))
        orders = bag.checked_orders(self.bag_orders, "Config.bag_orders", self.bag_buckets > 0)
        object.__setattr__(self, "bag_orders", orders)
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"Config.implementation must be one of {IMPLEMENTATIONS}; got "
                f"{self.implementation!r}"
            )
        fam = encoders.family(self.encoder)
        why = fam.unsupported.get(self.implementation)
        if why:
            raise ValueError(
                f"Config.implementation {self.implementation!r} cannot run the {fam.name} "
                f"encoder: {why}"
            )
        if self.implementation != "matrix" and self.encoder.attention_dropout > 0.0:
            raise ValueError(
                f"attention dropout needs implementation 'matrix'; with {self.implementation!r} "
                "set the encoder's attention_dropout to 0"
            )


@functools.lru_cache(maxsize=8)
def attend(implementation: str) -> Attention:
    """Each layer's attention in `implementation`; the family sets the score its checkpoints
    compute."""
    return Attention(implementation=implementation)


def to_checkpoint(tokens_BxL: jax.Array, pad_id: int) -> jax.Array:
    """attn's ids (0 = padding) -> the checkpoint's, and back: 0 and pad_id exchanged."""
    if pad_id == PAD:
        return tokens_BxL
    return jnp.where(tokens_BxL == PAD, pad_id, jnp.where(tokens_BxL == pad_id, PAD, tokens_BxL))


def _family_head(cfg: Config) -> heads.Head | None:
    """The family's head when the pooling is one it computes; None for attn's plain mean."""
    h = encoders.family(cfg.encoder).head
    return h if cfg.pooling in h.poolings else None


def init(key: jax.Array, cfg: Config) -> dict:
    """Random params: the family's encoder, its head's own params ("pool", as the family draws
    them) and a final layer ~ N(0, initializer_range²), bias 0 (as ...ForSequenceClassification
    draws it), and the bag's table 0 when bag_buckets > 0. Fine-tuning puts a checkpoint's
    encoder in (and its head's params, `stored_pool`, when it has them)."""
    k_enc, k_head = jax.random.split(key)
    e = cfg.encoder
    params = {"encoder": encoders.init(k_enc, e)}
    family_head = _family_head(cfg)
    pool = family_head.init(jax.random.fold_in(key, 1), e, cfg.pooling) if family_head else {}
    if pool:
        params["pool"] = pool
    params.update(
        head.init(
            k_head,
            e.d_model,
            cfg.num_classes,
            bag_buckets=cfg.bag_buckets,
            std=e.initializer_range,
        )
    )
    return params


def bag_ids(tokens_BxL: jax.Array, cfg: Config) -> jax.Array:
    """The bag's bucket ids [len(bag_orders), B, L] of token ids [B, L] (`bag.ngram_buckets`)."""
    return bag.ngram_buckets(tokens_BxL, cfg.bag_orders, cfg.bag_buckets)


def embed(params: dict, tokens_BxL: jax.Array, cfg: Config) -> jax.Array:
    """The input embeddings [B, L, D] float32 of token ids [B, L]: the first block's input
    before dropout, what embed_delta_BxLxD is added to and gradient × input attributes to (the
    family's `input_embeddings`)."""
    tokens_BxL = jnp.asarray(tokens_BxL)
    fam = encoders.family(cfg.encoder)
    ids_BxL = to_checkpoint(tokens_BxL, cfg.encoder.pad_id)
    return fam.input_embeddings(params["encoder"], cfg.encoder, ids_BxL, tokens_BxL != PAD)


def attention_steps(
    params: dict, tokens_L: jax.Array, cfg: Config, *, layer: int = 0
) -> multihead.Steps:
    """Layer `layer`'s self-attention on one sequence of ids [L] step by step, PAD keys masked
    (the family's `attention_steps`)."""
    tokens_L = jnp.asarray(tokens_L)
    fam = encoders.family(cfg.encoder)
    ids_L = to_checkpoint(tokens_L, cfg.encoder.pad_id)
    return fam.attention_steps(params["encoder"], cfg.encoder, ids_L, tokens_L != PAD, layer=layer)


def apply(
    params: dict,
    tokens_BxL: jax.Array,
    cfg: Config,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    embed_delta_BxLxD: jax.Array | None = None,
    bag_tokens_BxG: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
    """Int token ids [B, L] (0 = padding) -> (logits [B, C] float32, aux) with
    `attn.classifier.apply`'s aux: {"attention": per-layer [B, H, L, L] or None, "pool_weights":
    None, "penalty": 0}.

    bag_tokens_BxG, if given, is what the bag reads instead of tokens_BxL (more of each text,
    G >= L); without a bag it is ignored, as `attn.classifier.apply` ignores it.
    embed_delta_BxLxD, if given, is added to the input embeddings (`embed`)."""
    if train and rng is None:
        raise ValueError("encoder_classifier: train=True needs an rng key for dropout; got None")
    tokens_BxL = jnp.asarray(tokens_BxL)
    mask_BxL = tokens_BxL != PAD
    fam = encoders.family(cfg.encoder)
    r_enc, r_pool = jax.random.split(rng) if train else (None, None)
    h_BxLxD, weights = fam.encode(
        params["encoder"],
        cfg.encoder,
        to_checkpoint(tokens_BxL, cfg.encoder.pad_id),
        mask_BxL,
        attend=attend(cfg.implementation),
        train=train,
        rng=r_enc,
        return_weights=True,
        embed_delta_BxLxD=embed_delta_BxLxD,
    )
    family_head = _family_head(cfg)
    if family_head is None:
        v_BxD = jax.vmap(pooling.mean_pool)(h_BxLxD, mask_BxL)
    else:
        v_BxD = family_head.apply(
            params.get("pool", {}),
            params["encoder"],
            cfg.encoder,
            h_BxLxD,
            mask_BxL,
            cfg.pooling,
            dropout=cfg.dropout,
            train=train,
            rng=r_pool,
        )
    read_BxG = tokens_BxL if bag_tokens_BxG is None else jnp.asarray(bag_tokens_BxG)
    logits_BxC = head.logits(
        params,
        v_BxD,
        dropout=cfg.dropout,
        train=train,
        rng_pool=r_pool,
        bag_ids_OxBxG=bag_ids(read_BxG, cfg) if cfg.bag_buckets else None,
        bag_mask_BxG=read_BxG != PAD,
        bag_dropout=cfg.bag_dropout,
        rng_bag=rng,
    )
    return logits_BxC, head.aux(weights)


def architecture(cfg: Config) -> str:
    """The transformers class that computes `cfg`: the family's ...ForSequenceClassification
    for a pooling its head computes, else `heads.MEAN_POOLED`."""
    family_head = _family_head(cfg)
    if family_head is None:
        return heads.MEAN_POOLED
    return family_head.classes(cfg.encoder).classifier


def checkpoint_rules(cfg: Config) -> dict[str, tuple[hub.Rule, ...]]:
    """Stored name -> where its values go in the params, for every tensor of that class's
    checkpoint: the encoder's under the family's prefix (as the class holds it: RoBERTa's without
    a pooler), the family head's, and the final linear layer (`classifier` in MEAN_POOLED)."""
    fam = encoders.family(cfg.encoder)
    prefix = fam.head.classes(cfg.encoder).prefix
    out = heads.under(prefix, fam.rules(fam.head.encoder(cfg.encoder, cfg.pooling)))
    family_head = _family_head(cfg)
    out.update(
        heads.final_linear("classifier")
        if family_head is None
        else family_head.rules(cfg.encoder, cfg.pooling)
    )
    return out


def checkpoint_tensors(params: dict, cfg: Config) -> dict[str, np.ndarray]:
    """The tensors of `architecture(cfg)`'s checkpoint that computes these params (float32, as
    transformers stores them); ValueError for a model with a bag, which no transformers class
    has."""
    if cfg.bag_buckets:
        raise ValueError(
            "a classifier with a bag (bag_buckets > 0) has no transformers class: its n-gram "
            "logits would be lost"
        )
    return hub.tensors(params, checkpoint_rules(cfg))


def _labels(hf: dict, where: str) -> tuple[str, ...]:
    """The class names of a classifier's config.json (id2label, else num_labels' LABEL_i);
    CheckpointError for a regression or multi-label head, which softmax does not serve."""
    problem = hf.get("problem_type")
    if problem not in (None, "single_label_classification"):
        raise encoders.CheckpointError(
            f"{where}: problem_type {problem!r} is not served: attn serves single-label "
            "classifiers (a softmax over the classes), not a regression or multi-label head"
        )
    id2label = hf.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            by_id = {int(k): str(v) for k, v in id2label.items()}
        except (TypeError, ValueError):
            raise encoders.CheckpointError(
                f"{where}: config.json's id2label keys are not class ids: {sorted(id2label)}"
            ) from None
        names = tuple(by_id.get(i) for i in range(len(by_id)))
        if None in names:
            raise encoders.CheckpointError(
                f"{where}: config.json's id2label ids are not 0..{len(by_id) - 1}: {sorted(by_id)}"
            )
    else:
        count = hf.get("num_labels", 2)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise encoders.CheckpointError(f"{where}: config.json's num_labels {count!r}")
        names = tuple(f"LABEL_{i}" for i in range(count))
    if len(names) < 2:
        raise encoders.CheckpointError(
            f"{where}: num_labels 1 is a regression head, not served: attn serves classifiers "
            "of at least 2 classes (a softmax over them)"
        )
    return names


def load(path: str | os.PathLike) -> tuple[dict, Config, tuple[str, ...]]:
    """(params, cfg, label names) of a transformers sequence classifier: a directory or hub id
    holding the family's ...ForSequenceClassification (or MEAN_POOLED) with its own head,
    pooling, classes and id2label, ready to serve with no training. Every tensor is placed by
    `checkpoint_rules` (buffers skipped); CheckpointError in one line for any other
    architecture, a regression or multi-label head, a head attn does not compute (an unknown
    option, tensor or shape), and every fault `attn.encoders.load` refuses."""
    ck = encoders.open_checkpoint(path)
    fam, hf, where = ck.family, ck.hf, ck.where
    classes = fam.head.classes(ck.config)
    found = list(hf.get("architectures") or ())
    if found == [classes.classifier]:
        chosen = fam.head.from_hf(hf, where)
    elif found == [heads.MEAN_POOLED]:
        chosen = "mean"
    else:
        raise encoders.CheckpointError(
            f"{where} holds {', '.join(found) or 'no architectures'}, not a sequence classifier "
            f"attn serves ({classes.classifier} or {heads.MEAN_POOLED}); its encoder alone: "
            "attn.encoders.load"
        )
    names = _labels(hf, where)
    enc = fam.head.encoder(ck.config, chosen)
    try:
        cfg = Config(encoder=enc, num_classes=len(names), max_len=enc.max_length, pooling=chosen)
    except ValueError as e:
        raise encoders.CheckpointError(f"{where}: {e}") from None
    rules = checkpoint_rules(cfg)
    skipped = [
        n
        for n in ck.full
        if n not in rules and n.startswith(classes.prefix) and fam.skip(n[len(classes.prefix) :])
    ]
    params = hub.read(ck.directory, ck.tensors, ck.full, rules, skipped, init, cfg)
    return params, cfg, names


def _pool_only(key: jax.Array, cfg: Config) -> dict:
    """{"pool": the family head's params}: the tree `stored_pool` reads."""
    return {"pool": encoders.family(cfg.encoder).head.init(key, cfg.encoder, cfg.pooling)}


def stored_pool(path: str | os.PathLike, cfg: Config) -> dict | None:
    """The family head's params (the classifier's "pool") as the checkpoint at `path` stores
    them (a classifier's head; ModernBERT's masked-LM head, the same module), for a fine-tune to
    start from, as transformers does; None when it stores none of them. CheckpointError when it
    stores some but not all, or of another shape."""
    family_head = _family_head(cfg)
    if family_head is None:
        return None
    rules = {
        n: parts
        for n, parts in family_head.rules(cfg.encoder, cfg.pooling).items()
        if parts[0].path[0] == "pool"
    }
    ck = encoders.open_checkpoint(path)
    have = [n for n in rules if n in ck.full]
    if not have:
        return None
    missing = [n for n in rules if n not in ck.full]
    if missing:
        raise encoders.CheckpointError(
            f"{ck.where}: its classification head is incomplete: it stores {', '.join(have)} "
            f"but not {', '.join(missing)}"
        )
    names = {n: ck.full[n] for n in rules}
    return hub.read(ck.directory, ck.tensors, names, rules, (), _pool_only, cfg)["pool"]
