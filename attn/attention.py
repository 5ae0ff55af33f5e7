"""Attention for one unbatched sequence: out = softmax(score(Q, K)) V with a mask.

Batches and heads come from ``jax.vmap``. Three implementations share one contract:
  "matrix"   all queries at once as matrix products; returns the weights.
  "chunked"  online softmax over key/query chunks (attn.chunked), O(L) memory; weights None.
  "xla"      ``jax.nn.dot_product_attention`` (XLA or cuDNN); scaled_dot only; weights None.

Scores (``attn.scores``) may depend on absolute positions, and masks (``attn.masks``) may be
functions of positions; both see query i and key j as positions i and j. Masked scores are set
to a large finite negative (never -inf) and the softmax runs in at least float32, then rows with
nothing allowed are zeroed: such a row gives weights 0, output 0 and finite gradients.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from attn import chunked, masks, scores

IMPLEMENTATIONS = ("matrix", "chunked", "xla")


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: masks.Mask | None = None,
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
      mask: True = may attend; a bool array [Lk] or [Lq, Lk], a function of positions
        ``fn(q_pos_L, k_pos_M) -> bool [L, M]`` (``attn.masks``), or None = attend everywhere.
      score: a name in ``attn.scores.SCORES``, a ``Score``, or ``fn(params, q_LxD, k_MxD)``
        (plus ``*, q_pos, k_pos`` if it needs positions).
      score_params: params for parameterized scores (from ``get_score(score).init``).
      implementation: "matrix" | "chunked" | "xla".
      q_chunk, k_chunk: chunk sizes for "chunked" (any length works: the last chunk overlaps
        the one before it).

    Returns:
      out [Lq, dv] in v.dtype, and weights [Lq, Lk] (float32, or float64 for float64 inputs)
      for "matrix", None otherwise. Weight rows sum to 1 over allowed keys, are exactly 0 on
      masked keys, and are all 0 (as is the output row) when a query may attend nowhere.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if mask is not None and not callable(mask):
        mask = jnp.asarray(mask)
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
    mask: masks.Mask | None,
    sc: scores.Score,
    params: Any,
) -> tuple[jax.Array, jax.Array]:
    lq, lk = q_LxD.shape[0], k_MxD.shape[0]
    pos_L, pos_M = jnp.arange(lq, dtype=jnp.int32), jnp.arange(lk, dtype=jnp.int32)
    s_LxM = scores.evaluate(sc, params, q_LxD, k_MxD, pos_L, pos_M)
    w_LxM, live_L1 = masks.softmax(s_LxM, masks.matrix(mask, lq, lk))
    out_LxE = jnp.einsum("lm,me->le", w_LxM, v_MxE.astype(w_LxM.dtype))
    out_LxE = jnp.where(live_L1, out_LxE, 0)
    w_LxM = jnp.where(live_L1, w_LxM, 0)  # dead code under jit unless the caller reads it
    return out_LxE.astype(v_MxE.dtype), w_LxM


def _xla(
    q_LxD: jax.Array, k_MxD: jax.Array, v_MxE: jax.Array, mask: masks.Mask | None
) -> jax.Array:
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
        lq, lk = q_LxD.shape[0], k_MxD.shape[0]
        mask_LxM = jnp.broadcast_to(masks.matrix(mask, lq, lk), (lq, lk))
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
    mask: masks.Mask | None,
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
    if mask is not None and not callable(mask):
        lq, lk = q.shape[0], k.shape[0]
        if mask.shape not in ((lk,), (lq, lk)):
            raise ValueError(
                f"mask must have shape [Lk]={(lk,)} or [Lq, Lk]={(lq, lk)}, or be a function of "
                f"positions; got {mask.shape}"
            )
        if mask.dtype != jnp.bool_:
            raise TypeError(f"mask must be bool (True = may attend); got dtype {mask.dtype}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    if implementation == "xla":
        _check_xla(q, k, v, sc)
    _check_score_params(sc, score_params, q.shape[1])
    for name, c in (("q_chunk", q_chunk), ("k_chunk", k_chunk)):
        if isinstance(c, bool) or not isinstance(c, numbers.Integral):
            raise TypeError(f"{name} must be an int; got {c!r} of type {type(c).__name__}")
        if c < 1:
            raise ValueError(f"{name} must be >= 1; got {c}")


def _check_xla(q: jax.Array, k: jax.Array, v: jax.Array, sc: scores.Score) -> None:
    """What jax.nn.dot_product_attention cannot do, refused by name instead of failing inside."""
    if sc.fn is not scores.scaled_dot:
        raise ValueError(
            f"implementation='xla' supports only score='scaled_dot'; got score={sc.name!r}"
        )
    dtype = jnp.result_type(q, k, v)
    if dtype == jnp.float64:
        raise ValueError(
            "implementation='xla' computes in float32 at most, so float64 inputs would silently "
            "lose precision; use implementation='matrix' or 'chunked'"
        )
    if dtype == jnp.float16 and jax.default_backend() == "cpu":
        raise ValueError(
            "implementation='xla' cannot run float16 on CPU (XLA's CPU dot has no float16 "
            "kernel); use bfloat16, float32, or implementation='matrix' or 'chunked'"
        )


def _paths(tree: Any) -> list[str]:
    return sorted(jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0])


def _check_score_params(sc: scores.Score, score_params: Any, d: int) -> None:
    if sc.has_params is False and score_params is not None:
        raise ValueError(
            f"score={sc.name!r} takes no parameters; got score_params (a params tree built for "
            "another score?)"
        )
    if not sc.has_params:
        return
    if score_params is None:
        raise ValueError(
            f"score={sc.name!r} has parameters: pass score_params from "
            f"attn.scores.get_score({sc.name!r}).init(key, d); got score_params=None"
        )
    expected = _paths(jax.eval_shape(lambda: sc.init(jax.random.key(0), d)))
    got = _paths(score_params)
    if got != expected:
        raise ValueError(
            f"score_params for score={sc.name!r} must hold {expected} (as "
            f"get_score({sc.name!r}).init(key, d) builds them); got {got}"
        )
