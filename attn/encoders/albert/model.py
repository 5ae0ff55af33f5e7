"""The ALBERT encoder (Lan et al. 2020, "ALBERT: a lite BERT") as pure functions: BERT's
embeddings at their own width X = embedding_size, projected to the model width D, then one
post-LayerNorm block (`attn.encoders.blocks`) run at every depth with the same params; its
checkpoint rules are `attn.encoders.albert.checkpoint`.

    e = Dropout(LN(word[ids] + position[0..L-1] + type[types]))  [B, L, X]
    x = e W_p + b_p                                                [B, L, D] always, X = D too
    x = LN(x + Dropout(MHA(x)))                                    num_layers times, one layer's
    x = LN(x + W2 act(W1 x))                                       params; act: hidden_act

act is config.json's hidden_act (gelu_new, GELU's tanh form, in the released v2 checkpoints).
ALBERT's layer drops nothing after its feed-forward (transformers' AlbertLayer holds a dropout
it never applies). The attention is BERT's (scaled_dot over padding-masked keys), so any attn
implementation runs it ("matrix", "chunked" with memory linear in L, "xla").

Params (plain dicts, float32): the shared layer is one entry that every depth reads
(`layer_keys`), so the parameter count does not grow with num_layers.
    {"embed": {"tokens": [V, X], "positions": [P, X], "types": [T, X], "ln": layer norm [X],
               "project": dense X->D},
     "layer_0": the block (`attn.encoders.blocks`), if num_layers > 0,
     "pooler": dense D->D, if cfg.pooler}
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
from attn.encoders import blocks, fields, heads
from attn.encoders.family import checked_inputs, lookup

__all__ = [
    "Config",
    "attention_steps",
    "embed",
    "encode",
    "init",
    "input_embeddings",
    "layer_keys",
    "steps_input",
]


@dataclasses.dataclass(frozen=True)
class Config:
    """The encoder's sizes (config.json's names in comments); frozen and hashable, so it can be
    a jit static argument. Defaults are albert-base-v2's."""

    vocab_size: int = 30000
    d_model: int = 768  # hidden_size
    embedding_size: int = 128  # embedding_size: the tables' width X, projected to D
    num_layers: int = 12  # num_hidden_layers: depths, all running the one shared layer
    num_heads: int = 12  # num_attention_heads
    d_ff: int = 3072  # intermediate_size
    max_positions: int = 512  # max_position_embeddings
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.0  # hidden_dropout_prob: embeddings, attention output
    attention_dropout: float = 0.0  # attention_probs_dropout_prob: on the attention weights
    pad_id: int = 0  # pad_token_id
    act: str = "gelu_new"  # hidden_act: the feed-forward's activation
    pooler: bool = True  # the checkpoint has AlbertModel's pooler (tanh dense on the first token)
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
        fields.choice(self, "act", tuple(heads.ACTIVATIONS))
        fields.flag(self, "pooler")
        fields.choice(self, "dtype", sorted(DTYPES))

    @property
    def max_length(self) -> int:
        """The longest input: one position row per token."""
        return self.max_positions


def layer_keys(cfg: Config) -> tuple[str, ...]:
    """The params entry each depth reads: the one shared layer, "layer_0", at every depth."""
    return ("layer_0",) * cfg.num_layers


def init(key: jax.Array, cfg: Config) -> dict:
    """Random float32 params (layout in the module docstring): tables, the projection's and the
    pooler's weights ~ N(0, initializer_range²), biases 0, LayerNorm 1 and 0, the shared layer as
    `attn.encoders.blocks.init` draws a block."""
    x, d, std = cfg.embedding_size, cfg.d_model, cfg.initializer_range

    def normal(k: jax.Array, *shape: int) -> jax.Array:
        return std * jax.random.normal(k, shape, jnp.float32)

    k_tok, k_pos, k_type, k_proj, k_layers, k_pool = jax.random.split(key, 6)
    params: dict[str, Any] = {
        "embed": {
            "tokens": normal(k_tok, cfg.vocab_size, x),
            "positions": normal(k_pos, cfg.max_positions, x),
            "types": normal(k_type, cfg.type_vocab_size, x),
            "ln": layers.layer_norm_init(x),
            "project": {"w": normal(k_proj, x, d), "b": jnp.zeros((d,), jnp.float32)},
        },
        **blocks.init(k_layers, cfg, layer_keys(cfg)),
    }
    if cfg.pooler:
        params["pooler"] = {"w": normal(k_pool, d, d), "b": jnp.zeros((d,), jnp.float32)}
    return params


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
    table = params["embed"]["tokens"].shape
    entries = sorted(k for k in params if k.startswith("layer_"))
    if table != (cfg.vocab_size, cfg.embedding_size) or entries != sorted(set(layer_keys(cfg))):
        raise ValueError(
            f"params do not fit the config: embed.tokens is {table} and the layers {entries}, "
            f"config says ({cfg.vocab_size}, {cfg.embedding_size}) and "
            f"{sorted(set(layer_keys(cfg)))} (one layer shared by {cfg.num_layers} depths)"
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
    i): the embeddings before dropout and the projection, what gradient × input attributes to
    (taken before the normalisation it would be 0: a LayerNorm ignores its input's scale). An id or
    a token type outside its table is refused when concrete and gives NaN under jit
    (`family.lookup`)."""
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
    """Dropout(`input_embeddings` + delta_BxLxX, if given), projected to d_model -> [B, L, D] in
    cfg.dtype (summed and normalised in float32). As in transformers, dropout acts before the
    projection."""
    x_BxLxX = input_embeddings(params, cfg, ids_BxL, mask_BxL, types_BxL)
    if delta_BxLxX is not None:
        x_BxLxX = x_BxLxX + delta_BxLxX
    x_BxLxX = layers.dropout(x_BxLxX.astype(DTYPES[cfg.dtype]), cfg.dropout, train=train, rng=rng)
    return layers.dense(params["embed"]["project"], x_BxLxX)


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
    depth's attention weights [B, H, L, L] float32 before dropout, or None per depth when the
    implementation does not form them).

    attend, train and rng as `attn.encoders.bert.model.encode` takes them (attention dropout
    needs the "matrix" implementation; with another set the config's attention_dropout to 0);
    each depth draws its own dropout masks. embed_delta_BxLxD, if given, is added to the input
    embeddings after their LayerNorm: it is [B, L, embedding_size], the width of
    `input_embeddings`."""
    embedded = functools.partial(
        embed, params, cfg, ids_BxL, mask_BxL, types_BxL, train=train, delta_BxLxX=embed_delta_BxLxD
    )
    return blocks.encode(
        "albert",
        embedded,
        params,
        cfg,
        mask_BxL,
        layer_keys(cfg),
        train=train,
        rng=rng,
        return_weights=return_weights,
        attend=attend,
        act=heads.activation(cfg.act),
        ff_dropout=False,
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
    """Step-by-step values of depth `layer`'s self-attention (the shared layer's, on that depth's
    input) on one sequence of ids [L] with bool mask [L] (token types 0), as in evaluation, with
    the matrix form of `score` (the checkpoints': scaled_dot). X is the depth's input as it is
    (post-LayerNorm blocks): for depth 0 the embeddings after their LayerNorm and the
    projection, else the previous depth's output."""
    return blocks.steps(
        encode, params, cfg, ids_L, mask_L, layer=layer, score=score, keys=layer_keys
    )


def steps_input(cfg: Config, layer: int) -> str:
    """What X is in depth `layer`'s step-by-step figure (post-LayerNorm blocks: the input)."""
    if layer > 0:
        return f"X: layer {layer - 1}'s output (the shared layer, after its LayerNorm)"
    return f"X: word + position + token type embeddings after LayerNorm, projected to {cfg.d_model}"
