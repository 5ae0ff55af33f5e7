"""Score (similarity) functions: how strongly query q_i matches key k_j.

A score is a pure ``fn(params, q_LxD, k_MxD) -> s_LxM`` (``params`` is None for the
parameter-free ones) with an ``init(key, d, *, hidden=None, dtype=float32) -> params``. A score
that needs positions (relative-position or ALiBi-style biases) also takes the absolute int32
positions of its queries and keys: ``fn(params, q_LxD, k_MxD, *, q_pos, k_pos)`` with q_pos [L]
and k_pos [M]. The chunked form calls a score on one block of queries and keys at a time, so a
score may depend on (q_i, k_j, i, j) and its params only, never on which other rows it is given.
It must be finite, with finite derivatives, on every real pair, masked or not.
``get_score`` resolves a name or a user callable to a ``Score`` once, at the API boundary.
The params' keys (``wq_DxH``, ``b_H``, ...) are a saved format, so they keep H for the additive
and mlp scores' hidden width, which the legend in ``attn`` (and the code here) calls A.

Built-in scores are computed in at least float32 whatever the input dtype (bfloat16 inputs give
float32 scores) because the softmax that follows is sensitive to rounding in its inputs.

A ``Score`` is a static pytree (no leaves, compared by value), so it passes through ``jax.jit``
as an ordinary argument where a name string would not: ``jax.jit(attn.attention)(q, k, v,
score=get_score("additive"), score_params=p)``.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "ALIASES",
    "SCORES",
    "Score",
    "additive",
    "dot",
    "dot_scale",
    "evaluate",
    "general",
    "get_score",
    "init_additive",
    "init_general",
    "init_mlp",
    "mlp",
    "scaled_by",
    "scaled_dot",
]

Params = Any
ScoreFn = Callable[..., jax.Array]
InitFn = Callable[..., Params]


class Score(NamedTuple):
    """A resolved score function.

    has_params: True when ``init`` builds params the score needs, False when it takes none (it
    then refuses params), None for a bare callable (whatever params the caller passes go to it).
    positional: ``fn`` takes ``q_pos=`` and ``k_pos=``.
    unscaled, divisor: for a score that is another one divided by a constant, that other score
    (same params and positions; `attn.multihead.steps` draws it as the raw scores) and the
    constant as a figure writes it, e.g. "√(64·3)". scaled_dot, whose divisor √d depends on the
    queries it is given, leaves them unset: its raw form is `dot`.
    """

    name: str
    fn: ScoreFn
    init: InitFn
    has_params: bool | None
    positional: bool = False
    unscaled: Score | None = None
    divisor: str = ""


jax.tree_util.register_static(Score)


def _acc_dtype(*xs: Any) -> jnp.dtype:
    """At least float32, float64 when the inputs are (so x64 gradient checks stay exact)."""
    return jnp.result_type(*xs, jnp.float32)


def _no_params(key: jax.Array, d: int, *, hidden: int | None = None, dtype: Any = None) -> None:
    del key, d, hidden, dtype
    return None


def dot(params: None, q_LxD: jax.Array, k_MxD: jax.Array) -> jax.Array:
    """s_ij = q_i . k_j"""
    del params
    f = _acc_dtype(q_LxD, k_MxD)
    return jnp.einsum("ld,md->lm", q_LxD, k_MxD, preferred_element_type=f)


def scaled_dot(params: None, q_LxD: jax.Array, k_MxD: jax.Array) -> jax.Array:
    """s_ij = q_i . k_j / sqrt(d): removes the growth of the dot product with d.

    For float32/float64 q, scaling q ([L, D]) rather than the scores ([L, M]) is the same number
    with L*M fewer multiplies, and spares XLA a full-size constant in the backward pass. A
    narrower q would be rounded by the scaling (2e-3 weight error in bfloat16 at d=32), so
    there the float32 scores are scaled instead.
    """
    scale = 1.0 / math.sqrt(q_LxD.shape[-1])
    if jnp.issubdtype(q_LxD.dtype, jnp.floating) and jnp.finfo(q_LxD.dtype).bits >= 32:
        return dot(params, q_LxD * scale, k_MxD)
    return dot(params, q_LxD, k_MxD) * scale


def _dot_times(params: None, q_LxD: jax.Array, k_MxD: jax.Array, *, scale: Any) -> jax.Array:
    return dot(params, q_LxD, k_MxD) * scale


def scaled_by(scale: Any) -> Score:
    """s_ij = q_i . k_j * scale, with the float32 scores scaled (``jax.nn``'s ``scale=``)."""
    return Score("scaled_dot", functools.partial(_dot_times, scale=scale), _no_params, False)


def dot_scale(sc: Score, d: int) -> Any:
    """The scale of a scaled dot-product score (1/sqrt(d), or `scaled_by`'s), None for others."""
    if sc.fn is scaled_dot:
        return 1.0 / math.sqrt(d)
    if isinstance(sc.fn, functools.partial) and sc.fn.func is _dot_times:
        return sc.fn.keywords["scale"]
    return None


def general(params: dict[str, jax.Array], q_LxD: jax.Array, k_MxD: jax.Array) -> jax.Array:
    """Bilinear (Luong "general"): s_ij = q_i W k_jᵀ with params {"w_DxD"}."""
    f = _acc_dtype(q_LxD, k_MxD, params["w_DxD"])
    qw_LxD = jnp.einsum("ld,de->le", q_LxD, params["w_DxD"], preferred_element_type=f)
    return jnp.einsum("le,me->lm", qw_LxD, k_MxD, preferred_element_type=f)


def init_general(
    key: jax.Array, d: int, *, hidden: int | None = None, dtype: Any = jnp.float32
) -> dict[str, jax.Array]:
    """W ~ N(0, 1/d) so q W kᵀ has the same scale as q . k / sqrt(d)."""
    del hidden
    return {"w_DxD": jax.random.normal(key, (d, d), dtype) / math.sqrt(d)}


def additive(params: dict[str, jax.Array], q_LxD: jax.Array, k_MxD: jax.Array) -> jax.Array:
    """Concat / Bahdanau: s_ij = vᵀ tanh(W [q_i; k_j] + b).

    W [q; k] = W_q q + W_k k, so each side is projected once ([L, A] and [M, A]) and only the
    broadcast sum [L, M, A] is formed, never the [L, M, 2D] concatenation.
    """
    f = _acc_dtype(q_LxD, k_MxD, params["wq_DxH"])
    hq_LxA = jnp.einsum("ld,da->la", q_LxD, params["wq_DxH"], preferred_element_type=f)
    hk_MxA = jnp.einsum("md,da->ma", k_MxD, params["wk_DxH"], preferred_element_type=f)
    h_LxMxA = jnp.tanh(hq_LxA[:, None, :] + hk_MxA[None, :, :] + params["b_H"])
    return jnp.einsum("lma,a->lm", h_LxMxA, params["v_H"].astype(f))


def init_additive(
    key: jax.Array, d: int, *, hidden: int | None = None, dtype: Any = jnp.float32
) -> dict[str, jax.Array]:
    """hidden defaults to d. Fan-in scaled normals keep tanh out of saturation at init."""
    h = d if hidden is None else hidden
    kq, kk, kv = jax.random.split(key, 3)
    return {
        "wq_DxH": jax.random.normal(kq, (d, h), dtype) / math.sqrt(2 * d),
        "wk_DxH": jax.random.normal(kk, (d, h), dtype) / math.sqrt(2 * d),
        "b_H": jnp.zeros((h,), dtype),
        "v_H": jax.random.normal(kv, (h,), dtype) / math.sqrt(h),
    }


def mlp(params: dict[str, jax.Array], q_LxD: jax.Array, k_MxD: jax.Array) -> jax.Array:
    """Perceptron on [q_i; k_j; q_i * k_j]: s_ij = w2ᵀ tanh(W1 [q; k; q*k] + b1).

    W1 is stored as three [D, A] blocks so the q and k parts are projected once per side; only
    the elementwise-product term needs the pair axis. No output bias: softmax ignores it.
    """
    f = _acc_dtype(q_LxD, k_MxD, params["wq_DxH"])
    hq_LxA = jnp.einsum("ld,da->la", q_LxD, params["wq_DxH"], preferred_element_type=f)
    hk_MxA = jnp.einsum("md,da->ma", k_MxD, params["wk_DxH"], preferred_element_type=f)
    # (q_i * k_j) W_p = sum_d k_jd (q_id W_p[d]): fold q into W_p first so the pair term is one
    # matmul over an [L, D, A] tensor instead of forming the [L, M, D] products.
    qwp_LxDxA = q_LxD[:, :, None].astype(f) * params["wp_DxH"].astype(f)
    hp_LxMxA = jnp.einsum("lda,md->lma", qwp_LxDxA, k_MxD, preferred_element_type=f)
    h_LxMxA = jnp.tanh(hq_LxA[:, None, :] + hk_MxA[None, :, :] + hp_LxMxA + params["b1_H"])
    return jnp.einsum("lma,a->lm", h_LxMxA, params["w2_H"].astype(f))


def init_mlp(
    key: jax.Array, d: int, *, hidden: int | None = None, dtype: Any = jnp.float32
) -> dict[str, jax.Array]:
    """hidden defaults to d."""
    h = d if hidden is None else hidden
    kq, kk, kp, k2 = jax.random.split(key, 4)
    scale = 1.0 / math.sqrt(3 * d)
    return {
        "wq_DxH": jax.random.normal(kq, (d, h), dtype) * scale,
        "wk_DxH": jax.random.normal(kk, (d, h), dtype) * scale,
        "wp_DxH": jax.random.normal(kp, (d, h), dtype) * scale,
        "b1_H": jnp.zeros((h,), dtype),
        "w2_H": jax.random.normal(k2, (h,), dtype) / math.sqrt(h),
    }


SCORES: dict[str, Score] = {
    "dot": Score("dot", dot, _no_params, False),
    "scaled_dot": Score("scaled_dot", scaled_dot, _no_params, False),
    "general": Score("general", general, init_general, True),
    "additive": Score("additive", additive, init_additive, True),
    "mlp": Score("mlp", mlp, init_mlp, True),
}
# Other names for a score: self-attention tutorials call the additive score "concat".
ALIASES: dict[str, str] = {"concat": "additive"}


def _takes_positions(fn: Callable) -> bool:
    """True when fn declares both q_pos and k_pos; TypeError when it declares only one."""
    try:
        names = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature: they take no positions
        return False
    has_q, has_k = "q_pos" in names, "k_pos" in names
    if has_q != has_k:
        raise TypeError(
            f"score {fn!r} must take both q_pos and k_pos (or neither); it declares only "
            f"{'q_pos' if has_q else 'k_pos'}"
        )
    return has_q


def get_score(score: str | ScoreFn | Score) -> Score:
    """Resolve a score name (or alias), a ``Score``, or a callable ``fn(params, q_LxD, k_MxD)
    -> s_LxM``.

    A callable that declares ``q_pos`` and ``k_pos`` is given the positions. A bare callable gets
    an ``init`` returning None: the caller supplies its params, if any.
    """
    if isinstance(score, Score):
        return score
    if isinstance(score, str):
        name = ALIASES.get(score, score)
        if name not in SCORES:
            raise ValueError(
                f"score must be one of {sorted([*SCORES, *ALIASES])} or a callable; got {score!r}"
            )
        return SCORES[name]
    if callable(score):
        name = getattr(score, "__name__", repr(score))
        return Score(name, score, _no_params, None, _takes_positions(score))
    raise TypeError(
        f"score must be a name in {sorted([*SCORES, *ALIASES])} or a callable; got "
        f"{type(score).__name__}"
    )


def evaluate(
    sc: Score,
    params: Params,
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    q_pos_L: jax.Array,
    k_pos_M: jax.Array,
) -> jax.Array:
    """The score matrix s [L, M] in at least float32; ValueError (at trace time) if not [L, M]."""
    if sc.positional:
        s_LxM = sc.fn(params, q_LxD, k_MxD, q_pos=q_pos_L, k_pos=k_pos_M)
    else:
        s_LxM = sc.fn(params, q_LxD, k_MxD)
    shape = (q_LxD.shape[0], k_MxD.shape[0])
    if getattr(s_LxM, "shape", None) != shape:
        raise ValueError(
            f"score {sc.name!r} must return [Lq, Lk] = {shape} for q {q_LxD.shape} and k "
            f"{k_MxD.shape}; got {getattr(s_LxM, 'shape', type(s_LxM).__name__)}"
        )
    return s_LxM.astype(jnp.result_type(s_LxM, jnp.float32))
