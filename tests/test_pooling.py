"""Pooling vs numpy references; padding never contributes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close32

from attn import pooling

L, D = 6, 5
# Tolerances are `conftest.tol32`'s: structured pooling's weights pass through sums over D, its
# hidden width 7 and a softmax over L; the pooled vector a sum over L more; the penalty the r x r
# Gram matrix of the weights besides.


def _h_and_mask(n_real: int, seed: int = 0):
    h = np.array(jax.random.normal(jax.random.key(seed), (L, D)))
    # Padding rows hold huge values: any leak into a pooled vector shows.
    mask = np.arange(L) < n_real
    h[~mask] = 1e6
    return h, mask


def test_mean_max_cls_match_numpy():
    h, mask = _h_and_mask(4)
    assert_close32(pooling.mean_pool(h, mask), h[:4].mean(0), 4)
    np.testing.assert_array_equal(pooling.max_pool(h, mask), h[:4].max(0))  # picked, not summed
    np.testing.assert_array_equal(pooling.cls_pool(h, mask), h[0])


def test_max_pool_padding_never_wins_against_negative_values():
    h = -np.ones((L, D), np.float32) * np.arange(1, L + 1, dtype=np.float32)[:, None]
    mask = np.array([False, True, True, False, False, False])
    h[0] = 0.0  # padding larger than every real value
    np.testing.assert_array_equal(pooling.max_pool(h, mask), np.full(D, -2.0))


@pytest.mark.parametrize("fn", [pooling.mean_pool, pooling.max_pool, pooling.cls_pool])
def test_all_padding_gives_finite_zeros(fn):
    h, mask = _h_and_mask(0)
    out = fn(jnp.asarray(h), jnp.asarray(mask))
    np.testing.assert_array_equal(out, np.zeros(D))


def _structured_numpy(p, h, mask):
    e = np.tanh(h @ p["w1"]) @ p["w2"]  # [L, r]
    e = e.T
    a = np.zeros_like(e)
    ex = np.exp(e[:, mask] - e[:, mask].max(1, keepdims=True))
    a[:, mask] = ex / ex.sum(1, keepdims=True)
    m = a @ np.where(mask[:, None], h, 0.0)
    pen = np.linalg.norm(a @ a.T - np.eye(a.shape[0]), "fro") ** 2
    return m.reshape(-1), a, pen


def test_structured_matches_numpy_and_masks_padding():
    r, da = 3, 7
    params = pooling.structured_init(jax.random.key(1), D, da, r)
    assert params["w1"].shape == (D, da) and params["w2"].shape == (da, r)
    h, mask = _h_and_mask(4, seed=2)
    h[~mask] = 3.0  # finite so the numpy reference stays finite
    m, a, pen = pooling.structured(params, jnp.asarray(h), jnp.asarray(mask))
    p64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m_ref, a_ref, pen_ref = _structured_numpy(p64, h.astype(np.float64), mask)

    assert m.shape == (r * D,) and a.shape == (r, L)
    assert_close32(a.sum(-1), np.ones(r), 2 * L)
    np.testing.assert_array_equal(a[:, ~mask], 0.0)
    assert_close32(a, a_ref, D + 7 + 2 * L)
    assert_close32(m, m_ref, D + 7 + 3 * L)
    assert_close32(pen, pen_ref, D + 7 + 3 * L + 9)


def test_structured_all_padding_is_finite_zero_with_finite_grads():
    params = pooling.structured_init(jax.random.key(3), D, 4, 2)
    h, mask = _h_and_mask(0)
    m, a, pen = pooling.structured(params, jnp.asarray(h), jnp.asarray(mask))
    np.testing.assert_array_equal(m, 0.0)
    np.testing.assert_array_equal(a, 0.0)
    np.testing.assert_array_equal(pen, 2.0)  # ‖0 − I‖² = r, exactly
    g = jax.grad(lambda p: pooling.structured(p, jnp.asarray(h), jnp.asarray(mask))[2])(params)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(g))
