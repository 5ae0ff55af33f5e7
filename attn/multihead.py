"""Multi-head attention over one sequence: project, split heads, attend per head, merge.

Params: {"q", "o": {"w": [D, D], "b": [D]}, "k", "v": {"w": [W, D], "b": [D]}} (W = D for
self-attention; the feature size of the keys' and values' input for cross-attention) plus, for
parameterized scores, "score": the score's params stacked over heads (leading axis H). Head h uses
columns h*Dh:(h+1)*Dh of the q/k/v projections and rows h*Dh:(h+1)*Dh of the output projection
(Dh = D / H). `heads` and `merge` also take leading batch axes, for batched callers
(`attn.flax_interop`).

The attention itself is a callable ``attend(q_LxK, k_LxK, v_LxK, mask, *, score_params) ->
(out_LxK, weights_LxL or None)``, by default ``attn.attention`` (scaled dot product, matrix
form); pass ``functools.partial(attn.attention, score=..., implementation=...)`` for another
score or implementation. The score chosen at init and the one in attend must agree: attention
refuses score params its score does not take, and asks for those it needs.

A position transform of the queries and keys (``qk_transform``, e.g. rotary positions,
``functools.partial(attn.positions.rotary, theta=10000.0)``) is applied to every head's
projected q and k before attend, so the score and every implementation run on the transformed
q and k unchanged: ``fn(x_HxLxK, pos_L) -> [H, L, K]`` with positions 0..L-1 for the queries and
0..M-1 for the keys.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from attn import layers, masks, scores
from attn.attention import attention

__all__ = [
    "Attend",
    "QKTransform",
    "Steps",
    "apply",
    "check_params",
    "heads",
    "init",
    "merge",
    "steps",
]

Attend = Callable[..., tuple[jax.Array, jax.Array | None]]
QKTransform = Callable[[jax.Array, jax.Array], jax.Array]  # (x [H, L, K], positions [L])


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
    d_kv: int | None = None,
) -> dict:
    """Params for `apply`; per-head score params come from the score's own init. d_kv: the
    feature size of the keys' and values' input for cross-attention (default d_model)."""
    d_head = _head_dim(d_model, num_heads)
    d_kv = d_model if d_kv is None else d_kv
    sc = scores.get_score(score)
    kq, kk, kv, ko, ks = jax.random.split(key, 5)
    params = {
        name: layers.dense_init(k, d_in, d_model, dtype=dtype)
        for name, k, d_in in (
            ("q", kq, d_model),
            ("k", kk, d_kv),
            ("v", kv, d_kv),
            ("o", ko, d_model),
        )
    }
    if sc.has_params:
        keys_H = jax.random.split(ks, num_heads)
        params["score"] = jax.vmap(lambda k: sc.init(k, d_head, dtype=dtype))(keys_H)
    return params


def check_params(params: dict, d_model: int, d_kv: int, num_heads: int) -> None:
    """ValueError in one line when params were not built for these sizes (at trace time)."""
    _head_dim(d_model, num_heads)
    kv = f"the keys' and values' input has {d_kv} features and x has d_model={d_model}"
    for name, d_in, what in (
        ("q", d_model, f"x has d_model={d_model}"),
        ("k", d_kv, kv),
        ("v", d_kv, kv),
        ("o", d_model, f"x has d_model={d_model}"),
    ):
        shape = params[name]["w"].shape
        if shape != (d_in, d_model):
            raise ValueError(
                f"params[{name!r}]['w'] has shape {shape}; {what}, so it must be {(d_in, d_model)}"
            )
    for path, leaf in jax.tree_util.tree_flatten_with_path(params.get("score"))[0]:
        if leaf.ndim == 0 or leaf.shape[0] != num_heads:
            raise ValueError(
                f"params['score']{jax.tree_util.keystr(path)} has shape {leaf.shape}: score "
                f"params are stacked over heads, so its leading axis must be num_heads={num_heads}"
            )


def heads(dense_params: dict, x_xLxW: jax.Array, num_heads: int) -> jax.Array:
    """One projection of x [..., L, W], split into heads -> [..., L, H, Dh]."""
    y_xLxD = layers.dense(dense_params, x_xLxW)
    return y_xLxD.reshape(*y_xLxD.shape[:-1], num_heads, y_xLxD.shape[-1] // num_heads)


def merge(params: dict, out_xLxHxK: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Per-head outputs [..., L, H, Dh] -> heads concatenated, output-projected [..., L, D]."""
    out_xLxD = out_xLxHxK.reshape(*out_xLxHxK.shape[:-2], -1).astype(dtype)
    return layers.dense(params["o"], out_xLxD)


def _project(
    params: dict,
    x_LxD: jax.Array,
    kv_MxW: jax.Array | None,
    num_heads: int,
    qk_transform: QKTransform | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, Any]:
    """x [L, D] (and kv [M, W]) -> Q [H, L, Dh], K, V [H, M, Dh] (Q and K position-transformed
    when qk_transform is given) and the per-head score params (or None), validated."""
    kv_MxW = x_LxD if kv_MxW is None else kv_MxW
    for name, x in (("x", x_LxD), ("kv", kv_MxW)):
        if x.ndim != 2:
            raise ValueError(
                f"{name} must be [L, features], one sequence (vmap for a batch, or use "
                f"attn.flax_interop's modules); got shape {x.shape}"
            )
    check_params(params, x_LxD.shape[1], kv_MxW.shape[1], num_heads)

    def split(name: str, x: jax.Array) -> jax.Array:
        return heads(params[name], x, num_heads).swapaxes(0, 1)

    q_HxLxK, k_HxMxK = split("q", x_LxD), split("k", kv_MxW)
    if qk_transform is not None:
        q_HxLxK = _transformed(qk_transform, q_HxLxK, "q")
        k_HxMxK = _transformed(qk_transform, k_HxMxK, "k")
    return q_HxLxK, k_HxMxK, split("v", kv_MxW), params.get("score")


def _transformed(qk_transform: QKTransform, x_HxLxK: jax.Array, name: str) -> jax.Array:
    """qk_transform at positions 0..L-1; ValueError in one line when it changes shape or dtype."""
    y = qk_transform(x_HxLxK, jnp.arange(x_HxLxK.shape[1], dtype=jnp.int32))
    if getattr(y, "shape", None) != x_HxLxK.shape or y.dtype != x_HxLxK.dtype:
        raise ValueError(
            f"qk_transform must return {name} as it was given, {x_HxLxK.dtype}"
            f"{list(x_HxLxK.shape)}; got {getattr(y, 'dtype', type(y).__name__)}"
            f"{list(getattr(y, 'shape', ()))}"
        )
    return y


def _merge(params: dict, out_HxLxK: jax.Array, dtype: jnp.dtype) -> jax.Array:
    return merge(params, out_HxLxK.swapaxes(0, 1), dtype)


def apply(
    params: dict,
    x_LxD: jax.Array,
    mask: masks.Mask | None = None,
    *,
    num_heads: int,
    attend: Attend = attention,
    kv_MxW: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    qk_transform: QKTransform | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """Self-attention of x [L, D] (cross-attention to kv [M, W] when given) under a mask of any
    form `attn.attention` takes: key padding [M] (True = real token), [L, M], or a function of
    positions (`attn.masks`).

    qk_transform, if given, transforms each head's q and k by position before attend (see the
    module docstring): attend computes its score from the transformed q and k.

    dropout_rate > 0 drops attention weights (BERT's attention dropout): each head gets its own
    key split from dropout_rng and attend is called with ``dropout_rate=, dropout_rng=`` (which
    `attn.attention` and `attn.Attention` take, for implementation "matrix"); at rate 0 attend is
    called without them, so any attend works.

    Returns (y [L, D] in x's dtype, weights [H, L, M] float32 (before dropout), or None when the
    implementation does not materialise them). Padding queries still get an output (attending to
    real keys); callers pool with the mask, so it never matters.
    """
    q_HxLxK, k_HxMxK, v_HxMxK, score_params = _project(
        params, x_LxD, kv_MxW, num_heads, qk_transform
    )
    sp_axis = None if score_params is None else 0
    if dropout_rate > 0.0:
        if dropout_rng is None:
            raise ValueError(f"dropout_rate={dropout_rate} needs a dropout_rng; got None")

        def one_head_dropped(q_LxK, k_MxK, v_MxK, sp, r):
            return attend(
                q_LxK, k_MxK, v_MxK, mask, score_params=sp, dropout_rate=dropout_rate,
                dropout_rng=r,
            )  # fmt: skip

        out_HxLxK, w_HxLxM = jax.vmap(one_head_dropped, in_axes=(0, 0, 0, sp_axis, 0))(
            q_HxLxK, k_HxMxK, v_HxMxK, score_params, jax.random.split(dropout_rng, num_heads)
        )
        return _merge(params, out_HxLxK, x_LxD.dtype), w_HxLxM

    def one_head(q_LxK, k_MxK, v_MxK, sp):
        return attend(q_LxK, k_MxK, v_MxK, mask, score_params=sp)

    out_HxLxK, w_HxLxM = jax.vmap(one_head, in_axes=(0, 0, 0, sp_axis))(
        q_HxLxK, k_HxMxK, v_HxMxK, score_params
    )
    return _merge(params, out_HxLxK, x_LxD.dtype), w_HxLxM


class Steps(NamedTuple):
    """The values of one self-attention layer on one sequence, step by step (matrix form)."""

    x_LxD: jax.Array  # the layer's input X
    q_HxLxK: jax.Array  # Q = X Wq, per head (position-transformed, with a qk_transform)
    k_HxLxK: jax.Array  # K = X Wk (likewise): the Q and K the scores are computed from
    v_HxLxK: jax.Array  # V = X Wv
    raw_HxLxL: jax.Array  # Q Kᵀ for (scaled_)dot, the unscaled form of a score that has one
    # (`attn.scores.Score.unscaled`), the score function's matrix for the others
    scaled_HxLxL: jax.Array  # what the softmax sees: raw / sqrt(Dh) for scaled_dot, raw / the
    # score's divisor where it has one, else raw
    weights_HxLxL: jax.Array  # softmax over allowed keys; masked keys exactly 0
    out_HxLxK: jax.Array  # weights V: one output row per query, per head
    y_LxD: jax.Array  # heads concatenated through the output projection: what `apply` returns
    score: scores.Score  # the score computed (static: no array), for titling figures


def steps(
    params: dict,
    x_LxD: jax.Array,
    mask: masks.Mask | None = None,
    *,
    num_heads: int,
    score: str | scores.Score = "scaled_dot",
    qk_transform: QKTransform | None = None,
) -> Steps:
    """Every intermediate value of `apply` with the matrix form of `score`, for drawing.

    Q, K, V, the weights, the outputs and y are computed by the same functions `apply` and
    `attn.attention` use, so they equal theirs; raw scores are the only extra computation (the
    score's unscaled form where it has one, `attn.scores.Score.unscaled`). With a qk_transform,
    Q and K are the transformed ones the scores are computed from.
    """
    sc = scores.get_score(score)
    q_HxLxK, k_HxLxK, v_HxLxK, score_params = _project(params, x_LxD, None, num_heads, qk_transform)
    length = x_LxD.shape[0]
    pos_L = jnp.arange(length, dtype=jnp.int32)
    # scaled_dot is the dot product divided by sqrt(Dh): its raw form is `dot`.
    if sc.unscaled is not None:
        raw = sc.unscaled
    else:
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
        x_LxD, q_HxLxK, k_HxLxK, v_HxLxK, raw_HxLxL, scaled_HxLxL, w_HxLxL, out_HxLxK, y_LxD, sc
    )
