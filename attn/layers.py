"""Small building blocks as pure functions: dense, layer norm, dropout.

Params are plain dicts of float32 arrays; apply functions compute in the dtype of their input, so a
bfloat16 activation runs the matmul in bfloat16 while the stored weights stay float32.
"""

import jax
import jax.numpy as jnp

__all__ = [
    "Params",
    "dense",
    "dense_init",
    "dropout",
    "embed_init",
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


def dropout(x: jax.Array, rate: float, *, train: bool, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout: identity unless train; train with rate > 0 needs rng."""
    if not train or rate == 0.0:
        return x
    if rng is None:
        raise ValueError("dropout: train=True with rate > 0 needs an rng key, got rng=None")
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


def embed_init(
    key: jax.Array, n: int, d: int, *, stddev: float = 1.0, dtype=jnp.float32
) -> jax.Array:
    """Embedding table [n, d] ~ N(0, stddev²)."""
    return stddev * jax.random.normal(key, (n, d), dtype)
