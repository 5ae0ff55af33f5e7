"""The post-LayerNorm block that BERT, DistilBERT, ELECTRA, ALBERT and DeBERTa share, its stack
over a family's layers, its init, the encode around a family's embeddings and its step-by-step
record:

    x = LN(x + Dropout(MHA(x)))                 each block, on one sequence [L, D]
    x = LN(x + Dropout(W2 act(W1 x)))           act: exact (erf) GELU unless the family's differs

MHA is `attn.multihead.apply` (q, k, v and output projections with biases), so any attn score and
implementation runs inside. The stack reads the params entries `keys` names, one per depth in
order (`attn.encoders.family.layer_keys`: "layer_0" ... "layer_{n-1}"; ALBERT's shared layer is
one entry read at every depth). A family with attention terms of its own (DeBERTa's relative
positions) passes them as `Terms`.

One block's params (plain dicts, float32):
    {"mha": multihead params ({"q", "k", "v", "o": {"w", "b"}}), "ln_att": layer norm,
     "ff1": dense D->F, "ff2": dense F->D, "ln_ff": layer norm}
and whatever a family's terms read beside them (DeBERTa's "pos_k", "pos_q").
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from attn import layers, multihead, scores
from attn.attention import attention
from attn.encoders.family import first_layers, layer_keys

__all__ = ["GELU", "Terms", "encode", "init", "stack", "steps"]

GELU = functools.partial(jax.nn.gelu, approximate=False)

# A family's own attention terms: (a layer's params, its training key or None) -> (the params its
# block reads, the score's params set in "mha"; the key its examples' dropout is split from).
Terms = Callable[[dict, jax.Array | None], tuple[dict, jax.Array | None]]

# A family's embeddings of the batch, given their dropout key (rng=None outside training):
# its `embed` with every other argument bound -> [B, L, D] in cfg.dtype.
Embedded = Callable[..., jax.Array]


def _dense(key: jax.Array, d_in: int, d_out: int, std: float) -> dict:
    return {
        "w": std * jax.random.normal(key, (d_in, d_out), jnp.float32),
        "b": jnp.zeros((d_out,), jnp.float32),
    }


def init(
    key: jax.Array,
    cfg: Any,
    keys: Sequence[str],
    *,
    score: str | scores.Score = "scaled_dot",
    extra: Callable[[jax.Array, Any], dict] | None = None,
) -> dict[str, dict]:
    """{key: a random block} for each distinct entry of `keys`, as BERT draws its layers:
    weights ~ N(0, initializer_range²), biases 0, LayerNorm 1 and 0, for a config with the
    block's sizes (d_model, num_heads, d_ff, initializer_range). A parameterised score adds its
    per-head params under "mha" (`attn.multihead.init`); extra(key, cfg) adds a family's own
    entries to each block (DeBERTa's position projections)."""
    d, f, std = cfg.d_model, cfg.d_ff, cfg.initializer_range
    names = list(dict.fromkeys(keys))
    out = {}
    for name, k in zip(names, jax.random.split(key, len(names)), strict=True):
        k_mha, k_q, k_k, k_v, k_o, k1, k2 = jax.random.split(k, 7)
        mha = multihead.init(k_mha, d, cfg.num_heads, score=score)
        for proj, kw in (("q", k_q), ("k", k_k), ("v", k_v), ("o", k_o)):
            mha[proj] = _dense(kw, d, d, std)
        out[name] = {
            "mha": mha,
            "ln_att": layers.layer_norm_init(d),
            "ff1": _dense(k1, d, f, std),
            "ff2": _dense(k2, f, d, std),
            "ln_ff": layers.layer_norm_init(d),
            **(extra(jax.random.fold_in(k, 7), cfg) if extra is not None else {}),
        }
    return out


def _block(
    p: dict,
    x_LxD: jax.Array,
    mask_L: jax.Array,
    rng: jax.Array | None,
    *,
    cfg: Any,
    attend: multihead.Attend,
    train: bool,
    act: Callable[[jax.Array], jax.Array],
    ff_dropout: bool,
) -> tuple[jax.Array, jax.Array | None]:
    """One block on one sequence [L, D] -> (output [L, D], the attention weights [H, L, L]
    before dropout, or None when the implementation does not form them)."""
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
    f_LxD = layers.dense(p["ff2"], act(layers.dense(p["ff1"], x_LxD)))
    if ff_dropout:
        f_LxD = layers.dropout(f_LxD, cfg.dropout, train=train, rng=r_ff)
    return layers.layer_norm(p["ln_ff"], x_LxD + f_LxD, cfg.layer_norm_eps), w_HxLxL


def stack(
    params: dict,
    cfg: Any,
    x_BxLxD: jax.Array,
    mask_BxL: jax.Array,
    keys: Sequence[str],
    *,
    attend: multihead.Attend = attention,
    train: bool = False,
    rng: jax.Array | None = None,
    terms: Terms | None = None,
    act: Callable[[jax.Array], jax.Array] = GELU,
    ff_dropout: bool = True,
) -> tuple[jax.Array, list]:
    """The blocks params[keys[0]], params[keys[1]], ... over embedded tokens x [B, L, D] with bool
    mask [B, L] -> (the last block's output [B, L, D], each depth's attention weights
    [B, H, L, L] float32 before dropout, or None per depth when the implementation does not form
    them). cfg: any family's config with the block's fields (num_heads, dropout,
    attention_dropout, layer_norm_eps); rng: the layers' key in training, folded with the depth
    (a shared layer draws new masks at every depth). act: the feed-forward's activation;
    ff_dropout=False leaves the feed-forward's output undropped (ALBERT's layer)."""
    block = functools.partial(
        _block, cfg=cfg, attend=attend, train=train, act=act, ff_dropout=ff_dropout
    )
    batch = x_BxLxD.shape[0]
    weights = []
    for i, key in enumerate(keys):
        p, r_i = params[key], jax.random.fold_in(rng, i) if rng is not None else None
        if terms is not None:
            p, r_i = terms(p, r_i)
        # One key per example and depth, so examples get independent dropout masks.
        r_B = jax.random.split(r_i, batch) if r_i is not None else None
        x_BxLxD, w_BxHxLxL = jax.vmap(block, in_axes=(None, 0, 0, None if r_B is None else 0))(
            p, x_BxLxD, mask_BxL, r_B
        )
        weights.append(w_BxHxLxL)
    return x_BxLxD, weights


def encode(
    family: str,
    embedded: Embedded,
    params: dict,
    cfg: Any,
    mask_BxL: jax.Array,
    keys: Sequence[str],
    *,
    train: bool,
    rng: jax.Array | None,
    return_weights: bool,
    **stack_options: Any,
) -> jax.Array | tuple[jax.Array, list]:
    """A post-LayerNorm family's encode: the embeddings (`embedded(rng=...)`, dropped out with
    their own key in training) through `stack` over params[keys] with bool mask [B, L] -> the
    last hidden states [B, L, D]; with return_weights, (those, each depth's attention weights).
    stack_options: stack's attend, terms, act and ff_dropout. train with dropout > 0 and no rng
    is refused in one line naming the family."""
    if train and rng is None and (cfg.dropout > 0.0 or cfg.attention_dropout > 0.0):
        raise ValueError(f"{family}.encode: train=True with dropout > 0 needs an rng key; got None")
    r_embed, r_layers = jax.random.split(rng) if train and rng is not None else (None, None)
    x_BxLxD, weights = stack(
        params,
        cfg,
        embedded(rng=r_embed),
        jnp.asarray(mask_BxL),
        keys,
        train=train,
        rng=r_layers,
        **stack_options,
    )
    return (x_BxLxD, weights) if return_weights else x_BxLxD


def steps(
    encode: Callable[..., jax.Array],
    params: dict,
    cfg: Any,
    ids_L: jax.Array,
    mask_L: jax.Array,
    *,
    layer: int,
    score: str | scores.Score = "scaled_dot",
    keys: Callable[[Any], tuple[str, ...]] = layer_keys,
    terms: Terms | None = None,
    below: multihead.Attend | None = None,
) -> multihead.Steps:
    """Step-by-step values (`attn.multihead.steps`) of depth `layer`'s self-attention on one
    sequence of ids [L] with bool mask [L], as in evaluation, in the matrix form of `score`. The
    blocks are post-LayerNorm, so X is the layer's input as it is: the family's `encode` over its
    first `layer` depths (`first_layers` with the family's `keys`; layer 0: the embeddings
    alone), attending with `below` (default: `score`'s matrix form; a family that sets its own
    score passes `attn.attention`). terms: the family's own attention terms, evaluated."""
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise TypeError(f"layer must be an int; got {layer!r}")
    if not 0 <= layer < cfg.num_layers:
        raise ValueError(f"layer must be in [0, {cfg.num_layers}); got {layer}")
    ids_L, mask_L = jnp.asarray(ids_L), jnp.asarray(mask_L)
    if ids_L.ndim != 1:
        raise ValueError(f"token ids must be one sequence [L]; got shape {ids_L.shape}")
    attend = functools.partial(attention, score=score) if below is None else below
    shallower, cfg_below = first_layers(params, cfg, layer, keys)
    x_LxD = encode(shallower, cfg_below, ids_L[None], mask_L[None], attend=attend)[0]
    p = params[keys(cfg)[layer]]
    if terms is not None:
        p, _ = terms(p, None)
    return multihead.steps(p["mha"], x_LxD, mask_L, num_heads=cfg.num_heads, score=score)
