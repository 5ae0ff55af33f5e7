"""Memory-efficient attention: online softmax over key/query chunks (Rabe & Staats, 2021).

Queries are processed one chunk at a time (``lax.map``); for each, a ``lax.scan`` over key chunks
carries a running max m, running sum l and running weighted sum of values acc, so the [Lq, Lk]
score matrix never exists. Masks and position-aware scores are evaluated on each block's
positions, so they cost no O(Lq Lk) memory either.

Backward memory: each scan step is ``jax.checkpoint``-ed, so its scores are recomputed rather
than stored, and so is each query chunk as a whole: otherwise the scan would keep its running
max for every (query, key chunk) pair, 4 bytes * Lq * Lk / k_chunk, which grows as L^2. The
backward pass therefore runs a query chunk's forward scan once more.

Lengths that are not multiples of the chunk sizes are padded by repeating the last real row and
its position, so the score and mask functions only ever see real (q_i, k_j, i, j): zero rows
would make a score such as cosine similarity 0/0, and its gradient NaN. Padded keys are masked
out and padded queries sliced off. Scans (not Python loops) keep compile time independent of the
number of chunks.

Inputs are assumed validated; the public entry point is
``attn.attention.attention(..., implementation="chunked")``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from attn import masks, scores


def attention(
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    v_MxE: jax.Array,
    mask: masks.Mask | None = None,
    *,
    score: str | scores.ScoreFn | scores.Score = "scaled_dot",
    score_params: Any = None,
    q_chunk: int = 128,
    k_chunk: int = 128,
) -> jax.Array:
    """out [Lq, dv] = softmax(score(q, k)) v, chunked; mask as in ``attn.masks`` (True = attend).

    Same values as the matrix form, including output 0 for a query that may attend nowhere.
    """
    sc = scores.get_score(score)
    (lq, d), (lk, e) = q_LxD.shape, v_MxE.shape
    # A chunk longer than the sequence would only add padding.
    cq, ck = max(1, min(q_chunk, lq)), max(1, min(k_chunk, lk))
    nq, nk = -(-lq // cq), -(-lk // ck)
    q_1xD, k_1xD = q_LxD[:1], k_MxD[:1]
    f = jax.eval_shape(
        lambda q, k: scores.evaluate(
            sc, score_params, q, k, jnp.arange(q.shape[0]), jnp.arange(k.shape[0])
        ),
        q_1xD,
        k_1xD,
    ).dtype
    mask_fn = None if mask is None else masks.as_fn(mask)

    q_NxCxD = _pad_edge(q_LxD, nq * cq).reshape(nq, cq, d)
    k_KxCxD = _pad_edge(k_MxD, nk * ck).reshape(nk, ck, d)
    v_KxCxE = _pad_edge(v_MxE, nk * ck).reshape(nk, ck, e)
    qpos_NxC = jnp.minimum(jnp.arange(nq * cq, dtype=jnp.int32), lq - 1).reshape(nq, cq)
    kpos_KxC = jnp.minimum(jnp.arange(nk * ck, dtype=jnp.int32), lk - 1).reshape(nk, ck)
    real_KxC = (jnp.arange(nk * ck) < lk).reshape(nk, ck)

    def one_query_chunk(xs):
        q_CxD, qpos_C = xs

        def step(carry, xs):
            m_C, l_C, acc_CxE = carry
            k_CxD, v_CxE, kpos_C, real_C = xs
            allowed_CxC = jnp.broadcast_to(real_C[None, :], (cq, ck))
            if mask_fn is not None:
                allowed_CxC = allowed_CxC & masks.evaluate(mask_fn, qpos_C, kpos_C)
            s_CxC = scores.evaluate(sc, score_params, q_CxD, k_CxD, qpos_C, kpos_C).astype(f)
            s_CxC = jnp.where(allowed_CxC, s_CxC, masks.MASKED)
            # The max only guards exp against overflow; the result does not depend on it, so
            # holding it constant gives exact gradients without differentiating through max.
            m_new_C = lax.stop_gradient(jnp.maximum(m_C, s_CxC.max(axis=-1)))
            p_CxC = jnp.exp(s_CxC - m_new_C[:, None]) * allowed_CxC
            corr_C = jnp.exp(m_C - m_new_C)
            l_C = l_C * corr_C + p_CxC.sum(axis=-1)
            acc_CxE = acc_CxE * corr_C[:, None] + p_CxC @ v_CxE.astype(f)
            return (m_new_C, l_C, acc_CxE), None

        init = (jnp.full((cq,), masks.MASKED, f), jnp.zeros((cq,), f), jnp.zeros((cq, e), f))
        # prevent_cse=False is safe (and faster) inside scan, per the jax.checkpoint docs.
        (_, l_C, acc_CxE), _ = lax.scan(
            jax.checkpoint(step, prevent_cse=False),
            init,
            (k_KxCxD, v_KxCxE, kpos_KxC, real_KxC),
        )
        # l == 0 only when every key is masked; acc is 0 there too, so the row comes out 0.
        return acc_CxE / jnp.where(l_C > 0, l_C, 1)[:, None]

    out_NxCxE = lax.map(jax.checkpoint(one_query_chunk, prevent_cse=False), (q_NxCxD, qpos_NxC))
    return out_NxCxE.reshape(nq * cq, e)[:lq].astype(v_MxE.dtype)


def _pad_edge(x_LxD: jax.Array, n: int) -> jax.Array:
    """Pad the first axis to length n by repeating the last row."""
    return jnp.pad(x_LxD, ((0, n - x_LxD.shape[0]), (0, 0)), mode="edge")
