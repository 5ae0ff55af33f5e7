"""Memory-efficient attention: online softmax over key/query chunks (Rabe & Staats, 2021).

Queries are processed one chunk at a time (``lax.map``); for each, a ``lax.scan`` over key chunks
carries a running max m, running sum l and running weighted sum of values acc, so the [Lq, Lk]
score matrix never exists. Masks and position-aware scores are evaluated on each block's
positions, so they cost no O(Lq Lk) memory either.

Backward memory: each scan step is ``jax.checkpoint``-ed, so its scores are recomputed rather
than stored, and so is each query chunk as a whole: otherwise the scan would keep its running
max for every (query, key chunk) pair, 4 bytes * Lq * Lk / k_chunk, which grows as L^2. The
backward pass therefore runs a query chunk's forward scan once more.

Lengths need not be multiples of the chunk sizes: the last chunk is shifted back to end at the
last row, overlapping the chunk before it; keys seen twice are masked the second time and the
repeated query rows dropped. So the score and mask functions only ever see real (q_i, k_j, i,
j), whereas padding with zero rows would make a score such as cosine similarity 0/0 and its
gradient NaN, and padded copies of q, k, v and their gradients would cost memory. Scans (not
Python loops) keep compile time independent of the number of chunks.

Inputs are assumed validated; the public entry point is
``attn.attention.attention(..., implementation="chunked")``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from attn import masks, scores

__all__ = ["attention"]


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
    fully_masked: str = "zero",
) -> jax.Array:
    """out [Lq, dv] = softmax(score(q, k)) v, chunked; mask as in ``attn.masks`` (True = attend).

    Same values as the matrix form, including output 0 (or the mean of v, with
    fully_masked="mean") for a query that may attend nowhere.
    """
    sc = scores.get_score(score)
    lq, lk, e = q_LxD.shape[0], k_MxD.shape[0], v_MxE.shape[1]
    if lq == 0 or lk == 0:  # no queries, or nothing to attend to: the output rows are 0
        return jnp.zeros((lq, e), v_MxE.dtype)
    cq, ck = min(q_chunk, lq), min(k_chunk, lk)
    nq, nk = -(-lq // cq), -(-lk // ck)
    pos_1 = jnp.zeros((1,), jnp.int32)
    f = jax.eval_shape(
        lambda q, k: scores.evaluate(sc, score_params, q, k, pos_1, pos_1), q_LxD[:1], k_MxD[:1]
    ).dtype
    mean_E = v_MxE.astype(f).mean(axis=0) if fully_masked == "mean" else None
    mask_fn = None if mask is None else masks.as_fn(mask)
    # Chunk i starts at min(i * c, L - c): the last chunk overlaps the one before it instead of
    # running past the end, so every row a chunk holds is real.
    q_starts_N = jnp.minimum(jnp.arange(nq, dtype=jnp.int32) * cq, lq - cq)
    k_starts_K = jnp.minimum(jnp.arange(nk, dtype=jnp.int32) * ck, lk - ck)
    kpos_KxC = k_starts_K[:, None] + jnp.arange(ck, dtype=jnp.int32)[None, :]
    # Keys before i * c were seen by the chunk before. A [K, C] table read per step, rather than
    # a comparison fused into every [C, C] loop, keeps the forward as fast as before.
    new_KxC = kpos_KxC >= (jnp.arange(nk, dtype=jnp.int32) * ck)[:, None]

    def one_query_chunk(q_start):
        q_CxD = lax.dynamic_slice_in_dim(q_LxD, q_start, cq)
        qpos_C = q_start + jnp.arange(cq, dtype=jnp.int32)

        def step(carry, xs):
            m_C, l_C, acc_CxE = carry
            k_start, kpos_C, new_C = xs
            k_CxD = lax.dynamic_slice_in_dim(k_MxD, k_start, ck)
            v_CxE = lax.dynamic_slice_in_dim(v_MxE, k_start, ck)
            allowed_CxC = jnp.broadcast_to(new_C[None, :], (cq, ck))
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
            jax.checkpoint(step, prevent_cse=False), init, (k_starts_K, kpos_KxC, new_KxC)
        )
        # l == 0 only when every key is masked; acc is 0 there too, so the row comes out 0.
        out_CxE = acc_CxE / jnp.where(l_C > 0, l_C, 1)[:, None]
        if mean_E is not None:
            out_CxE = jnp.where((l_C > 0)[:, None], out_CxE, mean_E)
        return out_CxE

    out_NxCxE = lax.map(jax.checkpoint(one_query_chunk, prevent_cse=False), q_starts_N)
    # The last chunk's first rows repeat rows of the chunk before it.
    tail = lq - (nq - 1) * cq
    out_LxE = jnp.concatenate([out_NxCxE[:-1].reshape(-1, e), out_NxCxE[-1, cq - tail :]])
    return out_LxE.astype(v_MxE.dtype)
