"""Flax wrappers around the pure `attn.multihead` so Flax models can use our attention.

Both modules hold exactly the `multihead.init` param tree (linen: variables["params"]; nnx: the
`mha` attribute, one nnx.Param per leaf) and call `multihead.apply`, so params move freely between
the pure functions and either module. Inputs may carry any leading batch axes: x [..., L, D] with
mask [..., L] (True = real token); d_model is read from x.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from attn import multihead, scores


def _apply_batched(params, x_xLxD, mask_xL, **kw) -> tuple[jax.Array, jax.Array | None]:
    """multihead.apply vmapped over every leading axis of x."""
    if mask_xL is None:
        mask_xL = jnp.ones(x_xLxD.shape[:-1], bool)
    if mask_xL.shape != x_xLxD.shape[:-1]:
        raise ValueError(
            f"mask shape {mask_xL.shape} must equal x.shape[:-1] = {x_xLxD.shape[:-1]}"
        )
    fn = functools.partial(multihead.apply, **kw)
    for _ in range(x_xLxD.ndim - 2):
        fn = jax.vmap(fn, in_axes=(None, 0, 0))
    return fn(params, x_xLxD, mask_xL)


class SelfAttention(nn.Module):
    """flax.linen multi-head self-attention; params are `multihead.init(key, D, num_heads, ...)`.

    `__call__(x, mask=None, return_weights=False)` -> y [..., L, D] (and weights [..., H, L, L] or
    None when return_weights).
    """

    num_heads: int
    score: str = "scaled_dot"
    implementation: str = "matrix"
    q_chunk: int = 128
    k_chunk: int = 128
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array | None = None, return_weights: bool = False):
        d_model = x.shape[-1]
        make = functools.partial(
            multihead.init,
            d_model=d_model,
            num_heads=self.num_heads,
            score=self.score,
            dtype=self.param_dtype,
        )
        # One linen param per top-level entry keeps variables["params"] identical to the pure tree;
        # each entry's init builds the whole (small) tree and keeps its own part.
        names = jax.eval_shape(make, jax.random.key(0)).keys()
        params = {n: self.param(n, lambda key, n=n: make(key)[n]) for n in names}
        y, w = _apply_batched(
            params,
            x,
            mask,
            num_heads=self.num_heads,
            score=self.score,
            implementation=self.implementation,
            q_chunk=self.q_chunk,
            k_chunk=self.k_chunk,
        )
        return (y, w) if return_weights else y


class NnxSelfAttention(nnx.Module):
    """flax.nnx multi-head self-attention holding `multihead.init`'s tree as nnx.Params in `mha`."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        score: str | scores.Score = "scaled_dot",
        implementation: str = "matrix",
        q_chunk: int = 128,
        k_chunk: int = 128,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        params = multihead.init(rngs.params(), d_model, num_heads, score=score, dtype=param_dtype)
        self.mha = nnx.data(jax.tree.map(nnx.Param, params))
        self.num_heads = num_heads
        self.score = score
        self.implementation = implementation
        self.q_chunk = q_chunk
        self.k_chunk = k_chunk

    def pure_params(self) -> dict:
        """The plain-array tree `multihead.apply` takes."""
        return jax.tree.map(
            lambda v: v[...], self.mha, is_leaf=lambda v: isinstance(v, nnx.Variable)
        )

    def __call__(self, x: jax.Array, mask: jax.Array | None = None, return_weights: bool = False):
        y, w = _apply_batched(
            self.pure_params(),
            x,
            mask,
            num_heads=self.num_heads,
            score=self.score,
            implementation=self.implementation,
            q_chunk=self.q_chunk,
            k_chunk=self.k_chunk,
        )
        return (y, w) if return_weights else y
