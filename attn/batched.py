"""Batched attention in ``jax.nn.dot_product_attention``'s layout, built on `attn.attention`.

``dot_product_attention(query, key, value, bias, mask, *, scale, is_causal, query_seq_lengths,
key_value_seq_lengths, local_window_size, implementation)`` takes jax.nn's arguments with their
meaning, shapes and broadcasting: query [B, T, N, H] (or [T, N, H]), key and value [B, S, K, H]
with N a multiple of K (grouped-query attention: query head n reads key/value head n // (N / K)),
bias and mask of up to 4 axes that broadcast to [B, N, T, S] (fewer axes are leading ones
left out, so a [T, S] mask is shared by every row and head). Each (row, head) is then one call
of `attn.attention`, under ``jax.vmap``: the batched form adds no computation of its own.

attn's own arguments: ``score`` (any name in ``attn.scores`` or a callable, position-aware ones
included) and ``score_params`` (shared by all heads, or stacked over the N query heads);
``mask`` may also be a mask function of positions (``attn.masks``), shared by every row, or one
per row (``masks.segments`` with ids [B, L], ``masks.lengths`` with lengths [B], ``all_of``
of those); ``implementation`` "matrix" (the default, also for None) | "chunked" | "xla" |
"cudnn" (jax.nn's own name: cuDNN's flash attention, through `attn.fused`) | "splash" (Pallas's
TPU kernel).

**A query that may attend nowhere gets output 0 here, and the mean of all of value in jax.nn
and Flax** (their softmax over only masked scores is uniform). ``fully_masked="mean"`` gives
jax.nn's numbers, including 0 for queries beyond ``query_seq_lengths``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from attn import masks, scores
from attn.attention import attention

__all__ = ["dot_product_attention"]


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None = None,
    mask: jax.Array | masks.MaskFn | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: jax.Array | None = None,
    key_value_seq_lengths: jax.Array | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    implementation: str | None = None,
    score: str | scores.ScoreFn | scores.Score = "scaled_dot",
    score_params: Any = None,
    q_chunk: int = 128,
    k_chunk: int = 128,
    fully_masked: str = "zero",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    broadcast_dropout: bool = True,
    return_weights: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array | None]:
    """Attention over a batch of heads; jax.nn's arguments first, then attn's.

    Args:
      query [B, T, N, H], key [B, S, K, H], value [B, S, K, Hv] (Hv may differ from H), or the
        same without B. Floating point, all three of one dtype.
      bias: added to the scores, broadcasting to [B, N, T, S] ("matrix" and "chunked").
      mask: bool, broadcasting to [B, N, T, S], True = may attend; or a mask function
        (``attn.masks``), shared or one per row.
      scale: the scores are scale * q.k (score "scaled_dot" or "dot"); default 1/sqrt(H).
      is_causal, local_window_size (int or (left, right)), query_seq_lengths,
        key_value_seq_lengths ([B] int32): as in jax.nn; combined with mask.
      implementation: None or "matrix", "chunked", "xla", "cudnn", "splash" (`attn.attention`'s).
      score, score_params, q_chunk, k_chunk, fully_masked: as in `attn.attention`.
      dropout_rate, dropout_rng, broadcast_dropout: attention dropout ("matrix"), drawn as Flax
        draws it (``jax.random.bernoulli``); by default one [T, S] dropout mask for every row
        and head, as Flax's broadcast_dropout.
      return_weights: also return the weights [B, N, T, S] ("matrix"; None otherwise).

    Returns:
      out [B, T, N, Hv] in value's dtype (and the weights when return_weights).
    """
    q, k, v = (jnp.asarray(x) for x in (query, key, value))
    unbatched = q.ndim == 3
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    b, t, n, h, s, kh = _check_qkv(q, k, v, unbatched)
    g = n // kh
    impl = "matrix" if implementation is None else implementation
    sc = _scaled(scores.get_score(score), scale)
    want = (b, n, t, s)
    m_arr = None if mask is None or callable(mask) else _as_4d("mask", mask, want)
    m_fn = _mask_function(
        None if m_arr is not None else mask,
        is_causal,
        local_window_size,
        query_seq_lengths,
        key_value_seq_lengths,
        b,
    )
    b_arr = None if bias is None else _as_4d("bias", bias, want)
    if b_arr is not None and impl not in ("matrix", "chunked"):
        raise ValueError(f"bias needs implementation='matrix' or 'chunked'; got {impl!r}")
    sp, sp_per_head = score_params, _per_head(sc, score_params, h, n)
    if sp_per_head:
        sp = jax.tree.map(lambda x: x.reshape(kh, g, *x.shape[1:]) if g > 1 else x, sp)
    rng = dropout_rng
    per_row_rng = dropout_rng is not None and dropout_rate > 0.0 and not broadcast_dropout
    if per_row_rng:
        rng = jax.random.split(dropout_rng, (b, kh, g) if g > 1 else (b, kh))

    def row(q_LxK, k_MxK, v_MxE, m_LxM, fn, b_LxM, sp_row, rng_row):
        row_mask = m_LxM if fn is None else (fn if m_LxM is None else masks.all_of(m_LxM, fn))
        row_score = sc if b_LxM is None else _biased(sc, b_LxM)
        return attention(
            q_LxK, k_MxK, v_MxE, row_mask, score=row_score, score_params=sp_row,
            implementation=impl, q_chunk=q_chunk, k_chunk=k_chunk, fully_masked=fully_masked,
            dropout_rate=dropout_rate, dropout_rng=rng_row, dropout_draw="bernoulli",
        )  # fmt: skip

    # In jax.nn's letters (G = N / K): lay q out as [B, T, K, G, H] and every per-head array with
    # leading [B?, K?, G?] axes, then vmap over query heads of one key head (G), key heads (K) and
    # rows (B), innermost first.
    m_arr, m_axes = _leading(m_arr, kh, g)
    b_arr, b_axes = _leading(b_arr, kh, g)
    fn_axes = m_fn.batch_axes() if m_fn is not None and m_fn.batch_shape else None
    head = 0 if sp_per_head else None
    levels = [("K", 1, 1)] if g == 1 else [("G", 1, None), ("K", 1, 1)]
    f = row
    for level, q_axis, kv_axis in levels:
        f = jax.vmap(
            f,
            in_axes=(
                q_axis, kv_axis, kv_axis, m_axes[level], None, b_axes[level], head,
                0 if per_row_rng else None,
            ),
            out_axes=(1, 0),
        )  # fmt: skip
    f = jax.vmap(
        f,
        in_axes=(0, 0, 0, m_axes["B"], fn_axes, b_axes["B"], None, 0 if per_row_rng else None),
    )
    q_in = q.reshape(b, t, kh, g, h) if g > 1 else q
    out, w = f(q_in, k, v, m_arr, m_fn, b_arr, sp, rng)
    out = out.reshape(b, t, n, v.shape[-1])
    if w is not None:
        w = w.reshape(b, n, t, s)
    if fully_masked == "mean" and query_seq_lengths is not None:
        # jax.nn zeroes the output of queries beyond query_seq_lengths even then.
        real_BxL = jnp.arange(t)[None, :] < jnp.asarray(query_seq_lengths)[:, None]
        out = jnp.where(real_BxL[:, :, None, None], out, 0).astype(out.dtype)
    if unbatched:
        out, w = out[0], None if w is None else w[0]
    return (out, w) if return_weights else out


def _check_qkv(
    q: jax.Array, k: jax.Array, v: jax.Array, unbatched: bool
) -> tuple[int, int, int, int, int, int]:
    layout = {"query": "[B, T, N, H]", "key": "[B, S, K, H]", "value": "[B, S, K, Hv]"}
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.ndim != 4:
            shape = x.shape[1:] if unbatched else x.shape
            raise ValueError(
                f"{name} must be {layout[name]} (or the same without B, for all three); got "
                f"shape {shape}"
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be floating point; got dtype {x.dtype}")
    if not q.dtype == k.dtype == v.dtype:  # promoting would compute in the widest, silently
        raise TypeError(
            "query, key and value must have one dtype, as in jax.nn (cast them, e.g. "
            f"key.astype(query.dtype)); got query {q.dtype}, key {k.dtype}, value {v.dtype}"
        )
    b, t, n, h = q.shape
    _, s, kh, _ = k.shape
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or k.shape[3] != h:
        raise ValueError(
            f"query [B, T, N, H], key [B, S, K, H] and value [B, S, K, Hv] must share B, S, K and"
            f" H; got query {q.shape}, key {k.shape}, value {v.shape}"
        )
    if n % kh:
        raise ValueError(
            f"the number of query heads N={n} must be a multiple of the key/value heads K={kh}"
        )
    return b, t, n, h, s, kh


def _scaled(sc: scores.Score, scale: Any) -> scores.Score:
    if scale is None:
        return sc
    if sc.fn not in (scores.scaled_dot, scores.dot):
        raise ValueError(
            f"scale sets the dot product's scale (scores scale * q.k); score={sc.name!r} has its "
            "own: leave scale=None"
        )
    return scores.scaled_by(scale)


def _as_4d(name: str, x: Any, want: tuple[int, int, int, int]) -> jax.Array:
    """x as [B or 1, N or 1, T or 1, S or 1]; one-line error unless it broadcasts (jax.nn's
    rule: missing axes are leading ones)."""
    x = jnp.asarray(x)
    if name == "mask" and x.dtype != jnp.bool_:
        raise TypeError(f"mask must be bool (True = may attend); got dtype {x.dtype}")
    if name == "bias" and not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"bias must be floating point; got dtype {x.dtype}")
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim <= 4 else x
    if x.ndim > 4 or any(m not in (1, w) for m, w in zip(x4.shape, want, strict=True)):
        raise ValueError(
            f"{name} has shape {x.shape}, which does not broadcast to [B, N, T, S] = {want} "
            f"(missing axes are leading ones: [T, S] is shared by every row and head; key "
            f"padding [B, S] is {name}[:, None, None, :])"
        )
    return x4


def _mask_function(
    mask: Any,
    is_causal: bool,
    window: int | tuple[int, int] | None,
    q_len: Any,
    k_len: Any,
    b: int,
) -> masks.MaskFunction | None:
    """jax.nn's mask arguments (and a mask function) as one mask function, or None."""
    try:
        causal = bool(is_causal)
    except jax.errors.TracerBoolConversionError:  # jax.nn fails here with JAX's generic error
        raise TypeError(
            "is_causal is a traced value (an argument of a jitted function); it decides the "
            "mask's shape, so make it static: jax.jit(functools.partial("
            "attn.dot_product_attention, is_causal=True)) or jax.jit(f, "
            "static_argnames='is_causal')"
        ) from None
    parts = []
    if causal:
        parts.append(masks.causal)
    if window is not None:
        left, right = (window, window) if isinstance(window, int) else window
        parts.append(masks.sliding_window(left, right))
    for name, n in (("query_seq_lengths", q_len), ("key_value_seq_lengths", k_len)):
        if n is not None and jnp.shape(n) != (b,):
            raise ValueError(f"{name} must have shape [B] = {(b,)}; got {jnp.shape(n)}")
    if q_len is not None or k_len is not None:
        parts.append(masks.lengths(q_len, k_len))
    if mask is not None:
        parts.append(masks.as_fn(mask))
    fn = parts[0] if len(parts) == 1 else (masks.all_of(*parts) if parts else None)
    if fn is not None and fn.batch_shape not in ((), (b,)):
        raise ValueError(
            f"mask {fn.name} has batch shape {fn.batch_shape}; one mask per row needs [B] = {(b,)}"
        )
    return fn


def _leading(
    x_4d: jax.Array | None, kh: int, g: int
) -> tuple[jax.Array | None, dict[str, int | None]]:
    """[B or 1, N or 1, T', S'] -> [B?, K?, G?, T', S'] without its size-1 axes, and the axis
    each vmap level maps (None: shared)."""
    if x_4d is None:
        return None, {"B": None, "K": None, "G": None}
    rows, heads = x_4d.shape[0] > 1, x_4d.shape[1] > 1
    x = x_4d if rows else x_4d[0]
    if heads:
        x = x.reshape(*x.shape[: int(rows)], kh, g, *x.shape[-2:]) if g > 1 else x
    else:
        x = x[:, 0] if rows else x[0]
    axis = {True: 0, False: None}
    return x, {"B": axis[rows], "K": axis[heads], "G": axis[heads and g > 1]}


def _per_head(sc: scores.Score, score_params: Any, h: int, n: int) -> bool:
    """True when score_params are stacked over the N query heads (each leaf one axis more than
    the score's init builds), False when every head shares them."""
    if score_params is None or not sc.has_params:
        return False
    built = jax.eval_shape(lambda: sc.init(jax.random.key(0), h))
    ranks = [x.ndim for x in jax.tree.leaves(built)]
    got = [jnp.shape(x) for x in jax.tree.leaves(score_params)]
    if len(got) != len(ranks) or not all(len(s) == r + 1 for s, r in zip(got, ranks, strict=True)):
        return False  # shared, or not the score's tree at all: attention says which
    for path, x in jax.tree_util.tree_leaves_with_path(score_params):
        if jnp.shape(x)[0] != n:
            raise ValueError(
                f"score_params{jax.tree_util.keystr(path)} has shape {jnp.shape(x)}: params "
                f"stacked over heads need a leading axis of N={n} query heads"
            )
    return True


def _bias_added(
    params: Any,
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    *,
    q_pos: jax.Array,
    k_pos: jax.Array,
    base: scores.Score,
    bias: jax.Array,
) -> jax.Array:
    s_LxM = scores.evaluate(base, params, q_LxD, k_MxD, q_pos, k_pos)
    return (s_LxM + masks.pairs(bias, q_pos, k_pos)).astype(s_LxM.dtype)


def _biased(sc: scores.Score, bias_LxM: jax.Array) -> scores.Score:
    """sc plus bias[i, j] (bias broadcasts to [L, M]) as a position-aware score."""
    fn = functools.partial(_bias_added, base=sc, bias=bias_LxM)
    return scores.Score(sc.name, fn, sc.init, sc.has_params, positional=True)
