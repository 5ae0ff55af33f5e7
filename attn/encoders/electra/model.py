"""The ELECTRA encoder (the discriminator's, and the generator's body) as pure functions: BERT's
embeddings at their own width X = embedding_size, projected to the model width D when the two
differ, then BERT's post-LayerNorm blocks (`attn.encoders.blocks`); its checkpoint rules are
`attn.encoders.electra.checkpoint`.

    e = Dropout(LN(word[ids] + position[0..L-1] + type[types]))  [B, L, X]
    x = e W_p + b_p  if X != D, else e                             [B, L, D] embeddings_project
    x = LN(x + Dropout(MHA(x)))                                    each of num_layers blocks,
    x = LN(x + Dropout(W2 GELU(W1 x)))                             post-LayerNorm, exact GELU

The attention is BERT's (scaled_dot over padding-masked keys), so any attn implementation runs
it ("matrix", "chunked" with memory linear in L, "xla").

Params (plain dicts, float32):
    {"embed": {"tokens": [V, X], "positions": [P, X], "types": [T, X], "ln": layer norm [X],
               "project": dense X->D, only if X != D},
     "layer_0" ... "layer_{n-1}": the blocks (`attn.encoders.blocks`)}
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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
    a jit static argument. Defaults are electra-base-discriminator's."""

    vocab_size: int = 30522
    d_model: int = 768  # hidden_size
    embedding_size: int = 768  # embedding_size: the tables' width X, projected to D if X != D
    num_layers: int = 12  # num_hidden_layers
    num_heads: int = 12  # num_attention_heads
    d_ff: int = 3072  # intermediate_size
    max_positions: int = 512  # max_position_embeddings
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1  # hidden_dropout_prob: embeddings, attention output, feed-forward
    attention_dropout: float = 0.1  # attention_probs_dropout_prob: on the attention weights
    pad_id: int = 0  # pad_token_id
    initializer_range: float = 0.02  # init's stddev
    dtype: str = "float32"  # compute dtype: "float32" | "bfloat16"; params stay float32

    def __post_init__(self):
        for name in (
            "vocab_size",
            "d_model",
            "embedding_size",
            "num_heads",
            "d_ff",
            "max_positions",
            "type_vocab_size",
        ):
            fields.integer(self, name, 1)
        for name in ("num_layers", "pad_id"):
            fields.integer(self, name, 0)
        fields.divisible(self, "d_model", "num_heads")
        fields.real(self, "layer_norm_eps", 0.0, math.inf)
        fields.real(self, "dropout", 0.0, 1.0)
        fields.real(self, "attention_dropout", 0.0, 1.0)
        fields.real(self, "initializer_range", 0.0, math.inf)
        fields.choice(self, "dtype", sorted(DTYPES))

    @property
    def projected(self) -> bool:
        """Whether the embeddings are projected to d_model (embedding_size != d_model)."""
        return self.embedding_size != self.d_model

    @property
    def max_length(self) -> int:
        """The longest input: one position row per token."""
        return self.max_positions


def init(key: jax.Array, cfg: Config) -> dict:
    """Random float32 params (layout in the module docstring): tables and the projection's
    weight ~ N(0, initializer_range²), biases 0, LayerNorm 1 and 0, the blocks as
    `attn.encoders.blocks.init` draws them."""
    x, std = cfg.embedding_size, cfg.initializer_range

    def normal(k: jax.Array, *shape: int) -> jax.Array:
        return std * jax.random.normal(k, shape, jnp.float32)

    k_tok, k_pos, k_type, k_proj, k_layers = jax.random.split(key, 5)
    embed_params = {
        "tokens": normal(k_tok, cfg.vocab_size, x),
        "positions": normal(k_pos, cfg.max_positions, x),
        "types": normal(k_type, cfg.type_vocab_size, x),
        "ln": layers.layer_norm_init(x),
    }
    if cfg.projected:
        embed_params["project"] = {
            "w": normal(k_proj, x, cfg.d_model),
            "b": jnp.zeros((cfg.d_model,), jnp.float32),
        }
    return {"embed": embed_params, **blocks.init(k_layers, cfg, layer_keys(cfg))}


def _check_inputs(
    params: dict, cfg: Config, ids_BxL: Any, mask_BxL: Any, types_BxL: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The inputs as arrays (`family.checked_inputs`), for params that fit cfg; ValueError in one
    line for what cannot work (at trace time), concrete token types outside the table among
    them."""
    ids_BxL, mask_BxL, types_BxL = checked_inputs(cfg, ids_BxL, mask_BxL, types_BxL)
    if not isinstance(types_BxL, jax.core.Tracer):
        bad = np.asarray(types_BxL)
        bad = bad[(bad < 0) | (bad >= cfg.type_vocab_size)]
        if bad.size:
            raise ValueError(
                f"token type {int(bad[0])} is outside the types [0, {cfg.type_vocab_size})"
            )
    e = params["embed"]
    table = e["tokens"].shape
    layers_ = sum(k.startswith("layer_") for k in params)
    if (
        table != (cfg.vocab_size, cfg.embedding_size)
        or layers_ != cfg.num_layers
        or ("project" in e) != cfg.projected
    ):
        raise ValueError(
            f"params do not fit the config: embed.tokens is {table} and "
            f"{'has' if 'project' in e else 'has no'} projection, config says "
            f"({cfg.vocab_size}, {cfg.embedding_size}) projected to {cfg.d_model} and "
            f"{cfg.num_layers} layers (params have {layers_})"
        )
    return ids_BxL, mask_BxL, types_BxL


def input_embeddings(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
) -> jax.Array:
    """LN(word + position + token type) [B, L, X] float32 (X = embedding_size; token i at position
    i): the embeddings before dropout and the projection, what gradient × input attributes to (taken
    before the normalisation it would be 0: a LayerNorm ignores its input's scale). An id or a token
    type outside its table is refused when concrete and gives NaN under jit (`family.lookup`)."""
    ids_BxL, _, types_BxL = _check_inputs(params, cfg, ids_BxL, mask_BxL, types_BxL)
    e = params["embed"]
    x_BxLxX = lookup(e["tokens"], ids_BxL) + e["positions"][: ids_BxL.shape[1]]
    x_BxLxX = x_BxLxX + lookup(e["types"], types_BxL)
    return layers.layer_norm(e["ln"], x_BxLxX, cfg.layer_norm_eps)


def embed(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    delta_BxLxX: jax.Array | None = None,
) -> jax.Array:
    """Dropout(`input_embeddings` + delta_BxLxX, if given), projected to d_model when
    embedding_size differs -> [B, L, D] in cfg.dtype (summed and normalised in float32). As in
    transformers, dropout acts before the projection."""
    x_BxLxX = input_embeddings(params, cfg, ids_BxL, mask_BxL, types_BxL)
    if delta_BxLxX is not None:
        x_BxLxX = x_BxLxX + delta_BxLxX
    e = params["embed"]
    x_BxLxX = layers.dropout(x_BxLxX.astype(DTYPES[cfg.dtype]), cfg.dropout, train=train, rng=rng)
    return layers.dense(e["project"], x_BxLxX) if cfg.projected else x_BxLxX


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
    """Token ids [B, L], mask [B, L] (bool, True = real token) and token types [B, L] (default
    0) -> the last hidden states [B, L, D] in cfg.dtype; with return_weights, (those states, each
    layer's attention weights [B, H, L, L] float32 before dropout, or None per layer when the
    implementation does not form them).

    attend, train and rng as `attn.encoders.bert.model.encode` takes them (attention dropout
    needs the "matrix" implementation; with another set the config's attention_dropout to 0).
    embed_delta_BxLxD, if given, is added to the input embeddings after their LayerNorm: it is
    [B, L, embedding_size], the width of `input_embeddings`."""
    embedded = functools.partial(
        embed, params, cfg, ids_BxL, mask_BxL, types_BxL, train=train, delta_BxLxX=embed_delta_BxLxD
    )
    return blocks.encode(
        "electra",
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
    mask [L] (token types 0), as in evaluation, with the matrix form of `score` (the
    checkpoints': scaled_dot). X is the layer's input as it is (post-LayerNorm blocks): for
    layer 0 the embeddings after their LayerNorm and the projection, else the previous block's
    output."""
    return blocks.steps(encode, params, cfg, ids_L, mask_L, layer=layer, score=score)


def steps_input(cfg: Config, layer: int) -> str:
    """What X is in layer `layer`'s step-by-step figure (post-LayerNorm blocks: the input)."""
    if layer > 0:
        return f"X: layer {layer - 1}'s output (after its LayerNorm)"
    embeddings = "X: word + position + token type embeddings after LayerNorm"
    return f"{embeddings}, projected to {cfg.d_model}" if cfg.projected else embeddings
