"""Attention for one unbatched sequence: out = softmax(score(Q, K)) V with a mask.

Batches and heads come from ``jax.vmap`` (``attn.dot_product_attention`` does that for you, in
``jax.nn.dot_product_attention``'s layout). Five implementations share one contract:
  "matrix"   all queries at once as matrix products; returns the weights.
  "chunked"  online softmax over key/query chunks (attn.chunked), O(L) memory; weights None.
  "xla"      ``jax.nn.dot_product_attention``'s XLA form; scaled_dot only; weights None.
  "cudnn"    cuDNN's flash attention through jax.nn, on NVIDIA GPUs (attn.fused); scaled_dot
             only, float16/bfloat16; weights None.
  "splash"   Pallas's splash attention kernel, on TPUs (attn.fused); scaled_dot only, key
             padding, query, causal and sliding_window masks; weights None.

Scores (``attn.scores``) may depend on absolute positions, and masks (``attn.masks``) may be
functions of positions; both see query i and key j as positions i and j. Masked scores are set
to a large finite negative (never -inf) and the softmax runs in at least float32, then rows with
nothing allowed are zeroed: such a row gives weights 0, output 0 and finite gradients.
(``jax.nn.dot_product_attention`` and Flax give such a row the mean of all values instead;
``fully_masked="mean"`` does the same.)

Under ``jax.jit``, strings cannot be arguments: bind ``score`` and ``implementation`` with
``Attention(score=..., implementation=...)``, a hashable ``functools.partial`` of `attention`
that compares equal by value and is itself a static pytree, or pass a ``Score``
(``attn.scores.get_score``), which is one too.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from attn import chunked, fused, layers, masks, scores

__all__ = ["DROPOUT_DRAWS", "FULLY_MASKED", "IMPLEMENTATIONS", "Attention", "attention"]

IMPLEMENTATIONS = ("matrix", "chunked", "xla", *fused.FUSED)
FULLY_MASKED = ("zero", "mean")  # what a query that may attend nowhere gets: 0, or mean(v)
# How attention dropout draws its mask: attn's own (`attn.layers.keep_mask`), or Flax's and
# jax.nn's (`jax.random.bernoulli`), for code that must match them mask for mask.
DROPOUT_DRAWS = ("bits16", "bernoulli")


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: masks.Mask | None = None,
    *,
    score: str | scores.ScoreFn | scores.Score = "scaled_dot",
    score_params: Any = None,
    implementation: str = "matrix",
    q_chunk: int = 128,
    k_chunk: int = 128,
    fully_masked: str = "zero",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    dropout_draw: str = "bits16",
) -> tuple[jax.Array, jax.Array | None]:
    """Attend queries q to keys k, mixing values v.

    Args:
      q: [Lq, d] queries.  k: [Lk, d] keys.  v: [Lk, dv] values. All floating point: the output
        is a weighted mean of v, so integer v is refused rather than truncated.
      mask: True = may attend; a bool array that broadcasts to [Lq, Lk] ([Lk], [Lq, Lk],
        [1, Lk], [Lq, 1]), a function of positions ``fn(q_pos_L, k_pos_M) -> bool [L, M]``
        (``attn.masks``), or None = attend everywhere. Checked against Lq and Lk, arrays inside
        mask functions included.
      score: a name in ``attn.scores.SCORES`` (or an alias), a ``Score``, or
        ``fn(params, q_LxD, k_MxD)`` (plus ``*, q_pos, k_pos`` if it needs positions).
      score_params: params for parameterized scores (from ``get_score(score).init``); their
        paths and shapes are checked against what init builds for this d.
      implementation: "matrix" | "chunked" | "xla" | "cudnn" | "splash" (the last two refuse,
        in one line, what their kernel cannot compute: see attn.fused).
      q_chunk, k_chunk: chunk sizes for "chunked" (any length works: the last chunk overlaps
        the one before it).
      fully_masked: "zero" (a query that may attend nowhere gets output 0) or "mean" (the mean
        of all of v, as ``jax.nn.dot_product_attention`` and Flax give).
      dropout_rate, dropout_rng: attention dropout on the weights (each kept weight scaled by
        1 / the keep probability, as Flax does), "matrix" only; rate 0 = none.
      dropout_draw: how the mask is drawn: "bits16" (`attn.layers.keep_mask`, as attn's other
        dropout: the rate to within 2^-17, under a quarter of bernoulli's time) or "bernoulli"
        (``jax.random.bernoulli``: Flax's mask for the same key).

    Returns:
      out [Lq, dv] in v.dtype, and weights [Lq, Lk] (float32, or float64 for float64 inputs;
      before dropout) for "matrix", None otherwise. Weight rows sum to 1 over allowed keys, are
      exactly 0 on masked keys, and are all 0 (as is the output row) when a query may attend
      nowhere (uniform, with fully_masked="mean").
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if mask is not None and not callable(mask):
        mask = jnp.asarray(mask)
    sc = scores.get_score(score)
    _check(q, k, v, mask, sc, score_params, implementation, q_chunk, k_chunk)
    _check_options(implementation, fully_masked, dropout_rate, dropout_rng, dropout_draw)
    if implementation == "matrix":
        return _matrix(
            q, k, v, mask, sc, score_params, fully_masked, dropout_rate, dropout_rng, dropout_draw
        )
    if implementation == "chunked":
        out = chunked.attention(
            q, k, v, mask, score=sc, score_params=score_params, q_chunk=q_chunk,
            k_chunk=k_chunk, fully_masked=fully_masked,
        )  # fmt: skip
        return out, None
    scale = scores.dot_scale(sc, q.shape[1])
    if implementation == "cudnn":
        return fused.cudnn(q, k, v, mask, scale=scale, fully_masked=fully_masked), None
    if implementation == "splash":
        return fused.splash(q, k, v, mask, scale=scale, fully_masked=fully_masked), None
    return _xla(q, k, v, mask, scale, fully_masked), None


@dataclasses.dataclass(frozen=True)
class Attention:
    """`attention` with its static arguments bound: ``Attention(score="additive",
    implementation="chunked")(q, k, v, mask, score_params=p)``.

    Where ``functools.partial(attention, ...)`` objects compare equal only to themselves, these
    compare equal by value and are static pytrees (no leaves). So ``jax.jit(Attention(...))``
    needs no static_argnames, an instance can be an argument of a jitted function, and two
    equal ones held by two Flax modules give one trace, not two. The arguments are checked here.
    """

    score: str | scores.ScoreFn | scores.Score = "scaled_dot"
    implementation: str = "matrix"
    q_chunk: int = 128
    k_chunk: int = 128
    fully_masked: str = "zero"

    def __post_init__(self):
        scores.get_score(self.score)
        _check_options(self.implementation, self.fully_masked, 0.0, None, "bits16")
        _check_chunks(self.q_chunk, self.k_chunk)

    def __call__(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        mask: masks.Mask | None = None,
        *,
        score_params: Any = None,
        dropout_rate: float = 0.0,
        dropout_rng: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        bound = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return attention(
            q, k, v, mask, score_params=score_params, dropout_rate=dropout_rate,
            dropout_rng=dropout_rng, **bound,
        )  # fmt: skip


jax.tree_util.register_static(Attention)


def _matrix(
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    v_MxE: jax.Array,
    mask: masks.Mask | None,
    sc: scores.Score,
    params: Any,
    fully_masked: str,
    dropout_rate: float,
    dropout_rng: jax.Array | None,
    dropout_draw: str,
) -> tuple[jax.Array, jax.Array]:
    lq, lk = q_LxD.shape[0], k_MxD.shape[0]
    pos_L, pos_M = jnp.arange(lq, dtype=jnp.int32), jnp.arange(lk, dtype=jnp.int32)
    s_LxM = scores.evaluate(sc, params, q_LxD, k_MxD, pos_L, pos_M)
    w_LxM, live_L1 = masks.softmax(s_LxM, masks.matrix(mask, lq, lk))
    mix_LxM = w_LxM
    if dropout_rate > 0.0:
        if dropout_draw == "bernoulli":
            keep_LxM = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, w_LxM.shape)
            keep_prob = jnp.asarray(1.0 - dropout_rate, w_LxM.dtype)
            mix_LxM = w_LxM * (keep_LxM.astype(w_LxM.dtype) / keep_prob)  # Flax's arithmetic
        else:
            keep_LxM, scale = layers.keep_mask(dropout_rng, dropout_rate, w_LxM.shape)
            mix_LxM = jnp.where(keep_LxM, w_LxM * jnp.asarray(scale, w_LxM.dtype), 0)
    out_LxE = jnp.einsum("lm,me->le", mix_LxM, v_MxE.astype(w_LxM.dtype))
    if fully_masked == "zero":  # else a dead row's uniform weights already give the mean of v
        out_LxE = jnp.where(live_L1, out_LxE, 0)
        w_LxM = jnp.where(live_L1, w_LxM, 0)  # dead code under jit unless the caller reads it
    return out_LxE.astype(v_MxE.dtype), w_LxM


def _xla(
    q_LxD: jax.Array,
    k_MxD: jax.Array,
    v_MxE: jax.Array,
    mask: masks.Mask | None,
    scale: Any,
    fully_masked: str,
) -> jax.Array:
    d, e = q_LxD.shape[-1], v_MxE.shape[-1]
    dtype = jnp.result_type(q_LxD, k_MxD, v_MxE)
    # dot_product_attention wants value and key of one shape and dtype: zero-pad the narrower
    # side to X = max(D, E) (zeros change neither q.k nor the mix of v) and pass the scale for
    # the true d.
    w = max(d, e)
    q_LxX = jnp.pad(q_LxD.astype(dtype), ((0, 0), (0, w - d)))
    k_MxX = jnp.pad(k_MxD.astype(dtype), ((0, 0), (0, w - d)))
    v_MxX = jnp.pad(v_MxE.astype(dtype), ((0, 0), (0, w - e)))
    mask_1x1xLxM = None
    if mask is not None:
        lq, lk = q_LxD.shape[0], k_MxD.shape[0]
        mask_LxM = jnp.broadcast_to(masks.matrix(mask, lq, lk), (lq, lk))
        mask_1x1xLxM = mask_LxM[None, None]
    out_1xLx1xX = jax.nn.dot_product_attention(
        q_LxX[None, :, None],
        k_MxX[None, :, None],
        v_MxX[None, :, None],
        mask=mask_1x1xLxM,
        scale=scale,
        implementation=None,
    )
    out_LxE = out_1xLx1xX[0, :, 0, :e]
    if mask is not None and fully_masked == "zero":
        # XLA averages the values over a fully masked row; the contract says 0.
        out_LxE = jnp.where(mask_LxM.any(axis=-1, keepdims=True), out_LxE, 0)
    return out_LxE.astype(v_MxE.dtype)


def _check(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: masks.Mask | None,
    sc: scores.Score,
    score_params: Any,
    implementation: str,
    q_chunk: int,
    k_chunk: int,
) -> None:
    """Trace-time validation: shapes and static arguments only, so it costs nothing under jit."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 2:
            raise ValueError(
                f"{name} must be rank 2 ([L, d], one unbatched sequence; vmap for batches/heads,"
                f" or attn.dot_product_attention); got shape {x.shape}"
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(
                f"{name} must be floating point (the output is a weighted mean of v, which an "
                f"integer dtype would truncate); got dtype {x.dtype}"
            )
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k must share d; got q {q.shape} and k {k.shape}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must share Lk; got k {k.shape} and v {v.shape}")
    if mask is not None:
        masks.check(mask, q.shape[0], k.shape[0])
    if implementation == "xla":
        _check_xla(q, k, v, sc)
    if implementation in fused.FUSED:
        fused.check(implementation, q, k, v, mask, scores.dot_scale(sc, q.shape[1]))
    _check_score_params(sc, score_params, q.shape[1])
    _check_chunks(q_chunk, k_chunk)


def _check_chunks(q_chunk: int, k_chunk: int) -> None:
    for name, c in (("q_chunk", q_chunk), ("k_chunk", k_chunk)):
        if isinstance(c, bool) or not isinstance(c, numbers.Integral):
            raise TypeError(f"{name} must be an int; got {c!r} of type {type(c).__name__}")
        if c < 1:
            raise ValueError(f"{name} must be >= 1; got {c}")


def _check_options(
    implementation: str, fully_masked: str, dropout_rate: float, dropout_rng: Any, draw: str
) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    if fully_masked not in FULLY_MASKED:
        raise ValueError(f"fully_masked must be one of {FULLY_MASKED}; got {fully_masked!r}")
    if draw not in DROPOUT_DRAWS:
        raise ValueError(f"dropout_draw must be one of {DROPOUT_DRAWS}; got {draw!r}")
    rate = dropout_rate
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout_rate must be a float in [0, 1); got {rate!r}")
    if rate > 0.0 and dropout_rng is None:
        raise ValueError(f"dropout_rate={rate} needs a dropout_rng; got None")
    if rate > 0.0 and implementation != "matrix":
        raise ValueError(
            f"attention dropout needs the weights, which only implementation='matrix' forms; "
            f"got implementation={implementation!r}"
        )


def _check_xla(q: jax.Array, k: jax.Array, v: jax.Array, sc: scores.Score) -> None:
    """What jax.nn.dot_product_attention cannot do, refused by name instead of failing inside."""
    if scores.dot_scale(sc, q.shape[1]) is None:
        raise ValueError(
            f"implementation='xla' supports only score='scaled_dot'; got score={sc.name!r}"
        )
    dtype = jnp.result_type(q, k, v)
    if dtype == jnp.float64:
        raise ValueError(
            "implementation='xla' computes in float32 at most, so float64 inputs would silently "
            "lose precision; use implementation='matrix' or 'chunked'"
        )
    if dtype == jnp.float16 and jax.default_backend() == "cpu":
        raise ValueError(
            "implementation='xla' cannot run float16 on CPU (XLA's CPU dot has no float16 "
            "kernel); use bfloat16, float32, or implementation='matrix' or 'chunked'"
        )


@functools.lru_cache(maxsize=256)
def _param_shapes(init: scores.InitFn, d: int, hidden: int | None) -> dict[str, tuple[int, ...]]:
    """{path: shape} of ``init(key, d, hidden=hidden)``, traced only (never allocated)."""
    kw = {} if hidden is None else {"hidden": hidden}
    tree = jax.eval_shape(lambda: init(jax.random.key(0), d, **kw))
    return {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _check_score_params(sc: scores.Score, score_params: Any, d: int) -> None:
    if sc.has_params is False and score_params is not None:
        raise ValueError(
            f"score={sc.name!r} takes no parameters; got score_params (a params tree built for "
            "another score?)"
        )
    if not sc.has_params:
        return
    if score_params is None:
        raise ValueError(
            f"score={sc.name!r} has parameters: pass score_params from "
            f"attn.scores.get_score({sc.name!r}).init(key, d); got score_params=None"
        )
    expected = _param_shapes(sc.init, d, None)
    got = {
        jax.tree_util.keystr(p): jnp.shape(x)
        for p, x in jax.tree_util.tree_leaves_with_path(score_params)
    }
    if sorted(got) != sorted(expected):
        raise ValueError(
            f"score_params for score={sc.name!r} must hold {sorted(expected)} (as "
            f"get_score({sc.name!r}).init(key, d) builds them); got {sorted(got)}"
        )
    if got == expected:
        return
    # Another hidden size is allowed (additive, mlp); another d is not. Name a wrong leaf of the
    # closest tree init can build.
    hiddens: list[int | None] = [None]
    if "hidden" in inspect.signature(sc.init).parameters:
        hiddens += sorted({n for shape in got.values() for n in shape})
    builds = {h: _param_shapes(sc.init, d, h) for h in hiddens}
    wrong = {h: [p for p in sorted(got) if got[p] != b.get(p)] for h, b in builds.items()}
    hidden = min(hiddens, key=lambda h: len(wrong[h]))
    if not wrong[hidden]:
        return
    path = wrong[hidden][0]
    call = f"init(key, {d})" if hidden is None else f"init(key, {d}, hidden={hidden})"
    raise ValueError(
        f"score_params for score={sc.name!r} do not fit q and k of d={d}: {path} has shape "
        f"{got[path]} where get_score({sc.name!r}).{call} builds {builds[hidden][path]}"
    )
