"""Fused attention kernels behind `attn.attention`: cuDNN's on NVIDIA GPUs, Pallas splash on TPUs.

  "cudnn"   ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN's flash attention:
            float16 or bfloat16, head dims up to 256 (128 before Hopper), an NVIDIA GPU.
  "splash"  ``jax.experimental.pallas.ops.tpu.splash_attention``, the Pallas TPU kernel: float32
            or bfloat16, a TPU (or a CPU inside ``jax.experimental.pallas.tpu.
            force_tpu_interpret_mode()``, where Pallas interprets it: slow, for tests, and one
            sequence only, as jax's TPU interpreter cannot run a vmapped kernel; ``splash(...,
            interpret=True)`` runs Pallas's generic interpreter, which can).

Both compute the scaled dot product (``score="scaled_dot"`` or jax.nn's ``scale=``) and nothing
else. A mask is split (``attn.masks.factor``) into what each kernel does natively and the rest:
  - causal and sliding_window (a band): cuDNN's causal and left windows when Lq = Lk, a dense
    mask otherwise; splash's static block-sparse masks when Lq <= Lk (so every query keeps its
    own position), refused otherwise;
  - key padding ([Lk] or [1, Lk] arrays, ``lengths``' k_len): cuDNN's key lengths (``lengths``)
    or a dense mask (arrays); splash's segment ids;
  - query masks ([Lq, 1] arrays, ``lengths``' q_len): nothing in the kernel, see below;
  - anything else ([Lq, Lk] arrays, segments, mask functions): a dense [Lq, Lk] mask for cuDNN,
    which adds it to the scores as a large finite negative (jax.nn's own way); refused by splash.
Every query row the kernel computes keeps at least one key or has only finite masked scores,
so none is NaN; rows with nothing allowed are then set to 0 (attn's contract) or to the mean of
v (``fully_masked="mean"``), so their gradients are 0, as in the matrix form.

Under ``jax.vmap`` (batch and heads of the single-sequence form, ``attn.dot_product_attention``):
splash's ``pallas_call`` has a batching rule (each vmapped axis becomes a grid axis). cuDNN's
rule requires every operand mapped over the same axes, so operands are first broadcast along any
vmapped axis they lack (`_batched_alike`): a key padding mask shared by the heads becomes one
per head, as cuDNN's [B, N, T, S] bias takes it.

Inputs are assumed validated (`check` is what the fused names add to `attn.attention`'s checks).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from attn import masks

__all__ = ["FUSED", "check", "cudnn", "splash"]

FUSED = ("cudnn", "splash")
_LANES = 128  # splash's blocks are multiples of a TPU vreg's 128 lanes
_BLOCKS = (512, 256, 128)  # the largest that divides the padded length is used


def check(
    implementation: str,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: masks.Mask | None,
    scale: Any,
) -> None:
    """ValueError, in one line naming what to use instead, for what the kernel cannot compute."""
    instead = "implementation='matrix' or 'chunked'"
    if scale is None:
        raise ValueError(
            f"implementation={implementation!r} computes the scaled dot product only (score "
            f"'scaled_dot', or jax.nn's scale=); use {instead} for other scores"
        )
    dtype = jnp.result_type(q, k, v)
    backend = jax.default_backend()
    if implementation == "cudnn":
        if backend != "gpu":
            raise ValueError(
                f"implementation='cudnn' runs on NVIDIA GPUs, and JAX's default backend is "
                f"{backend!r}: use implementation='xla' (jax.nn's XLA form), or 'splash' on a TPU"
            )
        if dtype not in (jnp.float16, jnp.bfloat16):
            raise ValueError(
                f"implementation='cudnn' takes float16 or bfloat16 (cuDNN's flash attention has "
                f"no {dtype} kernel); cast q, k and v (a model dtype of 'bfloat16') or use "
                f"implementation='xla'"
            )
        if _round_up(max(q.shape[1], v.shape[1]), 8) > 256:
            raise ValueError(
                f"implementation='cudnn' takes head dims up to 256 (128 before Hopper); got q/k "
                f"{q.shape[1]} and v {v.shape[1]}: use implementation='xla' or 'chunked'"
            )
        return
    if backend != "tpu" and not _tpu_interpret_forced():
        raise ValueError(
            f"implementation='splash' runs on TPUs (or on CPU inside jax.experimental.pallas.tpu"
            f".force_tpu_interpret_mode()), and JAX's default backend is {backend!r}: use "
            f"implementation='xla', or 'cudnn' on an NVIDIA GPU"
        )
    if dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(
            f"implementation='splash' takes float32 or bfloat16; got {dtype}: use {instead}"
        )
    if mask is None:
        return
    lq, lk = q.shape[0], k.shape[0]
    parts = masks.factor(mask, lq, lk)
    if parts.other:
        raise ValueError(
            f"implementation='splash' takes key padding ([Lk] masks, lengths), query masks "
            f"([Lq, 1]), causal and sliding_window; got a {parts.other[0].name} mask: use "
            f"implementation='xla' or {instead}"
        )
    if parts.band is not None and lq > lk:
        raise ValueError(
            f"implementation='splash' takes causal and sliding_window masks only where Lq <= Lk "
            f"(so that every query keeps its own position); got Lq={lq}, Lk={lk}: use {instead}"
        )


def cudnn(
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    v_MxE: jax.Array,
    mask: masks.Mask | None,
    *,
    scale: Any,
    fully_masked: str = "zero",
) -> jax.Array:
    """out [Lq, dv] = softmax(scale q.k) v by cuDNN's flash attention (``check`` first)."""
    lq, lk, d, e = q_LxD.shape[0], k_MxD.shape[0], q_LxD.shape[1], v_MxE.shape[1]
    if lq == 0 or lk == 0:
        return jnp.zeros((lq, e), v_MxE.dtype)
    dtype = jnp.result_type(q_LxD, k_MxD, v_MxE)
    # cuDNN wants one head dim, a multiple of 8, for q, k and v: zero columns change neither q.k
    # nor the mix of v, and the scale is the true d's.
    x = _round_up(max(d, e), 8)
    q_LxX, k_MxX, v_MxX = (
        jnp.pad(a.astype(dtype), ((0, 0), (0, x - a.shape[1]))) for a in (q_LxD, k_MxD, v_MxE)
    )
    causal, window, k_len, dense = False, None, None, None
    if mask is not None:
        parts = masks.factor(mask, lq, lk)
        # Query-side parts (lengths' q_len, [Lq, 1] arrays) need nothing in the kernel: such
        # rows are set apart below.
        rest = [*parts.other] + ([] if parts.key_M is None else [parts.key_M])
        band = parts.band
        # cuDNN's causal mask and its left windows (which include causality) are top-left
        # aligned like attn's; with Lq = Lk every query keeps its own key, so no row is empty.
        if band is not None and lq == lk and band[1] == 0:
            causal, window = True, (None if band[0] is None else (band[0], 0))
        elif band is not None:  # left is None only for causal alone
            rest.append(masks.causal if band[0] is None else masks.sliding_window(*band))
        # Key lengths run in the kernel, clamped to >= 1 so that no row it computes is empty,
        # unless a left window could still leave a query without keys.
        if parts.k_len is not None and window is None:
            k_len = jnp.maximum(parts.k_len, 1).astype(jnp.int32).reshape(1)
        elif parts.k_len is not None:
            rest.append(masks.lengths(k_len=parts.k_len))
        if rest:
            dense = jnp.broadcast_to(masks.matrix(masks.all_of(*rest), lq, lk), (lq, lk))
    if dense is not None and (lq % 2 or lk % 2):
        # cuDNN's backward takes a dense mask at even lengths only: one more query row (dropped
        # below) or one more key (masked), zeros.
        pq, pk = _round_up(lq, 2), _round_up(lk, 2)
        q_LxX = jnp.pad(q_LxX, ((0, pq - lq), (0, 0)))
        k_MxX, v_MxX = (jnp.pad(a, ((0, pk - lk), (0, 0))) for a in (k_MxX, v_MxX))
        dense = jnp.pad(dense, ((0, pq - lq), (0, pk - lk)))
    q_len = None if k_len is None else jnp.full((1,), q_LxX.shape[0], jnp.int32)
    q_LxX, k_MxX, v_MxX, dense, q_len, k_len = _batched_alike(
        (q_LxX, k_MxX, v_MxX, dense, q_len, k_len)
    )
    out_1xLx1xX = _cotangent_batched_alike(
        jax.nn.dot_product_attention(
            q_LxX[None, :, None],
            k_MxX[None, :, None],
            v_MxX[None, :, None],
            mask=None if dense is None else dense[None, None],
            scale=scale,
            is_causal=causal,
            query_seq_lengths=q_len,
            key_value_seq_lengths=k_len,
            local_window_size=window,
            implementation="cudnn",
        )
    )
    return _rows_with_nothing_allowed(out_1xLx1xX[0, :lq, 0, :e], v_MxE, mask, fully_masked)


def splash(
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    v_MxE: jax.Array,
    mask: masks.Mask | None,
    *,
    scale: Any,
    fully_masked: str = "zero",
    interpret: bool = False,
) -> jax.Array:
    """out [Lq, dv] = softmax(scale q.k) v by Pallas's splash attention (``check`` first).

    interpret=True runs the kernel in Pallas's interpreter, on any backend and under vmap.
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    lq, lk, e = q_LxD.shape[0], k_MxD.shape[0], v_MxE.shape[1]
    if lq == 0 or lk == 0:
        return jnp.zeros((lq, e), v_MxE.dtype)
    dtype = jnp.result_type(q_LxD, k_MxD, v_MxE)
    # Blocks are multiples of 128 rows that divide the length: queries and keys are padded to
    # a multiple of 128 (pq, pk rows, the *_padded arrays); padded keys are masked by segment
    # id, padded queries dropped.
    pq, pk = _round_up(lq, _LANES), _round_up(lk, _LANES)
    bq, bk = (next(b for b in _BLOCKS if n % b == 0) for n in (pq, pk))
    # splash scores q.k unscaled: scale q, rounding once to its dtype.
    q_LxD = (q_LxD.astype(jnp.float32) * scale).astype(dtype)
    q_padded = jnp.pad(q_LxD, ((0, pq - lq), (0, 0)))
    k_padded, v_padded = (jnp.pad(a.astype(dtype), ((0, pk - lk), (0, 0))) for a in (k_MxD, v_MxE))
    parts = None if mask is None else masks.factor(mask, lq, lk)
    keep_M = None
    if parts is not None and parts.key_M is not None:
        keep_M = parts.key_M
    if parts is not None and parts.k_len is not None:
        below_M = jnp.arange(lk) < parts.k_len
        keep_M = below_M if keep_M is None else keep_M & below_M
    segment_ids = None
    if keep_M is not None or pk != lk:
        keep_padded = jnp.zeros((pk,), bool).at[:lk].set(True if keep_M is None else keep_M)
        # Every query has id 1, so a key with id 0 is seen by none; query masks act below.
        segment_ids = sa.SegmentIds(q=jnp.ones((pq,), jnp.int32), kv=keep_padded.astype(jnp.int32))
    band = None if parts is None else parts.band
    if band is None:
        static = sa.FullMask((pq, pk))
    elif band == (None, 0):
        static = sa.CausalMask((pq, pk))
    else:
        static = sa.LocalMask((pq, pk), band, offset=0)
    blocks = sa.BlockSizes(
        block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
        block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk,
    )  # fmt: skip
    kernel = sa.make_splash_mha_single_device(
        sa.MultiHeadMask([static]), block_sizes=blocks, interpret=interpret
    )
    out_padded = kernel(q_padded[None], k_padded[None], v_padded[None], segment_ids=segment_ids)
    return _rows_with_nothing_allowed(out_padded[0, :lq], v_MxE, mask, fully_masked)


def _rows_with_nothing_allowed(
    out_LxE: jax.Array, v_MxE: jax.Array, mask: masks.Mask | None, fully_masked: str
) -> jax.Array:
    """The kernel's rows, with those of queries that may attend nowhere set to 0 (or mean(v))."""
    if mask is not None:
        lq, lk = out_LxE.shape[0], v_MxE.shape[0]
        live_L1 = jnp.broadcast_to(masks.matrix(mask, lq, lk), (lq, lk)).any(-1, keepdims=True)
        dead_E = 0 if fully_masked == "zero" else v_MxE.astype(jnp.float32).mean(axis=0)
        out_LxE = jnp.where(live_L1, out_LxE, dead_E)
    return out_LxE.astype(v_MxE.dtype)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _tpu_interpret_forced() -> bool:
    """Inside ``jax.experimental.pallas.tpu.force_tpu_interpret_mode()`` (jax has no public
    reader for it; jax 0.7.2 to 0.10.2 keep it in this config entry)."""
    from jax._src import config

    entry = getattr(config, "pallas_tpu_interpret_mode_context_manager", None)
    return entry is not None and entry.value is not None


@jax.custom_batching.custom_vmap
def _broadcast_batched(xs: tuple) -> tuple:
    return xs


@_broadcast_batched.def_vmap
def _broadcast_rule(axis_size: int, in_batched: tuple, xs: tuple) -> tuple[tuple, tuple]:
    xs = tuple(
        x if batched or x is None else jnp.broadcast_to(x, (axis_size, *x.shape))
        for x, batched in zip(xs, in_batched[0], strict=True)
    )
    # Called again, so that an outer vmap broadcasts along its own axis too.
    return _broadcast_batched(xs), tuple(None if x is None else True for x in xs)


@jax.custom_vjp
def _batched_alike(xs: tuple) -> tuple:
    """xs unchanged; under vmap each comes out mapped over every vmapped axis. cuDNN's batching
    rule needs that: it reshapes every operand with the query's batch axes. A custom_vjp, as
    reverse-mode differentiation cannot go through custom_vmap itself; the cotangent of an input
    that was shared is summed over the axis it was broadcast along by jax's custom_vjp rule."""
    return _broadcast_batched(xs)


_batched_alike.defvjp(lambda xs: (_broadcast_batched(xs), None), lambda _, g: (g,))


@jax.custom_vjp
def _cotangent_batched_alike(out: jax.Array) -> jax.Array:
    """out unchanged; its cotangent comes back mapped over every axis out is mapped over. cuDNN's
    backward rule needs that too, and under ``jax.vmap(jax.grad(f))`` the cotangent of a sum is
    one shared array of ones."""
    return out


_cotangent_batched_alike.defvjp(
    lambda out: (out, out), lambda out, g: (_broadcast_batched((g, out))[0],)
)
