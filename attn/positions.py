"""Positions: embeddings added to the tokens (a learned table, or fixed sinusoids as in Vaswani
et al. 2017), or a transform of each head's queries and keys (rotary, Su et al. 2021), which
`attn.multihead.apply` takes as ``qk_transform``."""

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from attn import layers

__all__ = ["learned", "learned_init", "rotary", "sinusoidal"]


def learned_init(key: jax.Array, max_len: int, d_model: int, *, stddev: float = 0.02) -> jax.Array:
    """Learned position table [max_len, d_model]."""
    return layers.embed_init(key, max_len, d_model, stddev=stddev)


def learned(table_XxD: jax.Array, length: int) -> jax.Array:
    """First `length` rows of the table [X = max_len, D] -> [length, D]; longer than the table is
    a ValueError."""
    max_len = table_XxD.shape[0]
    if length > max_len:
        raise ValueError(
            f"sequence length {length} exceeds max_len={max_len} of the learned position table; "
            "raise max_len or truncate the input"
        )
    return table_XxD[:length]


def sinusoidal(length: int, d_model: int) -> jax.Array:
    """Fixed [length, d_model] table: sin on even, cos on odd channels, wavelengths up to 10^4·2π.

    Built in numpy because both sizes are static; under jit it becomes a constant.
    """
    pos_L1 = np.arange(length, dtype=np.float64)[:, None]
    freq = np.exp(-np.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    table = np.zeros((length, d_model), np.float64)
    table[:, 0::2] = np.sin(pos_L1 * freq)
    table[:, 1::2] = np.cos(pos_L1 * freq[: d_model // 2])
    return jnp.asarray(table, jnp.float32)


def rotary(x_xLxK: jax.Array, pos_L: jax.Array, *, theta: float = 10000.0) -> jax.Array:
    """Rotary position embedding (RoFormer, Su et al. 2021) of queries or keys x [..., L, K] at
    int positions [L]: channel c < K/2 and channel c + K/2 form a pair, rotated by the angle
    pos * theta^(-2c/K). A rotation keeps each vector's length, and rotating q_i by i and k_j by
    j turns q_i . k_j into a function of q_i, k_j and i - j alone: the score sees relative
    positions, and padding or chunking cannot change it.

    This is the half-split pairing of GPT-NeoX and Hugging Face's ``rotate_half`` (x cos +
    rotate_half(x) sin, with rotate_half(x) = [-x2, x1]), not RoFormer's interleaved (2c, 2c+1)
    pairs; both are one rotation, of differently ordered channels. The frequencies are rounded
    once from float64 and the angles and products computed in at least float32 (as Hugging Face
    computes them), so a bfloat16 x is rounded once, on return in its own dtype.
    """
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not theta > 0:
        raise ValueError(f"rotary: theta must be a number > 0; got {theta!r}")
    k = x_xLxK.shape[-1]
    if x_xLxK.ndim < 2 or k % 2:
        raise ValueError(
            f"rotary: x must be [..., L, K] with an even K (channels rotate in pairs); got shape "
            f"{x_xLxK.shape}"
        )
    if jnp.shape(pos_L) != x_xLxK.shape[-2:-1]:
        raise ValueError(
            f"rotary: positions must be [L] = [{x_xLxK.shape[-2]}] for x {x_xLxK.shape}; got "
            f"shape {jnp.shape(pos_L)}"
        )
    inv_freq = 1.0 / float(theta) ** (np.arange(0, k, 2, dtype=np.float64) / k)
    f = jnp.result_type(x_xLxK.dtype, jnp.float32)
    angle_LxK2 = jnp.asarray(pos_L, f)[:, None] * jnp.asarray(inv_freq, f)[None, :]
    cos_LxK2, sin_LxK2 = jnp.cos(angle_LxK2), jnp.sin(angle_LxK2)
    x1, x2 = jnp.split(x_xLxK.astype(f), 2, axis=-1)
    out = jnp.concatenate([x1 * cos_LxK2 - x2 * sin_LxK2, x2 * cos_LxK2 + x1 * sin_LxK2], axis=-1)
    return out.astype(x_xLxK.dtype)
