"""The record of one encoder family: everything the rest of attn and its commands ask of a family,
so that nothing outside the family's own modules tests a config's type.

A family's config is a frozen dataclass (a jit static argument) with at least these fields and
properties, which code outside the family may read:
    vocab_size, d_model, num_layers, num_heads, pad_id, dropout, attention_dropout,
    initializer_range, dtype ("float32" | "bfloat16"), max_length (property: the longest input).
Its params are a dict with "embed" (the embeddings), the blocks' entries and whatever else the
family has. The blocks' entries are those `Family.layer_keys(config)` names, one per depth in
order: "layer_0" ... "layer_{n-1}" (`layer_keys`), or fewer entries that several depths read (a
family that shares one layer across depth, as ALBERT does, names "layer_0" at every depth).
`attn.encoders.first_layers` keeps the first n depths and the entries they read.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn.encoders.heads import Head
from attn.encoders.hub import Rule

__all__ = [
    "PROJECTED_QK",
    "Family",
    "checked_inputs",
    "first_layers",
    "layer_keys",
    "lookup",
    "projected_qk",
]

# Q and K in the step-by-step figure of a layer that projects X and nothing more.
PROJECTED_QK = ("Q = X Wq", "K = X Wk")


def projected_qk(config: Any, layer: int) -> tuple[str, str]:
    """The titles of Q and K of a family whose Q and K are X's projections, in every layer."""
    del config, layer
    return PROJECTED_QK


def layer_keys(config: Any) -> tuple[str, ...]:
    """The params entry each depth reads, in order, of a family with one layer per depth:
    "layer_0" ... "layer_{num_layers-1}"."""
    return tuple(f"layer_{i}" for i in range(config.num_layers))


@dataclasses.dataclass(frozen=True)
class Family:
    """One encoder family.

    name: what a workdir records of a model built on it ("bert", "distilbert", ...).
    model_types: config.json "model_type" values it reads; architectures: the config.json
      "architectures" whose encoder it reads (the bare encoder and the task models; `load`
      skips their heads, `attn.encoder_classifier.load` reads a sequence classifier's).
    config: its config dataclass; from_hf(config.json, stored names, where) -> config, raising
      `CheckpointError` for what the family cannot compute (stored names: the checkpoint's
      tensors, prefixes stripped, for what config.json leaves out, e.g. whether a pooler exists);
      to_hf(config) -> the config.json keys from_hf reads, so a checkpoint written with them
      reads back as `config` (its dtype aside).
    prefixes: what task models put before the encoder's tensor names ("bert.", "roberta.", ...).
    rules(config) -> {stored name: (Rule, ...)}: every encoder tensor (`attn.encoders.hub`).
    skip(name) -> bool: stored tensors that are no part of the encoder (buffers, task heads).
    init(key, config) -> params; encode(params, config, ids_BxL, mask_BxL, types_BxL=None, *,
      attend, train, rng, return_weights, embed_delta_BxLxD) -> hidden [B, L, D] (and each
      layer's attention weights [B, H, L, L] or None with return_weights);
      input_embeddings(params, config, ids_BxL, mask_BxL) -> [B, L, D] float32, what
      embed_delta_BxLxD is added to (gradient × input attributes to it);
      attention_steps(params, config, ids_L, mask_L, *, layer) -> `attn.multihead.Steps`.
    head: its ...ForSequenceClassification head (`attn.encoders.heads.Head`): what "cls"
      pooling computes, its params and the names that class stores them under.
    score: the name of the score its attention computes (`attn.scores`), for figures.
    steps_input(config, layer) -> what X is in the step-by-step figure of `layer`.
    steps_qk(config, layer) -> the titles of Q and K in that figure: what `attention_steps`
      returns as Q and K (X's projections, or those transformed by position, e.g. rotary).
    unsupported: `attn.attention` implementations its attention cannot run in -> why, in words
      (none by default); `attn.encoder_classifier.Config` refuses them in one line.
    flax_layout: whether transformers had a Flax class for it, whose flax_model.msgpack its
      rules read once the names are PyTorch's (`attn.encoders.weights`); a family without one
      passes over a msgpack file.
    layer_keys(config) -> the params entry each depth reads, in order (`layer_keys`: one entry
      per depth, by default).
    """

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    config: type
    from_hf: Callable[[Mapping[str, Any], frozenset[str], str], Any]
    to_hf: Callable[[Any], dict]
    prefixes: tuple[str, ...]
    rules: Callable[[Any], dict[str, tuple[Rule, ...]]]
    skip: Callable[[str], bool]
    init: Callable[..., dict]
    encode: Callable[..., Any]
    input_embeddings: Callable[..., Any]
    attention_steps: Callable[..., Any]
    head: Head
    score: str
    steps_input: Callable[[Any, int], str]
    steps_qk: Callable[[Any, int], tuple[str, str]] = projected_qk
    unsupported: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    flax_layout: bool = False
    layer_keys: Callable[[Any], tuple[str, ...]] = layer_keys


def first_layers(
    params: dict, cfg: Any, n: int, keys: Callable[[Any], tuple[str, ...]] = layer_keys
) -> tuple[dict, Any]:
    """The encoder of the first n depths: (params without the entries only deeper depths read,
    cfg with num_layers=n), for a family whose depths read the entries `keys` names (its
    `Family.layer_keys`). n=0 keeps the embeddings alone, so encode returns the embedded tokens
    (attention off); the rest (a pooler, a final norm) stays."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 0 <= n <= cfg.num_layers:
        raise ValueError(f"first_layers: n must be an integer in [0, {cfg.num_layers}]; got {n!r}")
    below = dataclasses.replace(cfg, num_layers=int(n))
    deeper = set(keys(cfg)) - set(keys(below))
    return {k: v for k, v in params.items() if k not in deeper}, below


def checked_inputs(
    cfg: Any, ids_BxL: Any, mask_BxL: Any, types_BxL: Any = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(ids, mask, types) as arrays, types 0 when None; ValueError in one line for ids that are
    not integers [B, L], a mask that is not bool [B, L] (True = real token: an int or float mask
    is refused, as attn.dot_product_attention and jax.nn refuse it; pass mask != 0), types not
    integers [B, L], a length over cfg.max_length, or concrete ids outside [0, vocab_size) (traced
    ids cannot be checked: `lookup` turns them into NaN)."""
    ids_BxL = jnp.asarray(ids_BxL)
    if ids_BxL.ndim != 2 or not jnp.issubdtype(ids_BxL.dtype, jnp.integer):
        raise ValueError(
            f"token ids must be an integer array [batch, length]; got {ids_BxL.dtype}"
            f"{list(ids_BxL.shape)}"
        )
    mask_BxL = jnp.asarray(mask_BxL)
    if mask_BxL.shape != ids_BxL.shape or mask_BxL.dtype != jnp.bool_:
        raise ValueError(
            f"mask must be bool of the token ids' shape {ids_BxL.shape} (True = real token; for "
            f"a 1/0 mask pass mask != 0); got {mask_BxL.dtype}{list(mask_BxL.shape)}"
        )
    types_BxL = jnp.zeros(ids_BxL.shape, jnp.int32) if types_BxL is None else jnp.asarray(types_BxL)
    if types_BxL.shape != ids_BxL.shape or not jnp.issubdtype(types_BxL.dtype, jnp.integer):
        raise ValueError(
            f"token types must be integers of the token ids' shape {ids_BxL.shape}; got "
            f"{types_BxL.dtype}{list(types_BxL.shape)}"
        )
    length = ids_BxL.shape[1]
    if length > cfg.max_length:
        raise ValueError(
            f"length {length} is more than the encoder reads: truncate to {cfg.max_length} tokens"
        )
    if not isinstance(ids_BxL, jax.core.Tracer):
        ids = np.asarray(ids_BxL)
        bad = ids[(ids < 0) | (ids >= cfg.vocab_size)]
        if bad.size:
            raise ValueError(
                f"token id {int(bad[0])} is outside the vocabulary [0, {cfg.vocab_size})"
            )
    return ids_BxL, mask_BxL, types_BxL


def lookup(table_VxD: jax.Array, ids_BxL: jax.Array) -> jax.Array:
    """Rows [B, L, D] of an embedding table; an id outside [0, V) gives NaN, so a wrong id is
    loud under jit instead of silently reading the last row (an index is clamped)."""
    v = table_VxD.shape[0]
    inside_BxL = jnp.where(ids_BxL < 0, v, ids_BxL)  # take wraps negative ids; these fill
    return jnp.take(table_VxD, inside_BxL, axis=0, mode="fill", fill_value=jnp.nan)
