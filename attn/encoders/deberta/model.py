"""The DeBERTa-v2 encoder (DeBERTa-v2 and -v3 checkpoints, model_type "deberta-v2") as pure
functions; its checkpoint rules are `attn.encoders.deberta.checkpoint`.

    x = LN(word[ids] (+ position[i]) (+ type[types])) * mask     embeddings (mask: pad rows 0)
    R = LN(relative) or relative                                  [2S, D], shared by the layers
    x = LN(x + Dropout(MHA(x; R)))                                each of num_layers blocks,
    x = LN(x + Dropout(W2 GELU(W1 x)))                            post-LayerNorm, exact GELU

The blocks are `attn.encoders.blocks`, with DeBERTa's disentangled score (`score`) as their
attention terms: each layer projects R with its own key and query projections (share_att_key) or
with its pos_key_proj / pos_query_proj, splits the tables into heads [H, 2S, K] and passes them as
the score's params; q_pos and k_pos are the tokens' indices 0..L-1, as transformers counts them
(padding included). Implementations "matrix" and "chunked" (memory linear in L) run it; "xla" is
refused (jax.nn's attention takes no relative-position terms). A padding key is masked;
transformers also masks padding queries (their rows come out uniform), which changes only the
states of padding positions.

Params (plain dicts, float32):
    {"embed": {"tokens": [V, D], "positions": [P, D] if position_biased_input,
               "types": [T, D] if type_vocab_size > 0, "ln": layer norm,
               "relative": [2S, D], "relative_ln": layer norm if norm_rel_ebd is "layer_norm"},
     "layer_0" ... "layer_{n-1}": the blocks (`attn.encoders.blocks`) and
                                   "pos_k": dense D->D if c2p and not share_att_key,
                                   "pos_q": dense D->D if p2c and not share_att_key}
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from attn import layers, multihead, scores
from attn.attention import Attention, attention
from attn.classifier import DTYPES
from attn.encoders import blocks, fields
from attn.encoders.deberta import score as disentangled
from attn.encoders.family import checked_inputs, layer_keys, lookup
from attn.encoders.heads import ACTIVATIONS

__all__ = [
    "NORM_REL_EBD",
    "UNSUPPORTED",
    "Config",
    "attention_steps",
    "embed",
    "encode",
    "init",
    "input_embeddings",
    "score",
    "steps_input",
]

NORM_REL_EBD = ("layer_norm", "none")
# The implementations the disentangled score cannot run in, and why (Family.unsupported).
UNSUPPORTED = {
    "xla": "jax.nn.dot_product_attention cannot add the disentangled score's relative-position "
    "terms; use 'matrix' or 'chunked'"
}


@dataclasses.dataclass(frozen=True)
class Config:
    """The encoder's sizes (config.json's names in comments); frozen and hashable, so it can be
    a jit static argument. Defaults are microsoft/deberta-v3-base's."""

    vocab_size: int = 128100
    d_model: int = 768  # hidden_size
    num_layers: int = 12  # num_hidden_layers
    num_heads: int = 12  # num_attention_heads
    d_ff: int = 3072  # intermediate_size
    max_positions: int = 512  # max_position_embeddings
    type_vocab_size: int = 0  # 0: no token type embeddings
    layer_norm_eps: float = 1e-7
    dropout: float = 0.1  # hidden_dropout_prob: embeddings, relative embeddings, outputs
    attention_dropout: float = 0.1  # attention_probs_dropout_prob: on the attention weights
    pad_id: int = 0  # pad_token_id
    position_buckets: int = 256  # <= 0: relative positions unbucketed, clipped to the span
    max_relative_positions: int = -1  # < 1: max_positions
    pos_att_type: tuple[str, ...] = ("c2p", "p2c")  # the position terms, a subset of both
    share_att_key: bool = True  # position tables through the layer's own key/query projections
    position_biased_input: bool = False  # absolute position embeddings added to the tokens'
    norm_rel_ebd: str = "layer_norm"  # LayerNorm on the relative embeddings, or "none"
    initializer_range: float = 0.02  # init's stddev
    dtype: str = "float32"  # compute dtype: "float32" | "bfloat16"; params stay float32
    pooler_act: str = "gelu"  # pooler_hidden_act: the classification head's activation

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_positions"):
            fields.integer(self, name, 1)
        for name in ("num_layers", "type_vocab_size", "pad_id"):
            fields.integer(self, name, 0)
        for name in ("position_buckets", "max_relative_positions"):
            fields.integer(self, name)
        fields.divisible(self, "d_model", "num_heads")
        fields.real(self, "layer_norm_eps", 0.0, math.inf)
        fields.real(self, "dropout", 0.0, 1.0)
        fields.real(self, "attention_dropout", 0.0, 1.0)
        fields.real(self, "initializer_range", 0.0, math.inf)
        terms = self.pos_att_type
        if isinstance(terms, str) or not all(t in disentangled.TERMS for t in terms):
            raise ValueError(
                f"deberta.Config.pos_att_type must be a tuple of {disentangled.TERMS}; got "
                f"{terms!r}"
            )
        # One order, so equal configs are equal (and share a jit cache entry).
        object.__setattr__(self, "pos_att_type", tuple(t for t in disentangled.TERMS if t in terms))
        for name in ("share_att_key", "position_biased_input"):
            fields.flag(self, name)
        fields.choice(self, "pooler_act", tuple(ACTIVATIONS))
        fields.choice(self, "norm_rel_ebd", NORM_REL_EBD)
        if self.position_buckets == 1 or (
            self.position_buckets > 1 and self.max_relative - 1 <= self.position_buckets // 2
        ):
            raise ValueError(
                f"deberta.Config: log buckets need position_buckets >= 2 and the largest relative "
                f"position ({self.max_relative}) above position_buckets // 2 + 1; got "
                f"position_buckets={self.position_buckets}"
            )
        fields.choice(self, "dtype", sorted(DTYPES))

    @property
    def max_length(self) -> int:
        """The longest input: max_position_embeddings."""
        return self.max_positions

    @property
    def max_relative(self) -> int:
        """max_relative_positions, or max_positions where it is < 1: where log buckets end."""
        return (
            self.max_relative_positions if self.max_relative_positions >= 1 else self.max_positions
        )

    @property
    def span(self) -> int:
        """S: the relative positions the tables hold are [-S, S): position_buckets, else
        max_relative."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads


def score(cfg: Config) -> scores.Score:
    """The disentangled score of cfg's attention (`attn.encoders.deberta.score`)."""
    return disentangled.score(
        cfg.span,
        cfg.position_buckets,
        cfg.max_relative,
        cfg.max_length,
        cfg.pos_att_type,
        cfg.d_head,
    )


def init(key: jax.Array, cfg: Config) -> dict:
    """Random float32 params (layout in the module docstring): weights ~ N(0, initializer_range²)
    as transformers draws them, biases 0, LayerNorm 1 and 0; the blocks as
    `attn.encoders.blocks.init` draws them."""
    d, std = cfg.d_model, cfg.initializer_range

    def normal(k: jax.Array, *shape: int) -> jax.Array:
        return std * jax.random.normal(k, shape, jnp.float32)

    def position_projections(k: jax.Array, cfg: Config) -> dict:
        """A layer's own projections of the relative embeddings (when not share_att_key)."""
        k_pk, k_pq = jax.random.split(k)
        p = {}
        if not cfg.share_att_key:
            if "c2p" in cfg.pos_att_type:
                p["pos_k"] = {"w": normal(k_pk, d, d), "b": jnp.zeros((d,), jnp.float32)}
            if "p2c" in cfg.pos_att_type:
                p["pos_q"] = {"w": normal(k_pq, d, d), "b": jnp.zeros((d,), jnp.float32)}
        return p

    k_tok, k_pos, k_type, k_rel, k_layers = jax.random.split(key, 5)
    e: dict[str, Any] = {"tokens": normal(k_tok, cfg.vocab_size, d)}
    if cfg.position_biased_input:
        e["positions"] = normal(k_pos, cfg.max_positions, d)
    if cfg.type_vocab_size > 0:
        e["types"] = normal(k_type, cfg.type_vocab_size, d)
    e["ln"] = layers.layer_norm_init(d)
    e["relative"] = normal(k_rel, 2 * cfg.span, d)
    if cfg.norm_rel_ebd == "layer_norm":
        e["relative_ln"] = layers.layer_norm_init(d)
    blocks_ = blocks.init(k_layers, cfg, layer_keys(cfg), extra=position_projections)
    return {"embed": e, **blocks_}


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
    """LN(word (+ position, if position_biased_input) (+ token type, if type_vocab_size > 0)) with
    padding rows 0 (as transformers multiplies by the mask) [B, L, D] float32: the first block's
    input before dropout, what gradient × input attributes to (taken before the normalisation it
    would be 0: a LayerNorm ignores its input's scale). An id outside [0, vocab_size) is refused
    when concrete and gives NaN under jit (`family.lookup`)."""
    ids_BxL, mask_BxL, types_BxL = _check_inputs(params, cfg, ids_BxL, mask_BxL, types_BxL)
    e = params["embed"]
    x_BxLxD = lookup(e["tokens"], ids_BxL)
    if cfg.position_biased_input:
        x_BxLxD = x_BxLxD + e["positions"][: ids_BxL.shape[1]]
    if cfg.type_vocab_size > 0:
        x_BxLxD = x_BxLxD + e["types"][types_BxL]
    x_BxLxD = layers.layer_norm(e["ln"], x_BxLxD, cfg.layer_norm_eps)
    return jnp.where(mask_BxL[..., None], x_BxLxD, 0.0)


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


def _relative(params: dict, cfg: Config) -> jax.Array:
    """The relative position embeddings every layer projects [2S, D], after their LayerNorm
    where the model has one, in cfg.dtype."""
    e = params["embed"]
    rel_rxD = e["relative"]
    if cfg.norm_rel_ebd == "layer_norm":
        rel_rxD = layers.layer_norm(e["relative_ln"], rel_rxD, cfg.layer_norm_eps)
    return rel_rxD.astype(DTYPES[cfg.dtype])


def _with_tables(p: dict, rel_rxD: jax.Array, cfg: Config) -> dict:
    """The layer's params with the score's params in "mha": its projections of the relative
    embeddings, per head [H, 2S, K] (keys "pos_key_rxK" for c2p, "pos_query_rxK" for p2c)."""
    projections = {
        "c2p": ("pos_key_rxK", p["mha"]["k"] if cfg.share_att_key else p.get("pos_k")),
        "p2c": ("pos_query_rxK", p["mha"]["q"] if cfg.share_att_key else p.get("pos_q")),
    }
    tables = {}
    for term in cfg.pos_att_type:
        name, dense = projections[term]
        tables[name] = multihead.heads(dense, rel_rxD, cfg.num_heads).swapaxes(0, 1)
    return {**p, "mha": {**p["mha"], "score": tables}}


def _terms(params: dict, cfg: Config, *, train: bool) -> blocks.Terms:
    """The disentangled score's position tables as each layer's attention terms: the relative
    embeddings, dropped out once per layer in training (they are shared by the batch, so one
    draw; the examples' masks come from the rest of the layer's key), through the layer's
    projections."""
    rel_rxD = _relative(params, cfg)

    def terms(p: dict, rng: jax.Array | None) -> tuple[dict, jax.Array | None]:
        r_rel, r_examples = jax.random.split(rng) if rng is not None else (None, None)
        rel_i = layers.dropout(rel_rxD, cfg.dropout, train=train, rng=r_rel)
        return _with_tables(p, rel_i, cfg), r_examples

    return terms


def _attend(attend: multihead.Attend, sc: scores.Score) -> multihead.Attend:
    """`attend` computing the disentangled score `sc`: an `attn.Attention` or a
    functools.partial of `attn.attention` (or it alone) with its score set; ValueError in one
    line for what cannot compute it."""
    is_partial = isinstance(attend, functools.partial) and attend.func is attention
    if isinstance(attend, Attention):
        given, implementation = attend.score, attend.implementation
    elif attend is attention or is_partial:
        kw = attend.keywords if is_partial else {}
        given, implementation = kw.get("score", "scaled_dot"), kw.get("implementation", "matrix")
    else:
        raise ValueError(
            "deberta: attend must be attn.attention, an attn.Attention or a functools.partial of "
            f"attn.attention, so that the disentangled score can be set on it; got {attend!r}"
        )
    if implementation in UNSUPPORTED:
        raise ValueError(
            f"deberta: implementation {implementation!r}: {UNSUPPORTED[implementation]}"
        )
    if scores.get_score(given) not in (scores.get_score("scaled_dot"), sc):
        raise ValueError(
            f"deberta computes its own disentangled score; attend's score "
            f"{scores.get_score(given).name!r} would be dropped: leave it at the default"
        )
    if isinstance(attend, Attention):
        return dataclasses.replace(attend, score=sc)
    return functools.partial(attend, score=sc)


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
    """Token ids [B, L], mask [B, L] (bool, True = real token) and token types [B, L] (default 0;
    read only when type_vocab_size > 0) -> the last hidden states [B, L, D] in cfg.dtype; with
    return_weights, (those states, each layer's attention weights [B, H, L, L] float32 before
    dropout, or None per layer when the implementation does not form them).

    attend: ``attn.attention`` (default), an ``attn.Attention`` or a functools.partial of
    attn.attention with the default score: the disentangled score is set on it (`_attend`), so
    ``attn.Attention(implementation="chunked")`` runs it in memory linear in L; "xla" is
    refused. train=True applies cfg.dropout (embeddings, relative embeddings, block outputs)
    and cfg.attention_dropout (needs "matrix") and needs rng. embed_delta_BxLxD, if given, is
    added to the input embeddings after their LayerNorm (`embed`).
    """
    embedded = functools.partial(
        embed, params, cfg, ids_BxL, mask_BxL, types_BxL, train=train, delta_BxLxD=embed_delta_BxLxD
    )
    return blocks.encode(
        "deberta",
        embedded,
        params,
        cfg,
        mask_BxL,
        layer_keys(cfg),
        train=train,
        rng=rng,
        return_weights=return_weights,
        attend=_attend(attend, score(cfg)),
        terms=_terms(params, cfg, train=train),
    )


def attention_steps(
    params: dict, cfg: Config, ids_L: jax.Array, mask_L: jax.Array, *, layer: int = 0
) -> multihead.Steps:
    """Step-by-step values of layer `layer`'s self-attention on one sequence of ids [L] with bool
    mask [L], as in evaluation (no dropout), in the matrix form of the disentangled score: the
    raw scores are content + the position terms, the scaled ones (what the softmax sees) those
    divided by √(K·(1+#terms)) (`Steps.score` says so). The blocks are post-LayerNorm, so X is
    the layer's input as it is."""
    return blocks.steps(
        encode,
        params,
        cfg,
        ids_L,
        mask_L,
        layer=layer,
        score=score(cfg),
        terms=_terms(params, cfg, train=False),
        below=attention,
    )


def steps_input(cfg: Config, layer: int) -> str:
    """What X is in layer `layer`'s step-by-step figure (post-LayerNorm blocks: the input)."""
    if layer == 0:
        parts = ["word"]
        parts += ["position"] if cfg.position_biased_input else []
        parts += ["token type"] if cfg.type_vocab_size > 0 else []
        return f"X: {' + '.join(parts)} embeddings after LayerNorm"
    return f"X: layer {layer - 1}'s output (after its LayerNorm)"
