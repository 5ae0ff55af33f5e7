"""Masks: which keys each query may attend to, and the softmax that honours them.

A mask is True where query i may attend to key j. It is given as one of
  - a bool array [Lk] (the same keys for every query, e.g. key padding) or [Lq, Lk];
  - a function ``fn(q_pos_L, k_pos_M) -> bool [L, M]`` of absolute int32 positions (0 is the
    first query / key). The matrix form evaluates it once on all positions; the chunked form
    evaluates it on one block of positions at a time, so a mask costs no O(Lq Lk) memory there.

Masked scores become ``MASKED`` (large and finite, never -inf) and the softmax runs in at least
float32, so a query that may attend nowhere gets weights 0 and finite gradients instead of NaN.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable

import jax
import jax.numpy as jnp

MaskFn = Callable[[jax.Array, jax.Array], jax.Array]
Mask = jax.Array | MaskFn

# The score a masked key gets: far below any real score yet finite (unlike -inf), so that
# exp(MASKED - max) underflows to exactly 0 and a fully masked row stays NaN-free.
MASKED = -1e30


def causal(q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
    """Query i sees keys j <= i."""
    return k_pos_M[None, :] <= q_pos_L[:, None]


def _window(q_pos_L: jax.Array, k_pos_M: jax.Array, *, left: int, right: int) -> jax.Array:
    offset_LxM = k_pos_M[None, :] - q_pos_L[:, None]
    return (offset_LxM >= -left) & (offset_LxM <= right)


def sliding_window(left: int, right: int) -> MaskFn:
    """Query i sees keys i - left ... i + right (right=0: causal and local)."""
    for name, n in (("left", left), ("right", right)):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"sliding_window: {name} must be an int >= 0; got {n!r}")
    return functools.partial(_window, left=int(left), right=int(right))


def _same_segment(
    q_pos_L: jax.Array, k_pos_M: jax.Array, *, q_seg: jax.Array, k_seg: jax.Array
) -> jax.Array:
    return q_seg[q_pos_L][:, None] == k_seg[k_pos_M][None, :]


def segments(q_seg_L: jax.Array, k_seg_M: jax.Array | None = None) -> MaskFn:
    """Query i sees key j when they carry the same segment id (packed sequences).

    k_seg_M defaults to q_seg_L (self-attention). Ids are any integers.
    """
    q_seg = jnp.asarray(q_seg_L)
    k_seg = q_seg if k_seg_M is None else jnp.asarray(k_seg_M)
    return functools.partial(_same_segment, q_seg=q_seg, k_seg=k_seg)


def _from_array(q_pos_L: jax.Array, k_pos_M: jax.Array, *, m: jax.Array) -> jax.Array:
    if m.ndim == 1:
        return m[k_pos_M][None, :]
    return m[q_pos_L[:, None], k_pos_M[None, :]]


def _all(q_pos_L: jax.Array, k_pos_M: jax.Array, *, fns: tuple[MaskFn, ...]) -> jax.Array:
    allowed_LxM = jnp.ones((q_pos_L.shape[0], k_pos_M.shape[0]), bool)
    for fn in fns:
        allowed_LxM = allowed_LxM & evaluate(fn, q_pos_L, k_pos_M)
    return allowed_LxM


def as_fn(mask: Mask) -> MaskFn:
    """A mask as a function of positions (arrays are indexed by the positions)."""
    if callable(mask):
        return mask
    return functools.partial(_from_array, m=jnp.asarray(mask))


def all_of(*masks: Mask) -> MaskFn:
    """Query i sees key j when every mask allows it, e.g. ``all_of(causal, key_padding_M)``."""
    return functools.partial(_all, fns=tuple(as_fn(m) for m in masks))


def _name(fn: MaskFn) -> str:
    """A short name for messages (a partial's repr would print the arrays it holds)."""
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "mask")


def evaluate(fn: MaskFn, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
    """bool [L, M] from a mask function; TypeError/ValueError (at trace time) for a bad one."""
    allowed = fn(q_pos_L, k_pos_M)
    shape = (q_pos_L.shape[0], k_pos_M.shape[0])
    if getattr(allowed, "dtype", None) != jnp.bool_:
        raise TypeError(
            f"a mask function must return bool (True = may attend); {_name(fn)} returned "
            f"{getattr(allowed, 'dtype', type(allowed).__name__)}"
        )
    if allowed.ndim != 2 or any(
        n not in (1, want) for n, want in zip(allowed.shape, shape, strict=True)
    ):
        raise ValueError(
            f"a mask function must return [Lq, Lk] (or a shape that broadcasts to it) for "
            f"positions [Lq], [Lk]; {_name(fn)} returned {allowed.shape} for {shape}"
        )
    return jnp.broadcast_to(allowed, shape)


def matrix(mask: Mask | None, lq: int, lk: int) -> jax.Array | None:
    """The whole mask as bool [Lq, Lk] (or [1, Lk] for a key mask), None for no mask."""
    if mask is None:
        return None
    if callable(mask):
        return evaluate(mask, jnp.arange(lq, dtype=jnp.int32), jnp.arange(lk, dtype=jnp.int32))
    mask = jnp.asarray(mask)
    return mask[None, :] if mask.ndim == 1 else mask


def softmax(s_LxM: jax.Array, allowed_LxM: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Row softmax over the allowed entries, in at least float32 -> (w [L, M], live [L, 1]).

    Masked entries of w are exactly 0. live is False for a row with nothing allowed, whose w is
    uniform instead of 0: the caller zeroes what it returns from such rows. Attention zeroes
    its [L, E] output rather than the [L, M] weights it multiplies, which would make XLA keep a
    second [L, M] buffer for the backward pass.
    """
    s_LxM = s_LxM.astype(jnp.result_type(s_LxM, jnp.float32))
    if allowed_LxM is None:
        return jax.nn.softmax(s_LxM, axis=-1), jnp.ones((s_LxM.shape[0], 1), bool)
    # exp(MASKED - max) underflows to exactly 0 unless the whole row is masked.
    w_LxM = jax.nn.softmax(jnp.where(allowed_LxM, s_LxM, MASKED), axis=-1)
    live_L1 = jnp.broadcast_to(allowed_LxM, s_LxM.shape).any(axis=-1, keepdims=True)
    return w_LxM, live_L1
