"""attn.layers' dropout masks: the rate to within 2^-17, an exact expectation, independent
entries and keys, the same masks under vmap as one key at a time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn import layers

N = 2**20  # entries per statistical check: 5 binomial standard deviations are about 0.0015


def _five_sigma(p: float, n: int) -> float:
    return 5 * (p * (1 - p) / n) ** 0.5


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9, 0.99])
def test_keep_mask_drops_the_rate_rounded_to_16_bits_and_scales_exactly(rate):
    keep, scale = layers.keep_mask(jax.random.key(0), rate, (N,))
    threshold = round(rate * 2**16)
    p_keep = 1 - threshold / 2**16
    assert abs(p_keep - (1 - rate)) <= 2**-17
    assert scale == pytest.approx(
        1 / p_keep, rel=1e-15
    )  # the expectation of a kept-and-scaled entry is exactly x
    assert keep.dtype == jnp.bool_ and keep.shape == (N,)
    assert abs(float(keep.mean()) - p_keep) < _five_sigma(p_keep, N)


@pytest.mark.parametrize("rate", [0.0, 1e-7])  # 1e-7 rounds to a drop probability of 0
def test_keep_mask_keeps_all_at_a_rate_of_0(rate):
    keep, scale = layers.keep_mask(jax.random.key(1), rate, (4096,))
    assert bool(keep.all()) and scale == 1.0


def test_keep_mask_keeps_1_in_2_16_at_rates_next_to_1():
    keep, scale = layers.keep_mask(jax.random.key(1), 1 - 1e-7, (N,))
    p_keep = 2**-16  # a rate that rounds to 1 would keep nothing, and scale by infinity
    assert scale == 2**16
    assert abs(float(keep.mean()) - p_keep) < _five_sigma(p_keep, N)


def test_keep_mask_entries_and_keys_are_independent():
    # Four entries share a threefry block (entries i, i + N/4, i + N/2, i + 3N/4 for N a
    # multiple of 4); they and neighbouring entries must still be uncorrelated.
    keep, _ = layers.keep_mask(jax.random.key(2), 0.5, (N,))
    k = np.asarray(keep, np.float64)
    for parts_4xM in (k.reshape(4, -1), k.reshape(-1, 4).T):  # same block; neighbours
        corr = np.corrcoef(parts_4xM)[np.triu_indices(4, 1)]
        assert np.abs(corr).max() < 5 / (N / 4) ** 0.5
    keys = jax.random.split(jax.random.key(3), 2)
    a, b = (np.asarray(layers.keep_mask(k, 0.5, (N,))[0]) for k in keys)
    assert abs((a == b).mean() - 0.5) < _five_sigma(0.5, N)


def test_keep_mask_under_vmap_is_each_key_s_own_and_any_shape_works():
    keys = jax.random.split(jax.random.key(4), 3)
    shape = (3, 5, 7)  # 105 entries: the last threefry block is used in part
    batched = jax.vmap(lambda k: layers.keep_mask(k, 0.3, shape)[0])(keys)
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(batched[i], layers.keep_mask(k, 0.3, shape)[0])
    legacy = jax.random.PRNGKey(4)  # raw uint32 keys draw too
    assert layers.keep_mask(legacy, 0.3, shape)[0].shape == shape


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_dropout_is_unbiased(rate):
    """E[dropout(x)] = x: sum(dropout(x) - x) has mean 0 and variance sum(x^2) (1 - p) / p."""
    x = jax.random.normal(jax.random.key(6), (N,), jnp.float32) + 1.0
    y = np.asarray(layers.dropout(x, rate, train=True, rng=jax.random.key(7)), np.float64)
    x = np.asarray(x, np.float64)
    keep, scale = layers.keep_mask(jax.random.key(7), rate, (N,))
    kept = np.asarray(keep)
    np.testing.assert_allclose(y[kept], x[kept] * scale, rtol=2**-22)  # two float32 roundings
    assert not y[~kept].any()
    p_keep = 1 / scale
    sigma = ((x**2).sum() * (1 - p_keep) / p_keep) ** 0.5
    assert abs((y - x).sum()) < 5 * sigma


def test_dropout_only_in_training():
    x = jnp.ones((N,), jnp.float32)
    assert layers.dropout(x, 0.1, train=False, rng=None) is x
    assert layers.dropout(x, 0.0, train=True, rng=None) is x
    with pytest.raises(ValueError, match="needs an rng key"):
        layers.dropout(x, 0.1, train=True, rng=None)
    half = layers.dropout(x.astype(jnp.bfloat16), 0.1, train=True, rng=jax.random.key(5))
    assert half.dtype == jnp.bfloat16
