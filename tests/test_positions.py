"""Rotary positions (`attn.positions.rotary`) against a float64 complex-number reference, and the
properties that make it a position encoding: lengths kept, scores relative."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn import positions

EPS32 = float(np.finfo(np.float32).eps)


def _rotary_reference(x, pos, theta):
    """Channel c and c + K/2 as one complex number, multiplied by exp(i pos theta^(-2c/K))."""
    x = np.asarray(x, np.float64)
    k = x.shape[-1]
    z = x[..., : k // 2] + 1j * x[..., k // 2 :]
    freq = theta ** (-np.arange(k // 2) * 2.0 / k)
    z = z * np.exp(1j * np.asarray(pos, np.float64)[:, None] * freq)
    return np.concatenate([z.real, z.imag], axis=-1)


def _tolerance(x, pos):
    """float32 rounds the angle pos * f to a relative EPS32 (and f itself), so the rotation is
    off by about 2 * pos * EPS32 radians; a few more EPS32 for cos, sin and the products."""
    return float(np.abs(x).max()) * EPS32 * (2 * float(np.max(pos)) + 8)


@pytest.mark.parametrize("theta", [10000.0, 160000.0])
def test_rotary_is_the_pairwise_rotation(theta):
    x = jax.random.normal(jax.random.key(0), (3, 9, 8))
    pos = jnp.array([0, 1, 2, 5, 7, 11, 20, 33, 40], jnp.int32)
    got = positions.rotary(x, pos, theta=theta)
    assert got.shape == x.shape and got.dtype == jnp.float32
    want = _rotary_reference(x, pos, theta)
    assert np.abs(np.asarray(got) - want).max() < _tolerance(x, pos)
    np.testing.assert_array_equal(got[:, 0], x[:, 0])  # position 0: no rotation, exactly


def test_rotary_keeps_lengths_and_makes_scores_relative():
    kq, kk = jax.random.split(jax.random.key(1))
    q_LxK, k_LxK = jax.random.normal(kq, (6, 16)), jax.random.normal(kk, (6, 16))
    pos = jnp.arange(6, dtype=jnp.int32)
    rq, rk = positions.rotary(q_LxK, pos), positions.rotary(k_LxK, pos)
    each = _tolerance(np.concatenate([q_LxK, k_LxK]), pos + 30)  # one rotated value's error
    # A vector's length is off by at most sqrt(K) of its values' errors ...
    np.testing.assert_allclose(
        np.linalg.norm(rq, axis=-1), np.linalg.norm(q_LxK, axis=-1), atol=4 * each
    )
    # ... and a score by K of them, each times the other side's largest value, on both sides.
    tol = 2 * 16 * each * float(np.abs(np.concatenate([q_LxK, k_LxK])).max())
    # Shifting every position by 30 changes no score: q_i . k_j sees i - j alone.
    sq, sk = positions.rotary(q_LxK, pos + 30), positions.rotary(k_LxK, pos + 30)
    assert np.abs(np.asarray(rq @ rk.T) - np.asarray(sq @ sk.T)).max() < 2 * tol
    # ... while the scores do depend on it: they differ from the unrotated ones.
    assert np.abs(np.asarray(rq @ rk.T) - np.asarray(q_LxK @ k_LxK.T)).max() > 0.1


def test_rotary_of_bfloat16_rounds_once_in_its_dtype():
    x = jax.random.normal(jax.random.key(2), (2, 5, 8))
    pos = jnp.arange(5, dtype=jnp.int32)
    got = positions.rotary(x.astype(jnp.bfloat16), pos)
    assert got.dtype == jnp.bfloat16
    want = np.asarray(positions.rotary(x.astype(jnp.bfloat16).astype(jnp.float32), pos))
    # One rounding to bfloat16's 8 significant bits: within half an ulp, 2^-8 of the value.
    assert np.all(np.abs(np.asarray(got, np.float32) - want) <= np.abs(want) * 2.0**-8 + 1e-30)


def test_rotary_jits_and_differentiates():
    x = jax.random.normal(jax.random.key(3), (4, 6))
    pos = jnp.arange(4, dtype=jnp.int32)
    f = jax.jit(lambda x, p: positions.rotary(x, p, theta=500.0))
    np.testing.assert_allclose(f(x, pos), positions.rotary(x, pos, theta=500.0), atol=1e-6)
    # A rotation's Jacobian is orthogonal: the gradient of |R x|^2 / 2 is x.
    g = jax.grad(lambda x: 0.5 * jnp.sum(positions.rotary(x, pos) ** 2))(x)
    np.testing.assert_allclose(g, x, atol=1e-5)


@pytest.mark.parametrize(
    "x_shape, pos_shape, theta, words",
    [
        ((4, 7), (4,), 10000.0, "even K"),
        ((7,), (7,), 10000.0, "even K"),
        ((4, 8), (5,), 10000.0, "positions must be [L] = [4]"),
        ((4, 8), (4,), 0.0, "theta must be a number > 0"),
        ((4, 8), (4,), True, "theta must be a number > 0"),
    ],
)
def test_rotary_refuses_what_it_cannot_rotate_in_one_line(x_shape, pos_shape, theta, words):
    with pytest.raises(ValueError) as e:
        positions.rotary(jnp.zeros(x_shape), jnp.zeros(pos_shape, jnp.int32), theta=theta)
    assert words in str(e.value) and "\n" not in str(e.value)
