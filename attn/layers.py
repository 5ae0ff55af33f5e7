"""Small building blocks as pure functions: dense, layer norm, dropout and its masks.

Params are plain dicts of float32 arrays; apply functions compute in the dtype of their input, so a
bfloat16 activation runs the matmul in bfloat16 while the stored weights stay float32.
"""

import math

import jax
import jax.numpy as jnp

__all__ = [
    "Params",
    "dense",
    "dense_init",
    "dropout",
    "embed_init",
    "keep_mask",
    "layer_norm",
    "layer_norm_init",
]

Params = dict[str, jax.Array]


def dense_init(
    key: jax.Array, d_in: int, d_out: int, *, bias: bool = True, dtype=jnp.float32
) -> Params:
    """Linear layer {"w": [d_in, d_out], "b": [d_out]} with Xavier-uniform weights, zero bias."""
    limit = (6.0 / (d_in + d_out)) ** 0.5
    params = {"w": jax.random.uniform(key, (d_in, d_out), dtype, -limit, limit)}
    if bias:
        params["b"] = jnp.zeros((d_out,), dtype)
    return params


def dense(params: Params, x_xX: jax.Array) -> jax.Array:
    """x [..., d_in] -> [..., d_out], computed in x's dtype."""
    y = x_xX @ params["w"].astype(x_xX.dtype)
    if "b" in params:
        y = y + params["b"].astype(x_xX.dtype)
    return y


def layer_norm_init(d: int, dtype=jnp.float32) -> Params:
    """{"scale": ones [d], "bias": zeros [d]}."""
    return {"scale": jnp.ones((d,), dtype), "bias": jnp.zeros((d,), dtype)}


def layer_norm(params: Params, x_xD: jax.Array, eps: float = 1e-6) -> jax.Array:
    """Normalise the last axis; statistics in float32 because bfloat16 variance is too coarse."""
    x32 = x_xD.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps) * params["scale"] + params["bias"]
    return y.astype(x_xD.dtype)


def keep_mask(rng: jax.Array, rate: float, shape: tuple[int, ...]) -> tuple[jax.Array, float]:
    """Which entries dropout at `rate` keeps (bool [shape]) and the factor the kept ones are
    scaled by: 1 / the keep probability, so the expectation is exact.

    An entry is dropped when 16 random bits fall below round(rate * 2^16): the drop probability
    is the rate rounded to a multiple of 2^-16 (0.1 drops with probability 0.1000061), where
    `jax.random.bernoulli` resolves 2^-23. The bits are all 64 of each threefry block (the data
    of `jax.random.split`'s keys, four entries a block) where bernoulli spends a block and a
    float conversion on each entry: a mask costs under a quarter of bernoulli's time on CPU
    (benchmarks/probes/dropout_masks.py). Keys as `jax.random.split` gives them draw independent
    masks, under `jax.vmap` too.
    """
    size = math.prod(shape)
    threshold = min(round(rate * 2**16), 2**16 - 1)  # a rate just under 1 keeps 1 in 2^16
    width = jax.random.key_data(rng).shape[-1]  # uint32 words per key: 2 for threefry
    blocks = max(1, -(-size // (2 * width)))
    words_NxW = jax.random.key_data(jax.random.split(rng, blocks))
    # Compared before they are laid out, so the layout moves bools, not words; part by part
    # (entry p * N + i is part p of block i), which costs less than interleaving.
    words = [words_NxW[:, j] for j in range(width)]
    keep = jnp.concatenate([half >= threshold for w in words for half in (w & 0xFFFF, w >> 16)])
    return keep[:size].reshape(shape), 2**16 / (2**16 - threshold)


def dropout(x: jax.Array, rate: float, *, train: bool, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout (`keep_mask`'s draw): identity unless train; train with rate > 0 needs
    rng."""
    if not train or rate == 0.0:
        return x
    if rng is None:
        raise ValueError("dropout: train=True with rate > 0 needs an rng key, got rng=None")
    keep, scale = keep_mask(rng, rate, x.shape)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


def embed_init(
    key: jax.Array, n: int, d: int, *, stddev: float = 1.0, dtype=jnp.float32
) -> jax.Array:
    """Embedding table [n, d] ~ N(0, stddev²)."""
    return stddev * jax.random.normal(key, (n, d), dtype)
