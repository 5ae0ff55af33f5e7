"""Flax modules around attn's pure functions: multi-head attention for linen and nnx.

`MultiHeadAttention` (linen) and `NnxMultiHeadAttention` (nnx) do what Flax's
``linen.MultiHeadDotProductAttention`` and ``nnx.MultiHeadAttention`` do without a decode cache:
  - self- or cross-attention: ``inputs_q [batch..., T, D]``, ``inputs_k``, ``inputs_v``
    ``[batch..., S, C]`` (inputs_k defaults to inputs_q, inputs_v to inputs_k);
  - attention dropout (``dropout_rate``, ``broadcast_dropout``) unless ``deterministic``, drawn
    as Flax draws it (linen: ``make_rng("dropout")``; nnx: the ``dropout`` stream of its rngs);
  - masks: bool arrays that broadcast to ``[batch..., num_heads, T, S]`` (missing axes are
    leading ones: a shared [T, S], per-head [B, H, T, S], key padding [B, 1, 1, S]), or mask
    functions (``attn.masks``), shared by every row or one per row (``masks.segments`` with ids
    [batch..., L], ``masks.lengths`` with lengths [batch...]);
plus attn's scores and implementations. `SelfAttention` / `NnxSelfAttention` are the same
modules called on one input: ``module(x, mask)``.

They hold exactly `multihead.init`'s param tree (linen: variables["params"]; nnx: the `mha`
attribute, one nnx.Param per leaf) and compute with `attn.dot_product_attention`, so params move
freely between the pure functions and either module. Every setting is a plain hashable value
(strings and numbers), so equal settings give one trace under ``jax.jit``/``nnx.jit``, whatever
the instance.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

try:
    import flax.linen as nn
    from flax import nnx
except ModuleNotFoundError as e:  # Flax is optional: the rest of attn runs without it
    if e.name != "flax":
        raise
    raise ModuleNotFoundError(
        'attn.flax_interop needs Flax, which is not installed: pip install "attn[flax]"',
        name="flax",
    ) from None

from attn import batched, masks, multihead, scores

__all__ = ["MultiHeadAttention", "NnxMultiHeadAttention", "NnxSelfAttention", "SelfAttention"]


def _flat_mask(
    mask: masks.Mask | None, batch: tuple[int, ...], h: int, t: int, s: int
) -> masks.Mask | None:
    """A mask for inputs with batch axes `batch`, for the same inputs flattened to one axis."""
    nb = len(batch)
    if mask is None:
        return None
    if callable(mask):
        fn = masks.as_fn(mask)
        if fn.batch_shape in ((), batch):
            flat = lambda axis, x: x if axis is None else x.reshape(-1, *x.shape[nb:])
            return jax.tree.map(flat, fn.batch_axes(), fn, is_leaf=lambda x: x is None)
        raise ValueError(
            f"mask {fn.name} has batch shape {fn.batch_shape}; the inputs' batch shape is {batch}"
        )
    mask = jnp.asarray(mask)
    want = (*batch, h, t, s)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be bool (True = may attend); got dtype {mask.dtype}")
    m = (
        mask.reshape((1,) * (len(want) - mask.ndim) + mask.shape)
        if mask.ndim <= len(want)
        else mask
    )
    if mask.ndim > len(want) or any(n not in (1, w) for n, w in zip(m.shape, want, strict=True)):
        raise ValueError(
            f"mask has shape {mask.shape}, which does not broadcast to [batch..., num_heads, T, "
            f"S] = {want} (missing axes are leading ones; key padding [B, S] is "
            "mask[:, None, None, :])"
        )
    if all(n == 1 for n in m.shape[:nb]):
        return m.reshape(1, *m.shape[nb:])
    return jnp.broadcast_to(m, (*batch, *m.shape[nb:])).reshape(-1, *m.shape[nb:])


def _forward(
    params: dict,
    inputs_q: jax.Array,
    inputs_k: jax.Array | None,
    inputs_v: jax.Array | None,
    mask: masks.Mask | None,
    *,
    num_heads: int,
    score: Any,
    implementation: str,
    q_chunk: int,
    k_chunk: int,
    dropout_rate: float,
    dropout_rng: jax.Array | None,
    broadcast_dropout: bool,
) -> tuple[jax.Array, jax.Array | None]:
    """Projections, `attn.dot_product_attention` over the flattened batch, output projection."""
    inputs_k = inputs_q if inputs_k is None else inputs_k
    inputs_v = inputs_k if inputs_v is None else inputs_v
    if inputs_q.ndim < 2:
        raise ValueError(f"inputs_q must be [batch..., T, D]; got shape {inputs_q.shape}")
    batch, (t, d_model) = inputs_q.shape[:-2], inputs_q.shape[-2:]
    if (
        inputs_k.ndim != inputs_q.ndim
        or inputs_k.shape[:-2] != batch
        or inputs_v.shape != inputs_k.shape
    ):
        raise ValueError(
            f"inputs_k and inputs_v must be [batch..., S, C] with inputs_q's batch axes "
            f"{batch}, one S and one C; got inputs_q {inputs_q.shape}, inputs_k "
            f"{inputs_k.shape}, inputs_v {inputs_v.shape}"
        )
    s, d_kv = inputs_k.shape[-2:]
    multihead.check_params(params, d_model, d_kv, num_heads)

    def project(name: str, x: jax.Array) -> jax.Array:
        return multihead.heads(params[name], x.reshape(-1, *x.shape[-2:]), num_heads)

    out, w = batched.dot_product_attention(
        project("q", inputs_q),
        project("k", inputs_k),
        project("v", inputs_v),
        mask=_flat_mask(mask, batch, num_heads, t, s),
        score=score,
        score_params=params.get("score"),
        implementation=implementation,
        q_chunk=q_chunk,
        k_chunk=k_chunk,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
        broadcast_dropout=broadcast_dropout,
        return_weights=True,
    )
    y = multihead.merge(params, out, inputs_q.dtype).reshape(*batch, t, d_model)
    return y, None if w is None else w.reshape(*batch, num_heads, t, s)


def _deterministic(module: Any, deterministic: bool | None) -> bool:
    """The call's flag over the module's, as Flax resolves it; needed only with dropout."""
    if module.dropout_rate == 0.0:
        return True
    flag = module.deterministic if deterministic is None else deterministic
    if flag is None:
        raise ValueError(
            f"dropout_rate={module.dropout_rate}: pass deterministic=True or False to the "
            "module or to the call"
        )
    return flag


class MultiHeadAttention(nn.Module):
    """flax.linen multi-head attention; params are ``multihead.init(key, D, num_heads,
    score=score, d_kv=C)``.

    ``__call__(inputs_q, inputs_k=None, inputs_v=None, *, inputs_kv=None, mask=None,
    deterministic=None, dropout_rng=None, return_weights=False)`` -> y [batch..., T, D] (and the
    weights [batch..., H, T, S], before dropout, or None when the implementation forms none).
    """

    num_heads: int
    score: str | scores.ScoreFn = "scaled_dot"
    implementation: str = "matrix"
    q_chunk: int = 128
    k_chunk: int = 128
    dropout_rate: float = 0.0
    broadcast_dropout: bool = True
    deterministic: bool | None = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_k: jax.Array | None = None,
        inputs_v: jax.Array | None = None,
        *,
        inputs_kv: jax.Array | None = None,
        mask: masks.Mask | None = None,
        deterministic: bool | None = None,
        dropout_rng: jax.Array | None = None,
        return_weights: bool = False,
    ):
        if inputs_kv is not None:  # linen's older name for keys and values from one input
            if inputs_k is not None or inputs_v is not None:
                raise ValueError("pass inputs_kv, or inputs_k (and inputs_v), not both")
            inputs_k = inputs_v = inputs_kv
        return _linen_call(
            self, inputs_q, inputs_k, inputs_v, mask, deterministic, dropout_rng, return_weights
        )


class SelfAttention(MultiHeadAttention):
    """`MultiHeadAttention` on one input: ``__call__(x, mask=None, return_weights=False, *,
    deterministic=None, dropout_rng=None)``."""

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        mask: masks.Mask | None = None,
        return_weights: bool = False,
        *,
        deterministic: bool | None = None,
        dropout_rng: jax.Array | None = None,
    ):
        return _linen_call(self, x, None, None, mask, deterministic, dropout_rng, return_weights)


def _linen_call(
    module: MultiHeadAttention,
    inputs_q: jax.Array,
    inputs_k: jax.Array | None,
    inputs_v: jax.Array | None,
    mask: masks.Mask | None,
    deterministic: bool | None,
    dropout_rng: jax.Array | None,
    return_weights: bool,
):
    d_kv = (inputs_q if inputs_k is None else inputs_k).shape[-1]
    make = functools.partial(
        multihead.init,
        d_model=inputs_q.shape[-1],
        num_heads=module.num_heads,
        score=module.score,
        dtype=module.param_dtype,
        d_kv=d_kv,
    )
    # One linen param per top-level entry keeps variables["params"] identical to the pure tree;
    # each entry's init builds the whole (small) tree and keeps its own part.
    names = jax.eval_shape(make, jax.random.key(0)).keys()
    params = {n: module.param(n, lambda key, n=n: make(key)[n]) for n in names}
    rate = 0.0 if _deterministic(module, deterministic) else module.dropout_rate
    if rate > 0.0 and dropout_rng is None:
        dropout_rng = module.make_rng("dropout")
    y, w = _forward(
        params, inputs_q, inputs_k, inputs_v, mask, num_heads=module.num_heads,
        score=module.score, implementation=module.implementation, q_chunk=module.q_chunk,
        k_chunk=module.k_chunk, dropout_rate=rate, dropout_rng=dropout_rng,
        broadcast_dropout=module.broadcast_dropout,
    )  # fmt: skip
    return (y, w) if return_weights else y


class NnxMultiHeadAttention(nnx.Module):
    """flax.nnx multi-head attention holding `multihead.init`'s tree as nnx.Params in `mha`.

    ``NnxMultiHeadAttention(num_heads, in_features, *, in_kv_features=None, score, ..., rngs)``;
    ``__call__(inputs_q, inputs_k=None, inputs_v=None, *, mask=None, deterministic=None,
    rngs=None, return_weights=False)``. With dropout, the module keeps a fork of
    ``rngs.dropout`` (as ``nnx.MultiHeadAttention`` does); ``rngs`` at call time take precedence.
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        *,
        in_kv_features: int | None = None,
        score: str | scores.ScoreFn = "scaled_dot",
        implementation: str = "matrix",
        q_chunk: int = 128,
        k_chunk: int = 128,
        dropout_rate: float = 0.0,
        broadcast_dropout: bool = True,
        deterministic: bool | None = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        params = multihead.init(
            rngs.params(), in_features, num_heads, score=score, dtype=param_dtype,
            d_kv=in_kv_features,
        )  # fmt: skip
        self.mha = nnx.data(jax.tree.map(nnx.Param, params))
        self.num_heads = num_heads
        self.score = score
        self.implementation = implementation
        self.q_chunk, self.k_chunk = q_chunk, k_chunk
        self.dropout_rate = dropout_rate
        self.broadcast_dropout = broadcast_dropout
        self.deterministic = deterministic
        self.rngs = rngs.dropout.fork() if dropout_rate > 0.0 else None

    def pure_params(self) -> dict:
        """The plain-array tree `multihead.apply` takes."""
        return jax.tree.map(
            lambda v: v[...], self.mha, is_leaf=lambda v: isinstance(v, nnx.Variable)
        )

    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_k: jax.Array | None = None,
        inputs_v: jax.Array | None = None,
        *,
        mask: masks.Mask | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        return_weights: bool = False,
    ):
        rate = 0.0 if _deterministic(self, deterministic) else self.dropout_rate
        dropout_rng = None
        if rate > 0.0:
            stream = self.rngs if rngs is None else rngs
            stream = stream.dropout if isinstance(stream, nnx.Rngs) else stream
            if stream is None:
                raise ValueError("dropout needs rngs: pass rngs to the module or to the call")
            dropout_rng = stream()
        y, w = _forward(
            self.pure_params(), inputs_q, inputs_k, inputs_v, mask, num_heads=self.num_heads,
            score=self.score, implementation=self.implementation, q_chunk=self.q_chunk,
            k_chunk=self.k_chunk, dropout_rate=rate, dropout_rng=dropout_rng,
            broadcast_dropout=self.broadcast_dropout,
        )  # fmt: skip
        return (y, w) if return_weights else y


class NnxSelfAttention(NnxMultiHeadAttention):
    """`NnxMultiHeadAttention` on one input: ``NnxSelfAttention(d_model, num_heads, *, ...,
    rngs)``, ``__call__(x, mask=None, return_weights=False, *, deterministic=None, rngs=None)``."""

    def __init__(self, d_model: int, num_heads: int, **kw: Any):
        super().__init__(num_heads, d_model, **kw)

    def __call__(
        self,
        x: jax.Array,
        mask: masks.Mask | None = None,
        return_weights: bool = False,
        *,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | nnx.RngStream | None = None,
    ):
        return super().__call__(
            x, mask=mask, deterministic=deterministic, rngs=rngs, return_weights=return_weights
        )
