"""The BERT encoder (BERT, RoBERTa, XLM-RoBERTa and other checkpoints of its layout) as pure
functions; its checkpoint rules are `attn.encoders.bert.checkpoint`.

    x = LN(word[ids] + position[pos] + type[types])             embeddings
    x = LN(x + Dropout(MHA(x)))                                  each of num_layers blocks,
    x = LN(x + Dropout(W2 GELU(W1 x)))                           post-LayerNorm, exact (erf) GELU

Its blocks are `attn.encoders.blocks`: MHA is `attn.multihead.apply` (q, k, v and output
projections with biases), so any attn score and implementation runs inside: `attn.attention`'s
scaled_dot matrix form reproduces the checkpoints; ``attn.Attention(implementation="chunked")``
serves 512 tokens in memory linear in L. A key that is padding is masked; a sequence with no real
token at all gets attention output 0 (attn's convention) where Hugging Face gives the mean of the
values.

Params (plain dicts, float32):
    {"embed": {"tokens": [V, D], "positions": [P, D], "types": [T, D], "ln": layer norm},
     "layer_0" ... "layer_{n-1}": the blocks (`attn.encoders.blocks`),
     "pooler": dense D->D, if cfg.pooler}
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
    "MODEL_TYPES",
    "Config",
    "attention_steps",
    "embed",
    "encode",
    "init",
    "input_embeddings",
    "pool",
    "positions",
    "steps_input",
]


# config.json model_type values of this architecture.
MODEL_TYPES = ("bert", "roberta", "xlm-roberta")


@dataclasses.dataclass(frozen=True)
class Config:
    """The encoder's sizes (config.json's names in comments); frozen and hashable, so it can be
    a jit static argument. Defaults are bert-base's."""

    vocab_size: int = 30522
    d_model: int = 768  # hidden_size
    num_layers: int = 12  # num_hidden_layers
    num_heads: int = 12  # num_attention_heads
    d_ff: int = 3072  # intermediate_size
    max_positions: int = 512  # max_position_embeddings
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1  # hidden_dropout_prob: embeddings, attention output, feed-forward
    attention_dropout: float = 0.1  # attention_probs_dropout_prob: on the attention weights
    pad_id: int = 0  # pad_token_id
    # 0: token i sits at position i (BERT). > 0: real tokens count from position_offset and
    # padding sits at pad_id (RoBERTa: pad_id + 1, so its tables have max_len + 2 rows).
    position_offset: int = 0
    pooler: bool = True  # the checkpoint has BERT's pooler (tanh dense on the first token)
    initializer_range: float = 0.02  # init's stddev
    dtype: str = "float32"  # compute dtype: "float32" | "bfloat16"; params stay float32
    # config.json's model_type: which classification head its ...ForSequenceClassification has
    # (BERT's pooler, or RoBERTa's dense + tanh head), `attn.encoders.bert.head`.
    model_type: str = "bert"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_positions"):
            fields.integer(self, name, 1)
        for name in ("num_layers", "type_vocab_size", "pad_id", "position_offset"):
            fields.integer(self, name, 0)
        fields.divisible(self, "d_model", "num_heads")
        fields.real(self, "layer_norm_eps", 0.0, math.inf)
        fields.real(self, "dropout", 0.0, 1.0)
        fields.real(self, "attention_dropout", 0.0, 1.0)
        fields.real(self, "initializer_range", 0.0, math.inf)
        fields.flag(self, "pooler")
        fields.choice(self, "dtype", sorted(DTYPES))
        fields.choice(self, "model_type", MODEL_TYPES)

    @property
    def max_length(self) -> int:
        """The longest input: the position table's rows from position_offset on."""
        return self.max_positions - self.position_offset


def _normal(key: jax.Array, std: float, *shape: int) -> jax.Array:
    return std * jax.random.normal(key, shape, jnp.float32)


def _dense(key: jax.Array, d_in: int, d_out: int, std: float) -> dict:
    return {"w": _normal(key, std, d_in, d_out), "b": jnp.zeros((d_out,), jnp.float32)}


def init(key: jax.Array, cfg: Config, *, score: str | scores.Score = "scaled_dot") -> dict:
    """Random float32 params (layout in the module docstring): weights ~ N(0, initializer_range²)
    as BERT draws them, biases 0, LayerNorm 1 and 0. A parameterised score adds its per-head
    params under each layer's "mha" (`attn.multihead.init`); checkpoints hold none."""
    d, std = cfg.d_model, cfg.initializer_range
    k_tok, k_pos, k_type, k_pool, k_layers = jax.random.split(key, 5)
    params: dict[str, Any] = {
        "embed": {
            "tokens": _normal(k_tok, std, cfg.vocab_size, d),
            "positions": _normal(k_pos, std, cfg.max_positions, d),
            "types": _normal(k_type, std, cfg.type_vocab_size, d),
            "ln": layers.layer_norm_init(d),
        }
    }
    params.update(blocks.init(k_layers, cfg, layer_keys(cfg), score=score))
    if cfg.pooler:
        params["pooler"] = _dense(k_pool, d, d, std)
    return params


def positions(cfg: Config, mask_BxL: jax.Array) -> jax.Array:
    """Position ids [B, L] (int32): 0..L-1 (BERT), or with cfg.position_offset > 0 the count of
    real tokens so far from position_offset, padding at pad_id (RoBERTa)."""
    batch, length = mask_BxL.shape
    if cfg.position_offset == 0:
        return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    count_BxL = jnp.cumsum(mask_BxL.astype(jnp.int32), axis=1)
    return jnp.where(mask_BxL, count_BxL - 1 + cfg.position_offset, cfg.pad_id)


def _check_inputs(
    params: dict, cfg: Config, ids_BxL: Any, mask_BxL: Any, types_BxL: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The inputs as arrays (`family.checked_inputs`), and params that fit cfg; ValueError in
    one line for what cannot work (at trace time)."""
    ids_BxL, mask_BxL, types_BxL = checked_inputs(cfg, ids_BxL, mask_BxL, types_BxL)
    table = params["embed"]["tokens"].shape
    layers_ = sum(k.startswith("layer_") for k in params)
    if table != (cfg.vocab_size, cfg.d_model) or layers_ != cfg.num_layers:
        raise ValueError(
            f"params do not fit the config: embed.tokens is {table}, config says "
            f"({cfg.vocab_size}, {cfg.d_model}) and {cfg.num_layers} layers (params have "
            f"{layers_})"
        )
    return ids_BxL, mask_BxL, types_BxL


def input_embeddings(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
) -> jax.Array:
    """LN(word + position + token type) [B, L, D] float32: the first block's input before dropout,
    what gradient × input attributes to (taken before the normalisation it would be 0: a LayerNorm
    ignores its input's scale). An id outside [0, vocab_size) is refused when concrete and gives NaN
    under jit (`family.lookup`)."""
    ids_BxL, mask_BxL, types_BxL = _check_inputs(params, cfg, ids_BxL, mask_BxL, types_BxL)
    e = params["embed"]
    x_BxLxD = lookup(e["tokens"], ids_BxL) + e["positions"][positions(cfg, mask_BxL)]
    x_BxLxD = x_BxLxD + e["types"][types_BxL]
    return layers.layer_norm(e["ln"], x_BxLxD, cfg.layer_norm_eps)


def embed(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    delta_BxLxD: jax.Array | None = None,
) -> jax.Array:
    """`input_embeddings` (+ delta_BxLxD, if given) -> [B, L, D] in cfg.dtype (summed and
    normalised in float32), then dropout in training."""
    x_BxLxD = input_embeddings(params, cfg, ids_BxL, mask_BxL, types_BxL)
    if delta_BxLxD is not None:
        x_BxLxD = x_BxLxD + delta_BxLxD
    return layers.dropout(x_BxLxD.astype(DTYPES[cfg.dtype]), cfg.dropout, train=train, rng=rng)


def encode(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
    *,
    attend: multihead.Attend = attention,
    train: bool = False,
    rng: jax.Array | None = None,
    return_weights: bool = False,
    embed_delta_BxLxD: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, list]:
    """Token ids [B, L], mask [B, L] (bool, True = real token) and token types [B, L] (default 0)
    -> the last hidden states [B, L, D] in cfg.dtype; with return_weights, (those states, each
    layer's attention weights [B, H, L, L] float32 before dropout, or None per layer when the
    implementation does not form them).

    attend: the attention each head runs (`attn.multihead.apply`'s): ``attn.attention`` by
    default; e.g. ``attn.Attention(implementation="chunked")`` for memory linear in L.
    train=True applies cfg.dropout and cfg.attention_dropout and needs rng (attention dropout
    needs the "matrix" implementation; use ``dataclasses.replace(cfg, attention_dropout=0.0)``
    with another one). embed_delta_BxLxD, if given, is added to the input embeddings after their
    LayerNorm (`embed`): gradient × input differentiates with respect to it.
    """
    embedded = functools.partial(
        embed, params, cfg, ids_BxL, mask_BxL, types_BxL, train=train, delta_BxLxD=embed_delta_BxLxD
    )
    return blocks.encode(
        "bert",
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
    mask [L], as in evaluation (no dropout), with the matrix form of `score` (the checkpoints':
    scaled_dot). The blocks are post-LayerNorm, so X is the layer's input as it is: the
    embeddings after their LayerNorm for layer 0, else the previous block's output (which ends
    in a LayerNorm)."""
    return blocks.steps(encode, params, cfg, ids_L, mask_L, layer=layer, score=score)


def pool(params: dict, h_BxLxD: jax.Array) -> jax.Array:
    """BERT's pooler: tanh(dense(first token's state)) -> [B, D] (needs cfg.pooler). Mean
    pooling over real tokens is `attn.pooling.mean_pool` (vmapped)."""
    if "pooler" not in params:
        raise ValueError("these params have no pooler (the checkpoint had none); mean-pool instead")
    return jnp.tanh(layers.dense(params["pooler"], h_BxLxD[:, 0]))


def steps_input(cfg: Config, layer: int) -> str:
    """What X is in layer `layer`'s step-by-step figure (post-LayerNorm blocks: the input)."""
    if layer == 0:
        return "X: word + position + token type embeddings after LayerNorm"
    return f"X: layer {layer - 1}'s output (after its LayerNorm)"
