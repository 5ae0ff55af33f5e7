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
    q_starts_Q = jnp.minimum(jnp.arange(nq, dtype=jnp.int32) * cq, lq - cq)
    k_starts_Z = jnp.minimum(jnp.arange(nk, dtype=jnp.int32) * ck, lk - ck)
    kpos_ZxJ = k_starts_Z[:, None] + jnp.arange(ck, dtype=jnp.int32)[None, :]
    # Keys before i * c were seen by the chunk before. A [Z, J] table read per step, rather than
    # a comparison fused into every [I, J] loop, keeps the forward as fast as before.
    new_ZxJ = kpos_ZxJ >= (jnp.arange(nk, dtype=jnp.int32) * ck)[:, None]

    def one_query_chunk(q_start):
        q_IxD = lax.dynamic_slice_in_dim(q_LxD, q_start, cq)
        qpos_I = q_start + jnp.arange(cq, dtype=jnp.int32)

        def step(carry, xs):
            m_I, l_I, acc_IxE = carry
            k_start, kpos_J, new_J = xs
            k_JxD = lax.dynamic_slice_in_dim(k_MxD, k_start, ck)
            v_JxE = lax.dynamic_slice_in_dim(v_MxE, k_start, ck)
            allowed_IxJ = jnp.broadcast_to(new_J[None, :], (cq, ck))
            if mask_fn is not None:
                allowed_IxJ = allowed_IxJ & masks.evaluate(mask_fn, qpos_I, kpos_J)
            s_IxJ = scores.evaluate(sc, score_params, q_IxD, k_JxD, qpos_I, kpos_J).astype(f)
            s_IxJ = jnp.where(allowed_IxJ, s_IxJ, masks.MASKED)
            # The max only guards exp against overflow; the result does not depend on it, so
            # holding it constant gives exact gradients without differentiating through max.
            m_new_I = lax.stop_gradient(jnp.maximum(m_I, s_IxJ.max(axis=-1)))
            p_IxJ = jnp.exp(s_IxJ - m_new_I[:, None]) * allowed_IxJ
            corr_I = jnp.exp(m_I - m_new_I)
            l_I = l_I * corr_I + p_IxJ.sum(axis=-1)
            acc_IxE = acc_IxE * corr_I[:, None] + p_IxJ @ v_JxE.astype(f)
            return (m_new_I, l_I, acc_IxE), None

        init = (jnp.full((cq,), masks.MASKED, f), jnp.zeros((cq,), f), jnp.zeros((cq, e), f))
        # prevent_cse=False is safe (and faster) inside scan, per the jax.checkpoint docs.
        (_, l_I, acc_IxE), _ = lax.scan(
            jax.checkpoint(step, prevent_cse=False), init, (k_starts_Z, kpos_ZxJ, new_ZxJ)
        )
        # l == 0 only when every key is masked; acc is 0 there too, so the row comes out 0.
        out_IxE = acc_IxE / jnp.where(l_I > 0, l_I, 1)[:, None]
        if mean_E is not None:
            out_IxE = jnp.where((l_I > 0)[:, None], out_IxE, mean_E)
        return out_IxE

    out_QxIxE = lax.map(jax.checkpoint(one_query_chunk, prevent_cse=False), q_starts_Q)
    # The last chunk's first rows repeat rows of the chunk before it.
    tail = lq - (nq - 1) * cq
    out_LxE = jnp.concatenate([out_QxIxE[:-1].reshape(-1, e), out_QxIxE[-1, cq - tail :]])
    return out_LxE.astype(v_MxE.dtype)
