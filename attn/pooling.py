"""Padding-aware pooling of encoder states H [L, D] into one vector.

mask_L is True on real tokens. Every pooling ignores padding completely, so appending PAD tokens
never changes the pooled vector, and an all-padding sequence pools to finite zeros.
"""

import jax
import jax.numpy as jnp

from attn import layers, masks

__all__ = ["cls_pool", "max_pool", "mean_pool", "structured", "structured_init"]


def cls_pool(h_LxD: jax.Array, mask_L: jax.Array) -> jax.Array:
    """State at position 0 (the pipeline puts CLS there) -> [D]; zeros if it is padding."""
    return jnp.where(mask_L[0], h_LxD[0], jnp.zeros((), h_LxD.dtype))


def mean_pool(h_LxD: jax.Array, mask_L: jax.Array) -> jax.Array:
    """Mean over real tokens -> [D] (accumulated in float32)."""
    m_L1 = mask_L[:, None].astype(jnp.float32)
    total_D = (h_LxD.astype(jnp.float32) * m_L1).sum(0)
    return (total_D / jnp.maximum(m_L1.sum(), 1.0)).astype(h_LxD.dtype)


def max_pool(h_LxD: jax.Array, mask_L: jax.Array) -> jax.Array:
    """Channel-wise max over real tokens -> [D]; padding never wins."""
    lowest = jnp.finfo(h_LxD.dtype).min
    best_D = jnp.where(mask_L[:, None], h_LxD, lowest).max(0)
    return jnp.where(mask_L.any(), best_D, jnp.zeros((), h_LxD.dtype))


def structured_init(key: jax.Array, d_model: int, hidden: int, hops: int) -> layers.Params:
    """Lin et al. 2017 weights: {"w1": [D, d_a], "w2": [d_a, r]} (no biases, as in the paper)."""
    k1, k2 = jax.random.split(key)
    return {
        "w1": layers.dense_init(k1, d_model, hidden, bias=False)["w"],
        "w2": layers.dense_init(k2, hidden, hops, bias=False)["w"],
    }


def structured(
    params: layers.Params, h_LxD: jax.Array, mask_L: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Structured self-attentive pooling (Lin et al. 2017, "A Structured Self-Attentive Sentence
    Embedding").

    A = softmax_L(W2 tanh(W1 Hᵀ)) with padding masked, M = A H flattened.
    Returns (m [r*D] in h's dtype, a [r, L] float32, penalty = ‖A Aᵀ − I‖²_F float32 scalar).
    """
    dt = h_LxD.dtype
    s_LxA = jnp.tanh(h_LxD @ params["w1"].astype(dt))
    e_RxL = (s_LxA @ params["w2"].astype(dt)).T
    a_RxL, live_R1 = masks.softmax(e_RxL, mask_L[None, :])
    a_RxL = jnp.where(live_R1, a_RxL, 0.0)  # an all-padding sequence gives zero weights
    m_RxD = a_RxL @ h_LxD.astype(jnp.float32)
    g_RxR = a_RxL @ a_RxL.T
    penalty = jnp.sum(jnp.square(g_RxR - jnp.eye(g_RxR.shape[0], dtype=jnp.float32)))
    return m_RxD.reshape(-1).astype(dt), a_RxL, penalty
