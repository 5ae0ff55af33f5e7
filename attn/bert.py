"""The BERT-family encoder (BERT, RoBERTa) as pure functions, and `load` for its Hugging Face
checkpoints.

    x = LN(word[ids] + position[pos] + type[types])             embeddings
    x = LN(x + Dropout(MHA(x)))                                  each of num_layers blocks,
    x = LN(x + Dropout(W2 GELU(W1 x)))                           post-LayerNorm, exact (erf) GELU

MHA is `attn.multihead.apply` (q, k, v and output projections with biases), so any attn score
and implementation runs inside: `attn.attention`'s scaled_dot matrix form reproduces the
checkpoints; ``attn.Attention(implementation="chunked")`` serves 512 tokens in memory linear in L.
A key that is padding is masked; a sequence with no real token at all gets attention output 0
(attn's convention) where Hugging Face gives the mean of the values.

Params (plain dicts, float32):
    {"embed": {"tokens": [V, D], "positions": [P, D], "types": [T, D], "ln": layer norm},
     "layer_0" ... "layer_{n-1}": {"mha": multihead params ({"q", "k", "v", "o": {"w", "b"}}),
                                   "ln_att": layer norm, "ff1": dense D->F, "ff2": dense F->D,
                                   "ln_ff": layer norm},
     "pooler": dense D->D, if cfg.pooler}

Checkpoint keys -> params (`load`), after dropping a "bert." / "roberta." prefix and reading
the legacy LayerNorm names "gamma" / "beta" as "weight" / "bias":
    embeddings.word_embeddings.weight [V, D]        embed.tokens            as stored
    embeddings.position_embeddings.weight [P, D]    embed.positions         as stored
    embeddings.token_type_embeddings.weight [T, D]  embed.types             as stored
    embeddings.LayerNorm.{weight, bias} [D]         embed.ln.{scale, bias}  as stored
    encoder.layer.N.attention.self.{query, key, value}.weight [D, D]
                                                    layer_N.mha.{q, k, v}.w transposed
    encoder.layer.N.attention.self.{query, key, value}.bias [D]
                                                    layer_N.mha.{q, k, v}.b as stored
    encoder.layer.N.attention.output.dense.{weight [D, D], bias}
                                                    layer_N.mha.o.{w (transposed), b}
    encoder.layer.N.attention.output.LayerNorm.*    layer_N.ln_att
    encoder.layer.N.intermediate.dense.{weight [F, D], bias [F]}
                                                    layer_N.ff1.{w [D, F] (transposed), b}
    encoder.layer.N.output.dense.{weight [D, F], bias [D]}
                                                    layer_N.ff2.{w [F, D] (transposed), b}
    encoder.layer.N.output.LayerNorm.*              layer_N.ln_ff
    pooler.dense.{weight [D, D], bias}              pooler.{w (transposed), b}
Linear weights are stored [out, in] (PyTorch) and applied here as x @ w with w [in, out]. Heads
need no reshape: both split a projection's D outputs into H contiguous blocks of D / H, head h
taking columns h*D/H:(h+1)*D/H (`attn.multihead`), as `view(B, L, H, D/H)` does.
Skipped and reported, never refused: the buffers embeddings.position_ids and
embeddings.token_type_ids, and the task heads cls.* (BertForPreTraining, BertForMaskedLM),
lm_head.* (RobertaForMaskedLM) and classifier.* (...ForSequenceClassification). Any other key,
a missing key, a wrong shape or a non-float parameter is refused: all of them together, in one
line, by `CheckpointError`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import numbers
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn import layers, multihead, scores
from attn.attention import attention
from attn.classifier import DTYPES

__all__ = [
    "ARCHITECTURES",
    "CheckpointError",
    "Config",
    "attention_steps",
    "embed",
    "encode",
    "first_layers",
    "init",
    "input_embeddings",
    "load",
    "param_count",
    "pool",
    "positions",
]

_log = logging.getLogger(__name__)

# model_type -> the architectures whose checkpoints hold this encoder (their heads skipped).
ARCHITECTURES = {
    "bert": (
        "BertModel",
        "BertForPreTraining",
        "BertForMaskedLM",
        "BertForNextSentencePrediction",
        "BertForSequenceClassification",
        "BertForTokenClassification",
    ),
    "roberta": (
        "RobertaModel",
        "RobertaForMaskedLM",
        "RobertaForSequenceClassification",
        "RobertaForTokenClassification",
    ),
}
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_HEADS = ("cls.", "lm_head.", "classifier.")  # task heads of the architectures above


class CheckpointError(ValueError):
    """A checkpoint directory that `load` refuses; the message is one line naming every fault."""


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

    def __post_init__(self):
        def integer(name: str, lo: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
                raise ValueError(f"bert.Config.{name} must be an integer >= {lo}; got {v!r}")
            object.__setattr__(self, name, int(v))

        def real(name: str, lo: float, hi: float) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not lo <= v < hi:
                raise ValueError(f"bert.Config.{name} must be a float in [{lo}, {hi}); got {v!r}")
            object.__setattr__(self, name, float(v))

        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_positions"):
            integer(name, 1)
        for name in ("num_layers", "type_vocab_size", "pad_id", "position_offset"):
            integer(name, 0)
        if self.d_model % self.num_heads:
            raise ValueError(
                f"bert.Config.d_model={self.d_model} must be divisible by "
                f"bert.Config.num_heads={self.num_heads}"
            )
        real("layer_norm_eps", 0.0, math.inf)
        real("dropout", 0.0, 1.0)
        real("attention_dropout", 0.0, 1.0)
        real("initializer_range", 0.0, math.inf)
        if not isinstance(self.pooler, bool):
            raise ValueError(f"bert.Config.pooler must be a bool; got {self.pooler!r}")
        if self.dtype not in DTYPES:
            raise ValueError(
                f"bert.Config.dtype must be one of {sorted(DTYPES)}; got {self.dtype!r}"
            )


def init(key: jax.Array, cfg: Config, *, score: str | scores.Score = "scaled_dot") -> dict:
    """Random float32 params (layout in the module docstring): weights ~ N(0, initializer_range²)
    as BERT draws them, biases 0, LayerNorm 1 and 0. A parameterised score adds its per-head
    params under each layer's "mha" (`attn.multihead.init`); checkpoints hold none."""
    d, f, std = cfg.d_model, cfg.d_ff, cfg.initializer_range

    def normal(k: jax.Array, *shape: int) -> jax.Array:
        return std * jax.random.normal(k, shape, jnp.float32)

    def dense(k: jax.Array, d_in: int, d_out: int) -> dict:
        return {"w": normal(k, d_in, d_out), "b": jnp.zeros((d_out,), jnp.float32)}

    k_tok, k_pos, k_type, k_pool, k_layers = jax.random.split(key, 5)
    params: dict[str, Any] = {
        "embed": {
            "tokens": normal(k_tok, cfg.vocab_size, d),
            "positions": normal(k_pos, cfg.max_positions, d),
            "types": normal(k_type, cfg.type_vocab_size, d),
            "ln": layers.layer_norm_init(d),
        }
    }
    for i, k in enumerate(jax.random.split(k_layers, cfg.num_layers)):
        k_mha, k_q, k_k, k_v, k_o, k1, k2 = jax.random.split(k, 7)
        mha = multihead.init(k_mha, d, cfg.num_heads, score=score)
        for name, kw in (("q", k_q), ("k", k_k), ("v", k_v), ("o", k_o)):
            mha[name] = dense(kw, d, d)
        params[f"layer_{i}"] = {
            "mha": mha,
            "ln_att": layers.layer_norm_init(d),
            "ff1": dense(k1, d, f),
            "ff2": dense(k2, f, d),
            "ln_ff": layers.layer_norm_init(d),
        }
    if cfg.pooler:
        params["pooler"] = dense(k_pool, d, d)
    return params


def param_count(params: Any) -> int:
    """Number of values in a params tree."""
    return sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(params))


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
    """The inputs as arrays; ValueError in one line for what cannot work (at trace time)."""
    ids_BxL = jnp.asarray(ids_BxL)
    if ids_BxL.ndim != 2 or not jnp.issubdtype(ids_BxL.dtype, jnp.integer):
        raise ValueError(
            f"token ids must be an integer array [batch, length]; got {ids_BxL.dtype}"
            f"{list(ids_BxL.shape)}"
        )
    mask_BxL = jnp.asarray(mask_BxL)
    if mask_BxL.shape != ids_BxL.shape:
        raise ValueError(
            f"mask must have the token ids' shape {ids_BxL.shape} (True or 1 = real token); "
            f"got {mask_BxL.shape}"
        )
    mask_BxL = mask_BxL.astype(bool)
    if types_BxL is None:
        types_BxL = jnp.zeros(ids_BxL.shape, jnp.int32)
    types_BxL = jnp.asarray(types_BxL)
    if types_BxL.shape != ids_BxL.shape or not jnp.issubdtype(types_BxL.dtype, jnp.integer):
        raise ValueError(
            f"token types must be integers of the token ids' shape {ids_BxL.shape}; got "
            f"{types_BxL.dtype}{list(types_BxL.shape)}"
        )
    length = ids_BxL.shape[1]
    last = length - 1 + cfg.position_offset
    if last >= cfg.max_positions:
        raise ValueError(
            f"length {length} needs position {last} but the checkpoint has "
            f"max_positions={cfg.max_positions}: truncate to "
            f"{cfg.max_positions - cfg.position_offset} tokens"
        )
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
    """word + position + token type [B, L, D] float32: what the embeddings' LayerNorm normalises,
    the input gradient × input attributes to. Ids must lie in [0, vocab_size): a gather cannot
    check values under jit."""
    ids_BxL, mask_BxL, types_BxL = _check_inputs(params, cfg, ids_BxL, mask_BxL, types_BxL)
    e = params["embed"]
    x_BxLxD = e["tokens"][ids_BxL] + e["positions"][positions(cfg, mask_BxL)]
    return x_BxLxD + e["types"][types_BxL]


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
    """LN(`input_embeddings` + delta_BxLxD, if given) -> [B, L, D] in cfg.dtype (summed and
    normalised in float32), then dropout in training."""
    x_BxLxD = input_embeddings(params, cfg, ids_BxL, mask_BxL, types_BxL)
    if delta_BxLxD is not None:
        x_BxLxD = x_BxLxD + delta_BxLxD
    x_BxLxD = layers.layer_norm(params["embed"]["ln"], x_BxLxD, cfg.layer_norm_eps)
    return layers.dropout(x_BxLxD.astype(DTYPES[cfg.dtype]), cfg.dropout, train=train, rng=rng)


def _block(
    p: dict,
    x_LxD: jax.Array,
    mask_L: jax.Array,
    rng: jax.Array | None,
    *,
    cfg: Config,
    attend: multihead.Attend,
    train: bool,
) -> tuple[jax.Array, jax.Array | None]:
    """One post-LayerNorm block on one sequence [L, D] -> (output [L, D], the attention weights
    [H, L, L] before dropout, or None when the implementation does not form them)."""
    r_w, r_att, r_ff = jax.random.split(rng, 3) if rng is not None else (None, None, None)
    a_LxD, w_HxLxL = multihead.apply(
        p["mha"],
        x_LxD,
        mask_L,
        num_heads=cfg.num_heads,
        attend=attend,
        dropout_rate=cfg.attention_dropout if train else 0.0,
        dropout_rng=r_w,
    )
    a_LxD = layers.dropout(a_LxD, cfg.dropout, train=train, rng=r_att)
    x_LxD = layers.layer_norm(p["ln_att"], x_LxD + a_LxD, cfg.layer_norm_eps)
    h_LxF = jax.nn.gelu(layers.dense(p["ff1"], x_LxD), approximate=False)
    f_LxD = layers.dropout(layers.dense(p["ff2"], h_LxF), cfg.dropout, train=train, rng=r_ff)
    return layers.layer_norm(p["ln_ff"], x_LxD + f_LxD, cfg.layer_norm_eps), w_HxLxL


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
    """Token ids [B, L], mask [B, L] (True or 1 = real token) and token types [B, L] (default 0)
    -> the last hidden states [B, L, D] in cfg.dtype; with return_weights, (those states, each
    layer's attention weights [B, H, L, L] float32 before dropout, or None per layer when the
    implementation does not form them).

    attend: the attention each head runs (`attn.multihead.apply`'s): ``attn.attention`` by
    default; e.g. ``attn.Attention(implementation="chunked")`` for memory linear in L.
    train=True applies cfg.dropout and cfg.attention_dropout and needs rng (attention dropout
    needs the "matrix" implementation; use ``dataclasses.replace(cfg, attention_dropout=0.0)``
    with another one). embed_delta_BxLxD, if given, is added to the input embeddings before their
    LayerNorm (`embed`): gradient × input differentiates with respect to it.
    """
    if train and rng is None and (cfg.dropout > 0.0 or cfg.attention_dropout > 0.0):
        raise ValueError("bert.encode: train=True with dropout > 0 needs an rng key; got None")
    r_embed, r_layers = jax.random.split(rng) if train and rng is not None else (None, None)
    x_BxLxD = embed(
        params,
        cfg,
        ids_BxL,
        mask_BxL,
        types_BxL,
        train=train,
        rng=r_embed,
        delta_BxLxD=embed_delta_BxLxD,
    )
    mask_BxL = jnp.asarray(mask_BxL).astype(bool)
    block = functools.partial(_block, cfg=cfg, attend=attend, train=train)
    batch = x_BxLxD.shape[0]
    weights = []
    for i in range(cfg.num_layers):
        # One key per example and layer, so examples get independent dropout masks.
        r_B = (
            jax.random.split(jax.random.fold_in(r_layers, i), batch)
            if r_layers is not None
            else None
        )
        x_BxLxD, w_BxHxLxL = jax.vmap(block, in_axes=(None, 0, 0, None if r_B is None else 0))(
            params[f"layer_{i}"], x_BxLxD, mask_BxL, r_B
        )
        weights.append(w_BxHxLxL)
    return (x_BxLxD, weights) if return_weights else x_BxLxD


def attention_steps(
    params: dict,
    cfg: Config,
    ids_L: jax.Array,
    mask_L: jax.Array,
    *,
    layer: int = 0,
    score: str | scores.Score = "scaled_dot",
) -> multihead.Steps:
    """Step-by-step values of layer `layer`'s self-attention on one sequence of ids [L] with mask
    [L], as in evaluation (no dropout), with the matrix form of `score` (the checkpoints':
    scaled_dot). The blocks are post-LayerNorm, so X is the layer's input as it is: the
    embeddings after their LayerNorm for layer 0, else the previous block's output (which ends
    in a LayerNorm)."""
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise TypeError(f"layer must be an int; got {layer!r}")
    if not 0 <= layer < cfg.num_layers:
        raise ValueError(f"layer must be in [0, {cfg.num_layers}); got {layer}")
    ids_L, mask_L = jnp.asarray(ids_L), jnp.asarray(mask_L)
    if ids_L.ndim != 1:
        raise ValueError(f"token ids must be one sequence [L]; got shape {ids_L.shape}")
    below, cfg_below = first_layers(params, cfg, layer)  # layer 0: the embeddings alone
    attend = functools.partial(attention, score=score)
    x_LxD = encode(below, cfg_below, ids_L[None], mask_L[None], attend=attend)[0]
    return multihead.steps(
        params[f"layer_{layer}"]["mha"],
        x_LxD,
        mask_L.astype(bool),
        num_heads=cfg.num_heads,
        score=score,
    )


def pool(params: dict, h_BxLxD: jax.Array) -> jax.Array:
    """BERT's pooler: tanh(dense(first token's state)) -> [B, D] (needs cfg.pooler). Mean
    pooling over real tokens is `attn.pooling.mean_pool` (vmapped)."""
    if "pooler" not in params:
        raise ValueError("these params have no pooler (the checkpoint had none); mean-pool instead")
    return jnp.tanh(layers.dense(params["pooler"], h_BxLxD[:, 0]))


def first_layers(params: dict, cfg: Config, n: int) -> tuple[dict, Config]:
    """The encoder of the first n blocks: (params without layer_n ..., cfg with num_layers=n).
    n=0 keeps the embeddings alone, so encode returns the embedded tokens (attention off); the
    pooler, if any, stays and then reads the embedded first token."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= cfg.num_layers:
        raise ValueError(f"first_layers: n must be an integer in [0, {cfg.num_layers}]; got {n!r}")
    kept = {k: v for k, v in params.items() if not k.startswith("layer_") or int(k[6:]) < n}
    return kept, dataclasses.replace(cfg, num_layers=n)


# ---------------------------------------------------------------------------------------------
# Loading a Hugging Face model directory.

_SAME, _T = "as stored", "transposed"  # [out, in] -> [in, out]

_EMBED_RULES = (
    ("embeddings.word_embeddings.weight", ("embed", "tokens"), _SAME),
    ("embeddings.position_embeddings.weight", ("embed", "positions"), _SAME),
    ("embeddings.token_type_embeddings.weight", ("embed", "types"), _SAME),
    ("embeddings.LayerNorm.weight", ("embed", "ln", "scale"), _SAME),
    ("embeddings.LayerNorm.bias", ("embed", "ln", "bias"), _SAME),
)
_LAYER_RULES = (  # under encoder.layer.N.
    ("attention.self.query.weight", ("mha", "q", "w"), _T),
    ("attention.self.query.bias", ("mha", "q", "b"), _SAME),
    ("attention.self.key.weight", ("mha", "k", "w"), _T),
    ("attention.self.key.bias", ("mha", "k", "b"), _SAME),
    ("attention.self.value.weight", ("mha", "v", "w"), _T),
    ("attention.self.value.bias", ("mha", "v", "b"), _SAME),
    ("attention.output.dense.weight", ("mha", "o", "w"), _T),
    ("attention.output.dense.bias", ("mha", "o", "b"), _SAME),
    ("attention.output.LayerNorm.weight", ("ln_att", "scale"), _SAME),
    ("attention.output.LayerNorm.bias", ("ln_att", "bias"), _SAME),
    ("intermediate.dense.weight", ("ff1", "w"), _T),
    ("intermediate.dense.bias", ("ff1", "b"), _SAME),
    ("output.dense.weight", ("ff2", "w"), _T),
    ("output.dense.bias", ("ff2", "b"), _SAME),
    ("output.LayerNorm.weight", ("ln_ff", "scale"), _SAME),
    ("output.LayerNorm.bias", ("ln_ff", "bias"), _SAME),
)
_POOLER_RULES = (
    ("pooler.dense.weight", ("pooler", "w"), _T),
    ("pooler.dense.bias", ("pooler", "b"), _SAME),
)
_LEGACY = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def _rules(cfg: Config) -> dict[str, tuple[tuple[str, ...], str]]:
    """Checkpoint key (no prefix) -> (params path, how it is stored), for every parameter."""
    rules = {k: (path, how) for k, path, how in _EMBED_RULES}
    for i in range(cfg.num_layers):
        for k, path, how in _LAYER_RULES:
            rules[f"encoder.layer.{i}.{k}"] = ((f"layer_{i}", *path), how)
    if cfg.pooler:
        rules.update({k: (path, how) for k, path, how in _POOLER_RULES})
    return rules


@functools.lru_cache(maxsize=16)
def _shapes(cfg: Config) -> dict[tuple[str, ...], tuple[int, ...]]:
    """params path -> shape of `init(key, cfg)`, traced only."""
    tree = jax.eval_shape(functools.partial(init, cfg=cfg), jax.random.key(0))
    return {
        tuple(p.key for p in path): tuple(x.shape)
        for path, x in jax.tree_util.tree_leaves_with_path(tree)
    }


_CONFIG_KEYS = {  # Config field -> (config.json key, default when absent: None = required)
    "vocab_size": ("vocab_size", None),
    "d_model": ("hidden_size", None),
    "num_layers": ("num_hidden_layers", None),
    "num_heads": ("num_attention_heads", None),
    "d_ff": ("intermediate_size", None),
    "max_positions": ("max_position_embeddings", None),
    "type_vocab_size": ("type_vocab_size", 2),
    "layer_norm_eps": ("layer_norm_eps", 1e-12),
    "dropout": ("hidden_dropout_prob", 0.1),
    "attention_dropout": ("attention_probs_dropout_prob", 0.1),
    "initializer_range": ("initializer_range", 0.02),
}


def _config(hf: dict, where: str) -> Config:
    """config.json -> Config; CheckpointError for what this encoder is not."""
    model_type = hf.get("model_type")
    supported = ", ".join(f"{t} ({', '.join(a)})" for t, a in ARCHITECTURES.items())
    if model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is not supported; attn.bert loads {supported}"
        )
    other = [a for a in hf.get("architectures") or () if a not in ARCHITECTURES[model_type]]
    if other:
        raise CheckpointError(
            f"{where}: architecture {', '.join(other)} is not supported; attn.bert loads "
            f"{supported}"
        )
    faults = []
    if hf.get("hidden_act", "gelu") != "gelu":
        faults.append(f"hidden_act {hf['hidden_act']!r} (only 'gelu', the exact erf form)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        faults.append(
            f"position_embedding_type {hf['position_embedding_type']!r} (only 'absolute')"
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        faults.append("a decoder (is_decoder / add_cross_attention; only encoders)")
    missing = [key for key, default in _CONFIG_KEYS.values() if default is None and key not in hf]
    if missing:
        faults.append(f"no {', '.join(missing)}")
    if faults:
        raise CheckpointError(f"{where}: config.json is not supported: {'; '.join(faults)}")
    kw = {field: hf.get(key, default) for field, (key, default) in _CONFIG_KEYS.items()}
    pad = hf.get("pad_token_id")
    kw["pad_id"] = (1 if model_type == "roberta" else 0) if pad is None else pad
    if model_type == "roberta":  # positions count real tokens from pad_id + 1
        kw["position_offset"] = kw["pad_id"] + 1
    try:
        return Config(**kw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: config.json is not supported: {e}") from None


def _local_dir(path: str | os.PathLike) -> pathlib.Path:
    """A local directory as is; anything else a Hugging Face hub id, downloaded when
    huggingface_hub is installed (config.json and the safetensors files only)."""
    if os.path.isdir(path):
        return pathlib.Path(path)
    name = os.fspath(path)
    if os.path.exists(name):
        raise CheckpointError(f"{name} is a file; pass the model directory that holds it")
    try:
        import huggingface_hub
    except ImportError:
        raise CheckpointError(
            f"{name} is not a local directory, and huggingface_hub is not installed to download "
            "it from the hub: pip install huggingface_hub, or pass a directory"
        ) from None
    patterns = ["config.json", "*.safetensors", "model.safetensors.index.json"]
    try:
        local = huggingface_hub.snapshot_download(repo_id=name, allow_patterns=patterns)
    except Exception as e:  # noqa: BLE001 (network, auth, a bad id: all one line here)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{name} is not a local directory and downloading it from the hub failed: {first}"
        ) from None
    return pathlib.Path(local)


def _weight_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The safetensors files of a model directory (one, or the shards an index names)."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(f"{directory}: shards named by its index are missing: {missing}")
        return [directory / s for s in shards]
    others = [
        n
        for n in ("pytorch_model.bin", "flax_model.msgpack", "tf_model.h5")
        if (directory / n).exists()
    ]
    if others:
        raise CheckpointError(
            f"{directory} has {', '.join(others)} but no model.safetensors, and attn reads only "
            "safetensors (no torch): convert it once with transformers, "
            "AutoModel.from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)"
        )
    raise CheckpointError(f"{directory} has no model.safetensors (nor a sharded index)")


def load(path: str | os.PathLike) -> tuple[dict, Config]:
    """(params, cfg) from a Hugging Face model directory (config.json + model.safetensors, read
    with safetensors' numpy reader; float32 params whatever the stored float dtype).

    A path that is not a local directory is a hub id, downloaded with huggingface_hub when
    installed. Every stored tensor is mapped by the rules in the module docstring or skipped by
    name (buffers, task heads); everything else — a missing, unknown, wrongly shaped or
    non-float tensor — is collected and raised together as one CheckpointError. The parameter
    count (`param_count(params)`) equals the stored count of the mapped tensors, checked here and
    logged with what was skipped (logger "attn.bert", INFO).
    """
    directory = _local_dir(path)
    where = str(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{where} has no config.json (a Hugging Face model directory)")
    try:
        hf = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{config_path} is not readable JSON: {e}") from None
    cfg = _config(hf, where)
    files = _weight_files(directory)
    try:
        from safetensors import safe_open
    except ImportError:
        raise CheckpointError(
            "reading a checkpoint needs safetensors: pip install safetensors (or attn[bert])"
        ) from None

    # Pass 1: names, shapes and dtypes from the headers, nothing loaded.
    stored: dict[str, tuple[pathlib.Path, tuple[int, ...], str]] = {}
    for file in files:
        with safe_open(os.fspath(file), framework="numpy") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                stored[key] = (file, tuple(sl.get_shape()), sl.get_dtype())

    problems: list[str] = []
    canonical: dict[str, str] = {}  # canonical key -> stored key
    for key in stored:
        name = key
        prefix = f"{hf['model_type']}."  # BertForX / RobertaForX keep the encoder under it
        if name.startswith(prefix):
            name = name[len(prefix) :]
        for old, new in _LEGACY.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        if name in canonical:
            problems.append(f"tensors {canonical[name]} and {key} are the same parameter")
            continue
        canonical[name] = key
    skipped = {
        name: key for name, key in canonical.items() if name in _BUFFERS or name.startswith(_HEADS)
    }
    if not any(k.startswith("pooler.") for k in canonical):
        cfg = dataclasses.replace(cfg, pooler=False)  # e.g. a masked-LM checkpoint
    rules, shapes = _rules(cfg), _shapes(cfg)
    for name in sorted(set(rules) - set(canonical)):
        path_ = ".".join(rules[name][0])
        problems.append(f"missing tensor {name} (for params {path_})")
    for name, key in sorted(canonical.items()):
        if name in skipped:
            continue
        if name not in rules:
            problems.append(f"unknown tensor {key}")
            continue
        _, shape, dtype = stored[key]
        path_, how = rules[name]
        want = shapes[path_][::-1] if how == _T else shapes[path_]
        if shape != want:
            problems.append(f"tensor {key} has shape {shape} where config.json implies {want}")
        if dtype[0] not in "FB":  # F16, F32, F64, BF16
            problems.append(f"tensor {key} has dtype {dtype}, not a float parameter")
    if problems:
        raise CheckpointError(f"cannot load {where}: {'; '.join(problems)}")

    # Pass 2: load and place.
    params: dict[str, Any] = {}
    by_file: dict[pathlib.Path, list[str]] = {}
    for name in rules:
        by_file.setdefault(stored[canonical[name]][0], []).append(name)
    mapped_values = 0
    for file, names in by_file.items():
        with safe_open(os.fspath(file), framework="numpy") as f:
            for name in names:
                x = np.asarray(f.get_tensor(canonical[name]), np.float32)
                mapped_values += x.size
                path_, how = rules[name]
                node = params
                for part in path_[:-1]:
                    node = node.setdefault(part, {})
                node[path_[-1]] = jnp.asarray(x.T if how == _T else x)
    count = param_count(params)
    if count != mapped_values or count != sum(int(np.prod(s)) for s in shapes.values()):
        raise CheckpointError(f"{where}: loaded {count} values, stored {mapped_values}")
    skipped_values = sum(int(np.prod(stored[k][1])) for k in skipped.values())
    _log.info(
        "%s: %s parameters in %d tensors, the stored count; skipped %s",
        where,
        f"{count:,}",
        len(rules),
        ", ".join(sorted(skipped.values())) + f" ({skipped_values:,} values)"
        if skipped
        else "nothing",
    )
    return params, cfg
