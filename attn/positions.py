"""Position embeddings: a learned table or fixed sinusoids (Vaswani et al. 2017)."""

import jax
import jax.numpy as jnp
import numpy as np

from attn import layers

__all__ = ["learned", "learned_init", "sinusoidal"]


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
