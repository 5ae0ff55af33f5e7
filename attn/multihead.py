"""Multi-head self-attention over one sequence: project, split heads, attend per head, merge.

Params: {"q", "k", "v", "o": {"w": [D, D], "b": [D]}} plus, for parameterized scores, "score": the
score's params stacked over heads (leading axis H). Head h uses columns h*Dh:(h+1)*Dh of the q/k/v
projections and rows h*Dh:(h+1)*Dh of the output projection (Dh = D / H).

The attention itself is a callable ``attend(q_LxK, k_LxK, v_LxK, mask, *, score_params) ->
(out_LxK, weights_LxL or None)``, by default ``attn.attention`` (scaled dot product, matrix
form); pass ``functools.partial(attn.attention, score=..., implementation=...)`` for another
score or implementation. The score chosen at init and the one in attend must agree: attention
refuses score params its score does not take, and asks for those it needs.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from attn import layers, masks, scores
from attn.attention import attention

Attend = Callable[..., tuple[jax.Array, jax.Array | None]]


def _head_dim(d_model: int, num_heads: int) -> int:
    if num_heads <= 0 or d_model % num_heads != 0:
        raise ValueError(
            f"d_model={d_model} must be divisible by num_heads={num_heads} (num_heads > 0)"
        )
    return d_model // num_heads


def init(
    key: jax.Array,
    d_model: int,
    num_heads: int,
    *,
    score: str | scores.Score = "scaled_dot",
    dtype=jnp.float32,
) -> dict:
    """Params for `apply`; per-head score params come from the score's own init."""
    d_head = _head_dim(d_model, num_heads)
    sc = scores.get_score(score)
    kq, kk, kv, ko, ks = jax.random.split(key, 5)
    params = {
        name: layers.dense_init(k, d_model, d_model, dtype=dtype)
        for name, k in (("q", kq), ("k", kk), ("v", kv), ("o", ko))
    }
    if sc.has_params:
        keys_H = jax.random.split(ks, num_heads)
        params["score"] = jax.vmap(lambda k: sc.init(k, d_head, dtype=dtype))(keys_H)
    return params


def _project(
    params: dict, x_LxD: jax.Array, num_heads: int
) -> tuple[jax.Array, jax.Array, jax.Array, Any]:
    """x [L, D] -> Q, K, V [H, L, Dh] and the per-head score params (or None), validated."""
    length, d_model = x_LxD.shape
    d_head = _head_dim(d_model, num_heads)
    for name in ("q", "k", "v", "o"):
        shape = params[name]["w"].shape
        if shape != (d_model, d_model):
            raise ValueError(
                f"params[{name!r}]['w'] has shape {shape}; x has d_model={d_model}, so it must "
                f"be {(d_model, d_model)}"
            )
    score_params = params.get("score")
    for path, leaf in jax.tree_util.tree_flatten_with_path(score_params)[0]:
        if leaf.ndim == 0 or leaf.shape[0] != num_heads:
            raise ValueError(
                f"params['score']{jax.tree_util.keystr(path)} has shape {leaf.shape}: score "
                f"params are stacked over heads, so its leading axis must be num_heads={num_heads}"
            )

    def heads(name: str) -> jax.Array:
        return layers.dense(params[name], x_LxD).reshape(length, num_heads, d_head).swapaxes(0, 1)

    return heads("q"), heads("k"), heads("v"), score_params


def _merge(params: dict, out_HxLxK: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Per-head outputs [H, L, Dh] -> concatenated heads through the output projection [L, D]."""
    h, length, d_head = out_HxLxK.shape
    out_LxD = out_HxLxK.swapaxes(0, 1).reshape(length, h * d_head).astype(dtype)
    return layers.dense(params["o"], out_LxD)


def apply(
    params: dict,
    x_LxD: jax.Array,
    mask: masks.Mask | None = None,
    *,
    num_heads: int,
    attend: Attend = attention,
) -> tuple[jax.Array, jax.Array | None]:
    """Self-attention of x [L, D] under a mask of any form `attn.attention` takes: key padding
    [L] (True = real token), [L, L], or a function of positions (`attn.masks`).

    Returns (y [L, D] in x's dtype, weights [H, L, L] float32, or None when the implementation does
    not materialise them). Padding queries still get an output (attending to real keys); callers
    pool with the mask, so it never matters.
    """
    q_HxLxK, k_HxLxK, v_HxLxK, score_params = _project(params, x_LxD, num_heads)

    def one_head(q_LxK, k_LxK, v_LxK, sp):
        return attend(q_LxK, k_LxK, v_LxK, mask, score_params=sp)

    sp_axis = None if score_params is None else 0
    out_HxLxK, w_HxLxL = jax.vmap(one_head, in_axes=(0, 0, 0, sp_axis))(
        q_HxLxK, k_HxLxK, v_HxLxK, score_params
    )
    return _merge(params, out_HxLxK, x_LxD.dtype), w_HxLxL


class Steps(NamedTuple):
    """The values of one self-attention layer on one sequence, step by step (matrix form)."""

    x_LxD: jax.Array  # the layer's input X
    q_HxLxK: jax.Array  # Q = X Wq, per head
    k_HxLxK: jax.Array  # K = X Wk
    v_HxLxK: jax.Array  # V = X Wv
    raw_HxLxL: jax.Array  # Q Kᵀ for (scaled_)dot; the score function's matrix for the others
    scaled_HxLxL: jax.Array  # what the softmax sees: raw / sqrt(Dh) for scaled_dot, else raw
    weights_HxLxL: jax.Array  # softmax over allowed keys; masked keys exactly 0
    out_HxLxK: jax.Array  # weights V: one output row per query, per head
    y_LxD: jax.Array  # heads concatenated through the output projection: what `apply` returns


def steps(
    params: dict,
    x_LxD: jax.Array,
    mask: masks.Mask | None = None,
    *,
    num_heads: int,
    score: str | scores.Score = "scaled_dot",
) -> Steps:
    """Every intermediate value of `apply` with the matrix form of `score`, for drawing.

    Q, K, V, the weights, the outputs and y are computed by the same functions `apply` and
    `attn.attention` use, so they equal theirs; raw scores are the only extra computation.
    """
    sc = scores.get_score(score)
    q_HxLxK, k_HxLxK, v_HxLxK, score_params = _project(params, x_LxD, num_heads)
    length = x_LxD.shape[0]
    pos_L = jnp.arange(length, dtype=jnp.int32)
    # scaled_dot is the dot product divided by sqrt(Dh): its raw form is `dot`.
    raw = scores.get_score("dot") if sc.fn is scores.scaled_dot else sc

    def one_head(q_LxK, k_LxK, v_LxK, sp):
        raw_LxL = scores.evaluate(raw, sp, q_LxK, k_LxK, pos_L, pos_L)
        scaled_LxL = scores.evaluate(sc, sp, q_LxK, k_LxK, pos_L, pos_L)
        out_LxK, w_LxL = attention(q_LxK, k_LxK, v_LxK, mask, score=sc, score_params=sp)
        return raw_LxL, scaled_LxL, w_LxL, out_LxK

    sp_axis = None if score_params is None else 0
    raw_HxLxL, scaled_HxLxL, w_HxLxL, out_HxLxK = jax.vmap(one_head, in_axes=(0, 0, 0, sp_axis))(
        q_HxLxK, k_HxLxK, v_HxLxK, score_params
    )
    y_LxD = _merge(params, out_HxLxK, x_LxD.dtype)
    return Steps(
        x_LxD, q_HxLxK, k_HxLxK, v_HxLxK, raw_HxLxL, scaled_HxLxL, w_HxLxL, out_HxLxK, y_LxD
    )
