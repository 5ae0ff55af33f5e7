"""Memory-efficient attention: online softmax over key/query chunks (Rabe & Staats, 2021).

Queries are processed one chunk at a time (``lax.map``); for each, a ``lax.scan`` over key chunks
carries a running max m, running sum l and running weighted sum of values acc, so the [Lq, Lk]
score matrix never exists. Each scan step is ``jax.checkpoint``-ed: the backward pass recomputes a
chunk's scores instead of storing them, so training also stays out of O(Lq Lk) memory. Lengths
that are not multiples of the chunk sizes are padded with masked keys / extra queries that are
sliced off. Scans (not Python loops) keep compile time independent of the number of chunks.

Inputs are assumed validated; the public entry point is
``attn.attention.attention(..., implementation="chunked")``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from attn import scores


def attention(
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    v_MxE: jax.Array,
    mask: jax.Array | None = None,
    *,
    score: str | scores.ScoreFn | scores.Score = "scaled_dot",
    score_params: Any = None,
    q_chunk: int = 128,
    k_chunk: int = 128,
) -> jax.Array:
    """out [Lq, dv] = softmax(score(q, k)) v, chunked; mask bool [Lk] or [Lq, Lk] (True = attend).

    Same values as the matrix form, including output 0 for a query that may attend nowhere.
    """
    sc = scores.get_score(score)
    (lq, d), (lk, e) = q_LxD.shape, v_MxE.shape
    # A chunk longer than the sequence would only add padding.
    cq, ck = max(1, min(q_chunk, lq)), max(1, min(k_chunk, lk))
    nq, nk = -(-lq // cq), -(-lk // ck)
    f = jnp.result_type(jax.eval_shape(sc.fn, score_params, q_LxD[:1], k_MxD[:1]), jnp.float32)

    q_NxCxD = _pad_to(q_LxD, nq * cq, axis=0).reshape(nq, cq, d)
    k_KxCxD = _pad_to(k_MxD, nk * ck, axis=0).reshape(nk, ck, d)
    v_KxCxE = _pad_to(v_MxE, nk * ck, axis=0).reshape(nk, ck, e)
    # Padded keys are masked out; padded queries attend to whatever and are sliced off.
    keep_M = jnp.arange(nk * ck) < lk
    if mask is not None and mask.ndim == 1:
        keep_M = keep_M & _pad_to(mask, nk * ck, axis=0)
    keep_KxC = keep_M.reshape(nk, ck)
    rows_NxKxCxC = None
    if mask is not None and mask.ndim == 2:
        padded = _pad_to(_pad_to(mask, nq * cq, axis=0), nk * ck, axis=1)
        rows_NxKxCxC = padded.reshape(nq, cq, nk, ck).transpose(0, 2, 1, 3)

    def one_query_chunk(xs):
        q_CxD, rows_KxCxC = xs

        def step(carry, xs):
            m_C, l_C, acc_CxE = carry
            k_CxD, v_CxE, keep_C, rows_CxC = xs
            allowed_CxC = keep_C[None, :] if rows_CxC is None else keep_C[None, :] & rows_CxC
            s_CxC = sc.fn(score_params, q_CxD, k_CxD).astype(f)
            s_CxC = jnp.where(allowed_CxC, s_CxC, scores.MASKED)
            # The max only guards exp against overflow; the result does not depend on it, so
            # holding it constant gives exact gradients without differentiating through max.
            m_new_C = lax.stop_gradient(jnp.maximum(m_C, s_CxC.max(axis=-1)))
            p_CxC = jnp.exp(s_CxC - m_new_C[:, None]) * allowed_CxC
            corr_C = jnp.exp(m_C - m_new_C)
            l_C = l_C * corr_C + p_CxC.sum(axis=-1)
            acc_CxE = acc_CxE * corr_C[:, None] + p_CxC @ v_CxE.astype(f)
            return (m_new_C, l_C, acc_CxE), None

        init = (jnp.full((cq,), scores.MASKED, f), jnp.zeros((cq,), f), jnp.zeros((cq, e), f))
        # prevent_cse=False is safe (and faster) inside scan, per the jax.checkpoint docs.
        (_, l_C, acc_CxE), _ = lax.scan(
            jax.checkpoint(step, prevent_cse=False),
            init,
            (k_KxCxD, v_KxCxE, keep_KxC, rows_KxCxC),
        )
        # l == 0 only when every key is masked; acc is 0 there too, so the row comes out 0.
        return acc_CxE / jnp.where(l_C > 0, l_C, 1)[:, None]

    out_NxCxE = lax.map(one_query_chunk, (q_NxCxD, rows_NxKxCxC))
    return out_NxCxE.reshape(nq * cq, e)[:lq].astype(v_MxE.dtype)


def _pad_to(x: jax.Array, n: int, *, axis: int) -> jax.Array:
    """Zero/False-pad ``x`` along ``axis`` to length n."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, n - x.shape[axis])
    return jnp.pad(x, widths)
