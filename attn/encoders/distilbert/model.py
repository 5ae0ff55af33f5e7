"""The DistilBERT encoder as pure functions: BERT's post-LayerNorm blocks
(`attn.encoders.blocks`) over its own embeddings, which have no token types; its checkpoint rules
are `attn.encoders.distilbert.checkpoint`.

    x = LN(word[ids] + position[0..L-1])                         embeddings
    x = LN(x + Dropout(MHA(x)))                                  each of num_layers blocks,
    x = LN(x + Dropout(W2 GELU(W1 x)))                           post-LayerNorm, exact (erf) GELU

Every LayerNorm's eps is 1e-12, fixed by the architecture (config.json has no such option).
DistilBERT divides q by sqrt(D / H) before q·k and attn's scaled_dot divides the product: the same
score up to float32 rounding, so any attn implementation runs it ("matrix", "chunked" with memory
linear in L, "xla"). A padding key is masked, as in BERT.

Params (plain dicts, float32): BERT's without token types and pooler,
    {"embed": {"tokens": [V, D], "positions": [P, D], "ln": layer norm},
     "layer_0" ... "layer_{n-1}": the blocks (`attn.encoders.blocks`)}
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from attn import layers, multihead, scores
from attn.attention import attention
from attn.classifier import DTYPES
from attn.encoders import blocks, fields
from attn.encoders.family import checked_inputs, layer_keys, lookup

__all__ = [
    "Config",
    "attention_steps",
    "embed",
    "encode",
    "init",
    "input_embeddings",
    "steps_input",
]


@dataclasses.dataclass(frozen=True)
class Config:
    """The encoder's sizes (config.json's names in comments); frozen and hashable, so it can be
    a jit static argument. Defaults are distilbert-base-uncased's."""

    vocab_size: int = 30522
    d_model: int = 768  # dim
    num_layers: int = 6  # n_layers
    num_heads: int = 12  # n_heads
    d_ff: int = 3072  # hidden_dim
    max_positions: int = 512  # max_position_embeddings
    dropout: float = 0.1  # dropout: embeddings, attention output, feed-forward
    attention_dropout: float = 0.1  # attention_dropout: on the attention weights
    pad_id: int = 0  # pad_token_id
    initializer_range: float = 0.02  # init's stddev
    dtype: str = "float32"  # compute dtype: "float32" | "bfloat16"; params stay float32

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_positions"):
            fields.integer(self, name, 1)
        for name in ("num_layers", "pad_id"):
            fields.integer(self, name, 0)
        fields.divisible(self, "d_model", "num_heads")
        fields.real(self, "dropout", 0.0, 1.0)
        fields.real(self, "attention_dropout", 0.0, 1.0)
        fields.real(self, "initializer_range", 0.0, math.inf)
        fields.choice(self, "dtype", sorted(DTYPES))

    @property
    def layer_norm_eps(self) -> float:
        """Every LayerNorm's eps: DistilBERT's modules fix it at 1e-12."""
        return 1e-12

    @property
    def max_length(self) -> int:
        """The longest input: one position row per token."""
        return self.max_positions


def init(key: jax.Array, cfg: Config) -> dict:
    """Random float32 params (layout in the module docstring): tables ~ N(0, initializer_range²),
    the blocks as `attn.encoders.blocks.init` draws them, LayerNorm 1 and 0."""
    std = cfg.initializer_range
    k_tok, k_pos, k_layers = jax.random.split(key, 3)
    embed_params = {
        "tokens": std * jax.random.normal(k_tok, (cfg.vocab_size, cfg.d_model), jnp.float32),
        "positions": std * jax.random.normal(k_pos, (cfg.max_positions, cfg.d_model), jnp.float32),
        "ln": layers.layer_norm_init(cfg.d_model),
    }
    return {"embed": embed_params, **blocks.init(k_layers, cfg, layer_keys(cfg))}


def _check_inputs(
    params: dict, cfg: Config, ids_BxL: Any, mask_BxL: Any, types_BxL: Any
) -> tuple[jax.Array, jax.Array]:
    """(ids, mask) as arrays (`family.checked_inputs`), for params that fit cfg; ValueError in one
    line for what cannot work (at trace time), token types among them."""
    if types_BxL is not None:
        raise ValueError("DistilBERT has no token types: pass types_BxL=None")
    ids_BxL, mask_BxL, _ = checked_inputs(cfg, ids_BxL, mask_BxL)
    table = params["embed"]["tokens"].shape
    layers_ = sum(k.startswith("layer_") for k in params)
    if table != (cfg.vocab_size, cfg.d_model) or layers_ != cfg.num_layers:
        raise ValueError(
            f"params do not fit the config: embed.tokens is {table}, config says "
            f"({cfg.vocab_size}, {cfg.d_model}) and {cfg.num_layers} layers (params have "
            f"{layers_})"
        )
    return ids_BxL, mask_BxL


def input_embeddings(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: None = None,
) -> jax.Array:
    """LN(word + position) [B, L, D] float32 (token i at position i, padding or not): the first
    block's input before dropout, what gradient × input attributes to (taken before the
    normalisation it would be 0: a LayerNorm ignores its input's scale). An id outside [0,
    vocab_size) is refused when concrete and gives NaN under jit (`family.lookup`)."""
    ids_BxL, _ = _check_inputs(params, cfg, ids_BxL, mask_BxL, types_BxL)
    e = params["embed"]
    x_BxLxD = lookup(e["tokens"], ids_BxL) + e["positions"][: ids_BxL.shape[1]]
    return layers.layer_norm(e["ln"], x_BxLxD, cfg.layer_norm_eps)


def embed(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    delta_BxLxD: jax.Array | None = None,
) -> jax.Array:
    """`input_embeddings` (+ delta_BxLxD, if given) -> [B, L, D] in cfg.dtype (summed and
    normalised in float32), then dropout in training."""
    x_BxLxD = input_embeddings(params, cfg, ids_BxL, mask_BxL)
    if delta_BxLxD is not None:
        x_BxLxD = x_BxLxD + delta_BxLxD
    return layers.dropout(x_BxLxD.astype(DTYPES[cfg.dtype]), cfg.dropout, train=train, rng=rng)


def encode(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: None = None,
    *,
    attend: multihead.Attend = attention,
    train: bool = False,
    rng: jax.Array | None = None,
    return_weights: bool = False,
    embed_delta_BxLxD: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, list]:
    """Token ids [B, L] and mask [B, L] (bool, True = real token) -> the last hidden states
    [B, L, D] in cfg.dtype; with return_weights, (those states, each layer's attention weights
    [B, H, L, L] float32 before dropout, or None per layer when the implementation does not form
    them). types_BxL must be None: DistilBERT has no token types.

    attend, train, rng and embed_delta_BxLxD as `attn.encoders.bert.model.encode` takes them
    (attention dropout needs the "matrix" implementation; with another set the config's
    attention_dropout to 0)."""
    ids_BxL, mask_BxL = _check_inputs(params, cfg, ids_BxL, mask_BxL, types_BxL)
    embedded = functools.partial(
        embed, params, cfg, ids_BxL, mask_BxL, train=train, delta_BxLxD=embed_delta_BxLxD
    )
    return blocks.encode(
        "distilbert",
        embedded,
        params,
        cfg,
        mask_BxL,
        layer_keys(cfg),
        train=train,
        rng=rng,
        return_weights=return_weights,
        attend=attend,
    )


def attention_steps(
    params: dict,
    cfg: Config,
    ids_L: jax.Array,
    mask_L: jax.Array,
    *,
    layer: int = 0,
    score: str | scores.Score = "scaled_dot",
) -> multihead.Steps:
    """Step-by-step values of layer `layer`'s self-attention on one sequence of ids [L] with bool
    mask [L], as in evaluation, with the matrix form of `score` (the checkpoints': scaled_dot).
    X is the layer's input as it is (post-LayerNorm blocks): the embeddings after their
    LayerNorm for layer 0, else the previous block's output."""
    return blocks.steps(encode, params, cfg, ids_L, mask_L, layer=layer, score=score)


def steps_input(cfg: Config, layer: int) -> str:
    """What X is in layer `layer`'s step-by-step figure (post-LayerNorm blocks: the input)."""
    if layer == 0:
        return "X: word + position embeddings after LayerNorm"
    return f"X: layer {layer - 1}'s output (after its LayerNorm)"
