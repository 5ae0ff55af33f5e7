"""Attention for one unbatched sequence: out = softmax(score(Q, K)) V with a boolean mask.

Batches and heads come from ``jax.vmap``. Three implementations share one contract:
  "matrix"   all queries at once as matrix products; returns the weights.
  "chunked"  online softmax over key/query chunks (attn.chunked), O(L) memory; weights None.
  "xla"      ``jax.nn.dot_product_attention`` (XLA or cuDNN); scaled_dot only; weights None.

Masked scores are set to a large finite negative (never -inf) and the softmax runs in float32,
then the weights are multiplied by the mask: a fully masked row gives weights 0, output 0 and
finite gradients instead of NaN.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from attn import chunked, scores

IMPLEMENTATIONS = ("matrix", "chunked", "xla")


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    *,
    score: str | scores.ScoreFn | scores.Score = "scaled_dot",
    score_params: Any = None,
    implementation: str = "matrix",
    q_chunk: int = 128,
    k_chunk: int = 128,
) -> tuple[jax.Array, jax.Array | None]:
    """Attend queries q to keys k, mixing values v.

    Args:
      q: [Lq, d] queries.  k: [Lk, d] keys.  v: [Lk, dv] values.
      mask: bool [Lk] or [Lq, Lk], True = may attend; None = attend everywhere.
      score: a name in ``attn.scores.SCORES``, a ``Score``, or ``fn(params, q_LxD, k_MxD)``.
      score_params: params for parameterized scores (from ``get_score(score).init``).
      implementation: "matrix" | "chunked" | "xla".
      q_chunk, k_chunk: chunk sizes for "chunked" (any length works; the tail is padded).

    Returns:
      out [Lq, dv] in v.dtype, and weights [Lq, Lk] (float32, or float64 for float64 inputs)
      for "matrix", None otherwise. Weight rows sum to 1 over allowed keys, are exactly 0 on
      masked keys, and are all 0 (as is the output row) when a query may attend nowhere.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    mask = None if mask is None else jnp.asarray(mask)
    sc = scores.get_score(score)
    _check(q, k, v, mask, sc, score_params, implementation, q_chunk, k_chunk)
    if implementation == "matrix":
        return _matrix(q, k, v, mask, sc, score_params)
    if implementation == "chunked":
        out = chunked.attention(
            q, k, v, mask, score=sc, score_params=score_params, q_chunk=q_chunk, k_chunk=k_chunk
        )
        return out, None
    return _xla(q, k, v, mask), None


def _matrix(
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    v_MxE: jax.Array,
    mask: jax.Array | None,
    sc: scores.Score,
    params: Any,
) -> tuple[jax.Array, jax.Array]:
    s_LxM = sc.fn(params, q_LxD, k_MxD)
    f = jnp.result_type(s_LxM, jnp.float32)
    s_LxM = s_LxM.astype(f)
    if mask is not None:
        s_LxM = jnp.where(mask, s_LxM, scores.MASKED)
    w_LxM = jax.nn.softmax(s_LxM, axis=-1)
    out_LxE = jnp.einsum("lm,me->le", w_LxM, v_MxE.astype(f))
    if mask is not None:
        # exp(MASKED - max) is exactly 0, so only a fully masked row (a uniform softmax over
        # masked keys) needs fixing; zeroing its output row costs O(L*E), not O(L*M).
        any_L1 = jnp.broadcast_to(mask, s_LxM.shape).any(axis=-1, keepdims=True)
        out_LxE = jnp.where(any_L1, out_LxE, 0)
        w_LxM = jnp.where(any_L1, w_LxM, 0)  # dead code under jit unless the caller reads it
    return out_LxE.astype(v_MxE.dtype), w_LxM


def _xla(q_LxD: jax.Array, k_MxD: jax.Array, v_MxE: jax.Array, mask: jax.Array | None) -> jax.Array:
    d, e = q_LxD.shape[-1], v_MxE.shape[-1]
    dtype = jnp.result_type(q_LxD, k_MxD, v_MxE)
    # dot_product_attention wants value and key of one shape and dtype: zero-pad the narrower
    # side (zeros change neither q.k nor the mix of v) and pass the scale for the true d.
    w = max(d, e)
    q_LxW = jnp.pad(q_LxD.astype(dtype), ((0, 0), (0, w - d)))
    k_MxW = jnp.pad(k_MxD.astype(dtype), ((0, 0), (0, w - d)))
    v_MxW = jnp.pad(v_MxE.astype(dtype), ((0, 0), (0, w - e)))
    mask_1x1xLxM = None
    if mask is not None:
        mask_LxM = jnp.broadcast_to(mask, (q_LxD.shape[0], k_MxD.shape[0]))
        mask_1x1xLxM = mask_LxM[None, None]
    out_1xLx1xW = jax.nn.dot_product_attention(
        q_LxW[None, :, None],
        k_MxW[None, :, None],
        v_MxW[None, :, None],
        mask=mask_1x1xLxM,
        scale=1.0 / math.sqrt(d),
        implementation=None,
    )
    out_LxE = out_1xLx1xW[0, :, 0, :e]
    if mask is not None:
        # XLA averages the values over a fully masked row; the contract says 0.
        out_LxE = jnp.where(mask_LxM.any(axis=-1, keepdims=True), out_LxE, 0)
    return out_LxE.astype(v_MxE.dtype)


def _check(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    sc: scores.Score,
    score_params: Any,
    implementation: str,
    q_chunk: int,
    k_chunk: int,
) -> None:
    """Trace-time validation: shapes and static arguments only, so it costs nothing under jit."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 2:
            raise ValueError(
                f"{name} must be rank 2 ([L, d], one unbatched sequence; vmap for batches/heads);"
                f" got shape {x.shape}"
            )
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k must share d; got q {q.shape} and k {k.shape}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must share Lk; got k {k.shape} and v {v.shape}")
    if mask is not None:
        lq, lk = q.shape[0], k.shape[0]
        if mask.shape not in ((lk,), (lq, lk)):
            raise ValueError(
                f"mask must have shape [Lk]={(lk,)} or [Lq, Lk]={(lq, lk)}; got {mask.shape}"
            )
        if mask.dtype != jnp.bool_:
            raise TypeError(f"mask must be bool (True = may attend); got dtype {mask.dtype}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    if implementation == "xla" and sc.fn is not scores.scaled_dot:
        raise ValueError(
            f"implementation='xla' supports only score='scaled_dot'; got score={sc.name!r}"
        )
    if sc.has_params and score_params is None:
        raise ValueError(
            f"score={sc.name!r} has parameters: pass score_params from "
            f"attn.scores.get_score({sc.name!r}).init(key, d); got score_params=None"
        )
    for name, c in (("q_chunk", q_chunk), ("k_chunk", k_chunk)):
        if isinstance(c, bool) or not isinstance(c, numbers.Integral):
            raise TypeError(f"{name} must be an int; got {c!r} of type {type(c).__name__}")
        if c < 1:
            raise ValueError(f"{name} must be >= 1; got {c}")
