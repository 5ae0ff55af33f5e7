"""A sentence classifier over a pretrained encoder of any family in `attn.encoders`: encode ->
pool -> the classifier head (`attn.head`), for fine-tuning a checkpoint.

    h = encoders.encode(ids)                  [B, L, D]
    v = pool(h) | mean(h, real)               [B, D]   pooling "cls" (the checkpoint's pooler
                                                       when it has one, else [CLS]'s state) or
                                                       "mean"
    logits = W Dropout(v) + b                 [B, C]
           (+ bag.logits(ids)                 [B, C]   with bag_buckets > 0)

With bag_buckets > 0, the logits of `attn.bag` (a linear model on the bag of hashed n-grams of the
token ids) are added to the head's, as `attn.classifier` adds them to its own: the encoder reads
the text in context, the bag every distinct n-gram of it, however long.

Token ids are attn's: 0 pads, as in every attn batch. They are the checkpoint's ids with its
padding id and 0 exchanged (`to_checkpoint`, an involution), so a checkpoint that pads with
another id (RoBERTa's 1) reads its own ids; for BERT's [PAD] = 0 nothing changes.

Params (plain dicts, float32): {"encoder": the family's params (`attn.encoders.load`), "head":
{"w": [D, C], "b": [C]}, "bag": [bag_buckets, C] if bag_buckets}.

`apply`, `embed` and `attention_steps` have `attn.classifier`'s signatures (and `apply` its
aux), so one train step, evaluation, the pictures and `attn.importance` serve both models.
"""

import dataclasses
import functools
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from attn import bag, encoders, head, multihead, pooling
from attn.attention import IMPLEMENTATIONS, Attention

__all__ = [
    "PAD",
    "POOLINGS",
    "Config",
    "apply",
    "attend",
    "attention_steps",
    "bag_ids",
    "embed",
    "init",
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
    pooling: str = "mean"  # "cls" (the pooler when the checkpoint has one, else [CLS]) | "mean"
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


def init(key: jax.Array, cfg: Config) -> dict:
    """Random params: the family's encoder and a head ~ N(0, initializer_range²), bias 0 (as
    ...ForSequenceClassification draws it), and the bag's table 0 when bag_buckets > 0.
    Fine-tuning puts a checkpoint's encoder in."""
    k_enc, k_head = jax.random.split(key)
    e = cfg.encoder
    params = {"encoder": encoders.init(k_enc, e)}
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
    """The input embeddings [B, L, D] float32 of token ids [B, L], before anything normalises
    them: what embed_delta_BxLxD is added to (the family's `input_embeddings`)."""
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
    embed_delta_BxLxD, if given, is added to the input embeddings (`embed`) before they are
    normalised."""
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
    if cfg.pooling == "mean":
        v_BxD = jax.vmap(pooling.mean_pool)(h_BxLxD, mask_BxL)
    else:
        v_BxD = fam.pool(params["encoder"], h_BxLxD)
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
