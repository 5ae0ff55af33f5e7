"""Flax wrappers around the pure `attn.multihead` so Flax models can use our attention.

Both modules hold exactly the `multihead.init` param tree (linen: variables["params"]; nnx: the
`mha` attribute, one nnx.Param per leaf) and call `multihead.apply`, so params move freely between
the pure functions and either module. Inputs may carry any leading batch axes: x [..., L, D] with
mask [..., L] (True = real token), [..., L, L], or one function of positions for every sequence
(`attn.masks`); d_model is read from x.

`score` decides the params (`multihead.init`); `attend` runs the attention, by default
`attn.attention` with that score. Pass e.g. ``functools.partial(attn.attention, score=score,
implementation="chunked")`` for another implementation: its score must be `score`.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from attn import masks, multihead, scores
from attn.attention import attention


def _attend(score: str | scores.Score, attend: multihead.Attend | None) -> multihead.Attend:
    return functools.partial(attention, score=score) if attend is None else attend


def _apply_batched(
    params, x_xLxD, mask: masks.Mask | None, **kw
) -> tuple[jax.Array, jax.Array | None]:
    """multihead.apply vmapped over every leading axis of x."""
    batch_axes = x_xLxD.ndim - 2
    mask_axis = None
    if mask is None:
        mask = jnp.ones(x_xLxD.shape[:-1], bool)
    if not callable(mask):
        mask = jnp.asarray(mask)
        keys, pairs = x_xLxD.shape[:-1], (*x_xLxD.shape[:-1], x_xLxD.shape[-2])
        if mask.shape not in (keys, pairs):
            raise ValueError(
                f"mask shape {mask.shape} must be x.shape[:-1] = {keys} (key padding) or "
                f"{pairs} (query x key), or a function of positions"
            )
        mask_axis = 0
    fn = functools.partial(multihead.apply, **kw)
    for _ in range(batch_axes):
        fn = jax.vmap(fn, in_axes=(None, 0, mask_axis))
    return fn(params, x_xLxD, mask)


class SelfAttention(nn.Module):
    """flax.linen multi-head self-attention; params are `multihead.init(key, D, num_heads, ...)`.

    `__call__(x, mask=None, return_weights=False)` -> y [..., L, D] (and weights [..., H, L, L] or
    None when return_weights).
    """

    num_heads: int
    score: str | scores.Score = "scaled_dot"
    attend: multihead.Attend | None = None
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask: masks.Mask | None = None, return_weights: bool = False):
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
            params, x, mask, num_heads=self.num_heads, attend=_attend(self.score, self.attend)
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
        attend: multihead.Attend | None = None,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        params = multihead.init(rngs.params(), d_model, num_heads, score=score, dtype=param_dtype)
        self.mha = nnx.data(jax.tree.map(nnx.Param, params))
        self.num_heads = num_heads
        self.attend = _attend(score, attend)

    def pure_params(self) -> dict:
        """The plain-array tree `multihead.apply` takes."""
        return jax.tree.map(
            lambda v: v[...], self.mha, is_leaf=lambda v: isinstance(v, nnx.Variable)
        )

    def __call__(self, x: jax.Array, mask: masks.Mask | None = None, return_weights: bool = False):
        y, w = _apply_batched(
            self.pure_params(), x, mask, num_heads=self.num_heads, attend=self.attend
        )
        return (y, w) if return_weights else y
