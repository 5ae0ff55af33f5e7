"""Masks: which keys each query may attend to, and the softmax that honours them.

A mask is True where query i may attend to key j. It is given as one of
  - a bool array that broadcasts to [Lq, Lk]: [Lk] (the same keys for every query, e.g. key
    padding), [Lq, Lk], [1, Lk], [Lq, 1];
  - a function ``fn(q_pos_L, k_pos_M) -> bool [L, M]`` of absolute int32 positions (0 is the
    first query / key). The matrix form evaluates it once on all positions; the chunked form
    evaluates it on one block of positions at a time, so a mask costs no O(Lq Lk) memory there.

The functions built here (``causal``, ``sliding_window``, ``segments``, ``lengths``, ``all_of``,
``as_fn``) are pytrees: the arrays they hold are leaves, so they pass through ``jax.jit`` and
``jax.vmap`` as ordinary arguments. Each also knows the lengths its arrays must have and is
checked against the Lq and Lk it is used with, at trace time: indexing a too-short array by
position would clamp, and silently reuse its last entry. ``segments`` and ``lengths`` may hold a
leading batch axis (ids [B, L], lengths [B]): one mask per row of ``attn.dot_product_attention``
(``batch_shape``, ``batch_axes``).

Masked scores become ``MASKED`` (large and finite, never -inf) and the softmax runs in at least
float32, so a query that may attend nowhere gets weights 0 and finite gradients instead of NaN.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "MASKED",
    "Factors",
    "Mask",
    "MaskFn",
    "MaskFunction",
    "all_of",
    "as_fn",
    "causal",
    "check",
    "evaluate",
    "factor",
    "lengths",
    "matrix",
    "pairs",
    "segments",
    "sliding_window",
    "softmax",
]

MaskFn = Callable[[jax.Array, jax.Array], jax.Array]
Mask = jax.Array | MaskFn

# The score a masked key gets: far below any real score yet finite (unlike -inf), so that
# exp(MASKED - max) underflows to exactly 0 and a fully masked row stays NaN-free.
MASKED = -1e30


def pairs(a: jax.Array, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
    """Entries (i, j) of an array that broadcasts to [Lq, Lk], at positions -> [L or 1, M or 1].

    An axis of size 1 is broadcast, not indexed: indexing it by position would clamp.
    """
    a_2d = a.reshape((1,) * (2 - a.ndim) + a.shape)
    rows, cols = a_2d.shape[0] > 1, a_2d.shape[1] > 1
    if rows and cols:
        return a_2d[q_pos_L[:, None], k_pos_M[None, :]]
    if rows:
        return a_2d[q_pos_L]
    if cols:
        return a_2d[:, k_pos_M]
    return a_2d


def _register(data: tuple[str, ...] = (), meta: tuple[str, ...] = ()):
    """A frozen dataclass registered as a pytree: `data` fields are leaves, `meta` static."""

    def wrap(cls):
        cls = dataclasses.dataclass(frozen=True, eq=not data)(cls)
        return jax.tree_util.register_dataclass(cls, data_fields=list(data), meta_fields=list(meta))

    return wrap


class MaskFunction:
    """A mask function of positions that knows what it holds (see the module docstring)."""

    name = "mask"

    def __call__(self, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
        raise NotImplementedError

    def check(self, lq: int, lk: int, where: str = "mask") -> None:
        """ValueError/TypeError in one line when an array it holds does not fit Lq, Lk."""
        del lq, lk, where

    def matrix(self, lq: int, lk: int) -> jax.Array:
        """bool [Lq, Lk] (or a shape that broadcasts to it)."""
        return evaluate(self, jnp.arange(lq, dtype=jnp.int32), jnp.arange(lk, dtype=jnp.int32))

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading axes beyond one sequence: () for one mask, (B,) for one mask per row."""
        return ()

    def batch_axes(self) -> Any:
        """A `jax.vmap` in_axes prefix: 0 for leaves with the batch axis, None for the others."""
        return jax.tree.map(lambda _: None, self)


@_register()
class _Causal(MaskFunction):
    name = "causal"

    def __call__(self, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
        return k_pos_M[None, :] <= q_pos_L[:, None]


causal = _Causal()
"""Query i sees keys j <= i."""


@_register(meta=("left", "right"))
class _SlidingWindow(MaskFunction):
    left: int
    right: int
    name = "sliding_window"

    def __call__(self, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
        offset_LxM = k_pos_M[None, :] - q_pos_L[:, None]
        return (offset_LxM >= -self.left) & (offset_LxM <= self.right)


def sliding_window(left: int, right: int) -> MaskFunction:
    """Query i sees keys i - left ... i + right (right=0: causal and local)."""
    for name, n in (("left", left), ("right", right)):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"sliding_window: {name} must be an int >= 0; got {n!r}")
    return _SlidingWindow(int(left), int(right))


def _integers(name: str, x: Any) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must be integers; got dtype {x.dtype}")
    return x


@_register(data=("q_ids", "k_ids"))
class _Segments(MaskFunction):
    q_ids: jax.Array
    k_ids: jax.Array
    name = "segments"

    def __call__(self, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
        return self.q_ids[q_pos_L][:, None] == self.k_ids[k_pos_M][None, :]

    def check(self, lq: int, lk: int, where: str = "mask") -> None:
        for side, ids, n in (("query", self.q_ids, lq), ("key", self.k_ids, lk)):
            if ids.shape != (n,):
                batched = " (ids with a batch axis need attn.dot_product_attention)"
                raise ValueError(
                    f"{where}: segments' {side} ids have shape {ids.shape}, but L{side[0]}={n} "
                    f"needs {(n,)}{batched if ids.ndim > 1 else ''}"
                )

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.q_ids.shape[:-1]

    def batch_axes(self) -> Any:
        axis = 0 if self.batch_shape else None
        return _Segments(axis, axis)


def segments(q_seg_L: Any, k_seg_M: Any = None) -> MaskFunction:
    """Query i sees key j when they carry the same segment id (packed sequences).

    k_seg_M defaults to q_seg_L (self-attention). Ids are any integers; ids [B, L] give one
    mask per row (attn.dot_product_attention; the Flax modules take [batch..., L]).
    """
    q_seg = _integers("segments: ids", q_seg_L)
    k_seg = q_seg if k_seg_M is None else _integers("segments: ids", k_seg_M)
    if q_seg.ndim == 0 or k_seg.ndim == 0 or q_seg.shape[:-1] != k_seg.shape[:-1]:
        raise ValueError(
            f"segments: query ids {q_seg.shape} and key ids {k_seg.shape} must be [L] each, or "
            "[B, L] each with the same B"
        )
    return _Segments(q_seg, k_seg)


@_register(data=("q_len", "k_len"))
class _Lengths(MaskFunction):
    q_len: jax.Array | None
    k_len: jax.Array | None
    name = "lengths"

    def __call__(self, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
        rows_Lx1 = jnp.ones((q_pos_L.shape[0], 1), bool)
        if self.q_len is not None:
            rows_Lx1 = (q_pos_L < self.q_len)[:, None]
        cols_1xM = jnp.ones((1, k_pos_M.shape[0]), bool)
        if self.k_len is not None:
            cols_1xM = (k_pos_M < self.k_len)[None, :]
        return rows_Lx1 & cols_1xM

    def check(self, lq: int, lk: int, where: str = "mask") -> None:
        del lq, lk
        for side, n in (("query", self.q_len), ("key", self.k_len)):
            if n is not None and n.ndim:
                raise ValueError(
                    f"{where}: lengths' {side} length has shape {n.shape}, but one sequence "
                    "takes a scalar (lengths [B] need attn.dot_product_attention)"
                )

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return next((n.shape for n in (self.q_len, self.k_len) if n is not None and n.ndim), ())

    def batch_axes(self) -> Any:
        def axis(n):
            return None if n is None else (0 if n.ndim else None)

        return _Lengths(axis(self.q_len), axis(self.k_len))


def lengths(q_len: Any = None, k_len: Any = None) -> MaskFunction:
    """Query i is real when i < q_len, key j when j < k_len; a padded query attends nowhere.

    Each is an int (or None: every position is real), or [B] ints for one mask per row.
    """
    q = None if q_len is None else _integers("lengths: q_len", q_len)
    k = None if k_len is None else _integers("lengths: k_len", k_len)
    shapes = {n.shape for n in (q, k) if n is not None and n.ndim}
    if len(shapes) > 1:
        raise ValueError(f"lengths: q_len and k_len must have one batch shape; got {shapes}")
    return _Lengths(q, k)


@_register(data=("m",))
class _FromArray(MaskFunction):
    m: jax.Array
    name = "array"

    def __call__(self, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
        return pairs(self.m, q_pos_L, k_pos_M)

    def check(self, lq: int, lk: int, where: str = "mask") -> None:
        _check_array(self.m, lq, lk, where)

    def matrix(self, lq: int, lk: int) -> jax.Array:
        return self.m.reshape((1,) * (2 - self.m.ndim) + self.m.shape)


def _check_array(m: jax.Array, lq: int, lk: int, where: str) -> None:
    if m.dtype != jnp.bool_:
        raise TypeError(f"{where} must be bool (True = may attend); got dtype {m.dtype}")
    m_shape = (1,) * (2 - m.ndim) + m.shape
    if m.ndim > 2 or m_shape[0] not in (1, lq) or m_shape[1] not in (1, lk):
        raise ValueError(
            f"{where} has shape {m.shape}, which does not broadcast to [Lq, Lk] = {(lq, lk)} "
            f"([Lk], [Lq, Lk], [1, Lk] and [Lq, 1] do), nor is it a function of positions"
        )


@_register(meta=("fn",))
class _Function(MaskFunction):
    fn: MaskFn

    @property
    def name(self) -> str:
        return _name(self.fn)

    def __call__(self, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
        return self.fn(q_pos_L, k_pos_M)


@_register(data=("parts",))
class _AllOf(MaskFunction):
    parts: tuple[MaskFunction, ...]
    name = "all_of"

    def __call__(self, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
        allowed = jnp.ones((1, 1), bool)
        for part in self.parts:
            allowed = allowed & _checked(part, part(q_pos_L, k_pos_M), q_pos_L, k_pos_M)
        return allowed

    def check(self, lq: int, lk: int, where: str = "mask") -> None:
        for i, part in enumerate(self.parts):
            part.check(lq, lk, f"{where} (all_of part {i}, {part.name})")

    def matrix(self, lq: int, lk: int) -> jax.Array:
        allowed = jnp.ones((1, 1), bool)
        for part in self.parts:
            allowed = allowed & part.matrix(lq, lk)
        return allowed

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return next((p.batch_shape for p in self.parts if p.batch_shape), ())

    def batch_axes(self) -> Any:
        return _AllOf(tuple(p.batch_axes() for p in self.parts))


def as_fn(mask: Mask) -> MaskFunction:
    """Any mask as a `MaskFunction` (arrays are indexed by the positions; a plain callable is
    held as a static field, so it too passes through `jax.jit` as an argument)."""
    if isinstance(mask, MaskFunction):
        return mask
    if callable(mask):
        return _Function(mask)
    return _FromArray(jnp.asarray(mask))


def all_of(*masks: Mask) -> MaskFunction:
    """Query i sees key j when every mask allows it, e.g. ``all_of(causal, key_padding_M)``.

    Arrays here are one sequence's ([Lk], [Lq, Lk], ...); ``segments`` and ``lengths`` may
    carry a batch axis.
    """
    parts = tuple(as_fn(m) for m in masks)
    shapes = {p.batch_shape for p in parts} - {()}
    if len(shapes) > 1:
        raise ValueError(f"all_of: the masks' batch shapes differ: {sorted(shapes)}")
    return _AllOf(parts)


def _name(fn: MaskFn) -> str:
    """A short name for messages (a partial's repr would print the arrays it holds)."""
    if isinstance(fn, MaskFunction):
        return fn.name
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "mask")


def _checked(fn: MaskFn, allowed: Any, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
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
    return allowed


def evaluate(fn: MaskFn, q_pos_L: jax.Array, k_pos_M: jax.Array) -> jax.Array:
    """bool [L, M] from a mask function; TypeError/ValueError (at trace time) for a bad one."""
    allowed = _checked(fn, fn(q_pos_L, k_pos_M), q_pos_L, k_pos_M)
    return jnp.broadcast_to(allowed, (q_pos_L.shape[0], k_pos_M.shape[0]))


def check(mask: Mask, lq: int, lk: int) -> None:
    """TypeError/ValueError (one line, at trace time) when a mask, or an array inside one, does
    not fit queries of length lq and keys of length lk."""
    if isinstance(mask, MaskFunction):
        mask.check(lq, lk)
    elif not callable(mask):
        _check_array(jnp.asarray(mask), lq, lk, "mask")


def matrix(mask: Mask | None, lq: int, lk: int) -> jax.Array | None:
    """The whole mask as bool [Lq, Lk] (or a shape that broadcasts to it, e.g. [1, Lk] for a
    key mask), None for no mask; checked first (`check`)."""
    if mask is None:
        return None
    check(mask, lq, lk)
    return as_fn(mask).matrix(lq, lk)


@dataclasses.dataclass(frozen=True)
class Factors:
    """A mask in the pieces fused kernels take natively (`factor`); query i may attend to key j
    when every piece allows it."""

    band: tuple[int | None, int | None] | None  # (left, right): -left <= j - i <= right; None
    # on a side: unbounded (causal is (None, 0)); band None: no causal or sliding_window part
    q_len: jax.Array | None  # i < q_len (lengths)
    k_len: jax.Array | None  # j < k_len
    query_L: jax.Array | None  # bool [Lq], from [Lq, 1] arrays: whether query i attends at all
    key_M: jax.Array | None  # bool [Lk], from [Lk] and [1, Lk] arrays: keys every query may see
    other: tuple[MaskFunction, ...]  # the rest: segments, [Lq, Lk] arrays, other functions


def factor(mask: Mask, lq: int, lk: int) -> Factors:
    """The mask (checked against lq and lk first) as `Factors`: ``all_of`` is flattened and parts
    of one kind are intersected (the narrower band, the shorter length, the and of arrays)."""
    check(mask, lq, lk)
    band, q_len, k_len, query_L, key_M, other = None, None, None, None, None, []

    def narrower(a: int | None, b: int | None) -> int | None:
        return b if a is None else (a if b is None else min(a, b))

    def flat(fn: MaskFunction) -> list[MaskFunction]:
        return [p for part in fn.parts for p in flat(part)] if isinstance(fn, _AllOf) else [fn]

    for part in flat(as_fn(mask)):
        if isinstance(part, _Causal | _SlidingWindow):
            left, right = (None, 0) if isinstance(part, _Causal) else (part.left, part.right)
            band = (
                (left, right)
                if band is None
                else (narrower(band[0], left), narrower(band[1], right))
            )
        elif isinstance(part, _Lengths):
            if part.q_len is not None:
                q_len = part.q_len if q_len is None else jnp.minimum(q_len, part.q_len)
            if part.k_len is not None:
                k_len = part.k_len if k_len is None else jnp.minimum(k_len, part.k_len)
        elif isinstance(part, _FromArray) and (part.m.ndim < 2 or part.m.shape[0] == 1):
            keys_M = jnp.broadcast_to(part.m.reshape(-1), (lk,))
            key_M = keys_M if key_M is None else key_M & keys_M
        elif isinstance(part, _FromArray) and part.m.shape[1] == 1:
            queries_L = jnp.broadcast_to(part.m[:, 0], (lq,))
            query_L = queries_L if query_L is None else query_L & queries_L
        else:
            other.append(part)
    return Factors(band, q_len, k_len, query_L, key_M, tuple(other))


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
