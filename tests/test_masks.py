"""Masks and scores that know positions: matrix and chunked against the per-pair numpy loop."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close32, enable_x64
from jax.test_util import check_grads

from attn import masks, reference, scores
from attn.attention import attention

LQ, LK, D, E = 7, 10, 4, 3  # not multiples of the chunk sizes below
CHUNKS = dict(q_chunk=3, k_chunk=4)
TERMS = D + 2 * LK  # a score over D features, a softmax and a weighted sum (`conftest.tol32`)
SEG = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2])  # segment ids of the LK keys (queries: first LQ)


def _inputs(seed, lq=LQ, lk=LK, d=D):
    r = np.random.default_rng(seed)
    return tuple(jnp.asarray(r.normal(size=s), jnp.float32) for s in ((lq, d), (lk, d), (lk, E)))


def alibi(params, q_LxD, k_MxD, *, q_pos, k_pos):
    """ALiBi-style: scaled dot product minus a penalty growing with the distance |i - j|."""
    del params
    distance_LxM = jnp.abs(q_pos[:, None] - k_pos[None, :]).astype(jnp.float32)
    return scores.scaled_dot(None, q_LxD, k_MxD) - 0.5 * distance_LxM


def alibi_pair(q, k, i, j):
    return q @ k / np.sqrt(q.shape[0]) - 0.5 * abs(i - j)


# (library mask, the same rule written per pair for the reference)
MASKS = {
    "causal": (masks.causal, lambda i, j: j <= i),
    "window": (masks.sliding_window(2, 1), lambda i, j: i - 2 <= j <= i + 1),
    "segments": (
        masks.segments(SEG[:LQ], SEG),
        lambda i, j: SEG[i] == SEG[j],
    ),
    "causal+padding": (
        masks.all_of(masks.causal, jnp.arange(LK) < 8),
        lambda i, j: j <= i and j < 8,
    ),
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_mask_functions_evaluate_to_their_per_pair_rule(name):
    fn, pair = MASKS[name]
    got = masks.matrix(fn, LQ, LK)
    expected = np.array([[pair(i, j) for j in range(LK)] for i in range(LQ)])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("implementation", ["matrix", "chunked", "xla"])
@pytest.mark.parametrize("name", sorted(MASKS))
def test_mask_functions_match_the_loop(name, implementation):
    q, k, v = _inputs(0)
    fn, pair = MASKS[name]
    out, _ = attention(q, k, v, fn, implementation=implementation, **CHUNKS)
    out_ref, _ = reference.attention(q, k, v, pair)
    assert_close32(out, out_ref, TERMS)


@pytest.mark.parametrize("mask_name", [None, "causal", "segments"])
def test_position_aware_score_matches_the_loop(mask_name):
    q, k, v = _inputs(1)
    fn, pair = MASKS[mask_name] if mask_name else (None, None)
    out_ref, w_ref = reference.attention(q, k, v, pair, score=alibi_pair)
    out_m, w_m = attention(q, k, v, fn, score=alibi)
    out_c, _ = attention(q, k, v, fn, score=alibi, implementation="chunked", **CHUNKS)
    assert_close32(w_m, w_ref, D + LK)
    assert_close32(out_m, out_ref, TERMS)
    assert_close32(out_c, out_ref, TERMS)


def test_mask_array_and_function_forms_agree_in_value_and_gradient():
    q, k, v = _inputs(2)
    fn = MASKS["window"][0]
    array = masks.matrix(fn, LQ, LK)

    def grads(mask, implementation):
        loss = lambda q, k, v: jnp.sum(
            jnp.sin(attention(q, k, v, mask, implementation=implementation, **CHUNKS)[0])
        )
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    expected = grads(array, "matrix")
    for mask, implementation in ((fn, "matrix"), (fn, "chunked"), (array, "chunked")):
        for a, b in zip(grads(mask, implementation), expected, strict=True):
            assert_close32(a, b, 2 * TERMS)


def test_alibi_and_causal_at_300_with_chunks_of_128():
    # A score that sees only chunk-local positions would restart its distances every 128 rows.
    length = 300
    q, k, v = _inputs(3, lq=length, lk=length, d=8)

    @functools.partial(jax.jit, static_argnames="implementation")
    def value_and_grads(q, k, v, implementation):
        def loss(q, k, v):
            out, _ = attention(
                q, k, v, masks.causal, score=alibi, implementation=implementation,
                q_chunk=128, k_chunk=128,
            )  # fmt: skip
            return jnp.sum(jnp.sin(out)), out

        return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    (_, out_m), g_m = value_and_grads(q, k, v, "matrix")
    (_, out_c), g_c = value_and_grads(q, k, v, "chunked")
    assert_close32(out_c, out_m, 8 + 2 * 300)
    for a, b in zip(g_c, g_m, strict=True):
        assert_close32(a, b, 2 * (8 + 2 * 300))
    rows = [0, 127, 128, 299]  # chunk edges
    out_ref, _ = reference.attention(
        q[jnp.array(rows)], k, v, lambda i, j: j <= rows[i],
        score=lambda q, k, i, j: alibi_pair(q, k, rows[i], j),
    )  # fmt: skip
    assert_close32(out_c[jnp.array(rows)], out_ref, 8 + 2 * 300)


def test_check_grads_position_aware_score_and_mask_function():
    # Chunked only: the matrix form's gradients are checked equal to chunked's above.
    with enable_x64():
        q, k, v = (x.astype(jnp.float64) for x in _inputs(6))
        f = lambda q, k, v: attention(
            q, k, v, MASKS["window"][0], score=alibi, implementation="chunked", **CHUNKS
        )[0]
        check_grads(jax.jit(f), (q, k, v), order=1, modes=("fwd", "rev"))


def test_segment_mask_works_under_vmap_with_per_example_ids():
    q, k, v = _inputs(4, lq=LK)
    seg_BxL = jnp.asarray(np.stack([SEG, SEG[::-1]]))
    one = lambda seg: attention(q, k, v, masks.segments(seg), implementation="chunked", **CHUNKS)
    out_BxLxE = jax.jit(jax.vmap(lambda seg: one(seg)[0]))(seg_BxL)
    for b in range(2):
        s = np.asarray(seg_BxL[b])
        out_ref, _ = reference.attention(q, k, v, lambda i, j, s=s: s[i] == s[j])
        assert_close32(out_BxLxE[b], out_ref, TERMS)


def test_bad_masks_and_positional_scores_raise_clearly():
    q, k, v = _inputs(5)
    with pytest.raises(TypeError, match="mask function must return bool"):
        attention(q, k, v, lambda qp, kp: (kp[None, :] <= qp[:, None]).astype(jnp.int32))
    with pytest.raises(ValueError, match=r"mask function must return \[Lq, Lk\].*\(7,\)"):
        attention(q, k, v, lambda qp, kp: qp > 2, implementation="chunked")
    with pytest.raises(ValueError, match=r"mask function must return \[Lq, Lk\].*\(3, 10\)"):
        attention(q, k, v, lambda qp, kp: jnp.ones((3, 10), bool))
    with pytest.raises(ValueError, match="left must be an int >= 0"):
        masks.sliding_window(-1, 0)
    with pytest.raises(TypeError, match="both q_pos and k_pos"):
        attention(q, k, v, score=lambda p, q, k, *, q_pos: q @ k.T)
    with pytest.raises(ValueError, match=r"must return \[Lq, Lk\] = \(7, 10\).*\(7, 7\)"):
        attention(q, k, v, score=lambda p, q, k: q @ q.T)


def test_arrays_inside_mask_functions_are_checked_against_the_lengths():
    # A too-short array indexed by position would clamp: rows 5..7 would reuse entry 4.
    q, k, v = _inputs(7, lq=8, lk=8)
    short = jnp.ones((5,), bool)
    for implementation in ("matrix", "chunked", "xla"):
        with pytest.raises(ValueError, match=r"all_of part 1, array\) has shape \(5,\).*\(8, 8\)"):
            attention(q, k, v, masks.all_of(masks.causal, short), implementation=implementation)
    nested = masks.all_of(masks.causal, masks.all_of(jnp.ones((8, 3), bool)))
    with pytest.raises(ValueError, match=r"part 1, all_of\) \(all_of part 0, array\).*\(8, 3\)"):
        masks.matrix(nested, 8, 8)
    with pytest.raises(ValueError, match=r"segments' query ids have shape \(3,\).*Lq=8.*\(8,\)"):
        masks.matrix(masks.segments(jnp.array([0, 1, 2])), 8, 8)
    with pytest.raises(ValueError, match=r"segments' key ids have shape \(9,\).*Lk=8"):
        attention(q, k, v, masks.segments(jnp.zeros(8, int), jnp.zeros(9, int)))
    with pytest.raises(ValueError, match=r"ids with a batch axis need attn.dot_product_attention"):
        attention(q, k, v, masks.segments(jnp.zeros((2, 8), int)))
    with pytest.raises(ValueError, match=r"lengths' key length has shape \(2,\)"):
        attention(q, k, v, masks.lengths(k_len=jnp.array([3, 4])))
    with pytest.raises(ValueError, match=r"all_of part 1, array"):  # at trace time under jit
        jax.jit(lambda q, m: attention(q, q, q, masks.all_of(masks.causal, m))[0])(q, short)
    for bad in (masks.all_of(masks.causal, short), masks.segments(jnp.arange(3))):
        with pytest.raises(ValueError) as info:
            masks.check(bad, 8, 8)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("shape", [(1, LK), (LQ, 1), (1, 1), (1,)])
@pytest.mark.parametrize("implementation", ["matrix", "chunked", "xla"])
def test_masks_broadcast_to_lq_by_lk(shape, implementation):
    q, k, v = _inputs(8)
    m = jnp.asarray(np.random.default_rng(8).random(shape) < 0.6).at[(0,) * len(shape)].set(True)
    full = np.broadcast_to(np.asarray(m), (LQ, LK))
    out_ref, _ = reference.attention(q, k, v, full)
    for mask in (m, masks.all_of(m, masks.causal)):
        kw = dict(implementation=implementation, **CHUNKS)
        out, _ = attention(q, k, v, mask, **kw)
        expected = (
            out_ref if mask is m else attention(q, k, v, full & np.tri(LQ, LK, dtype=bool))[0]
        )
        assert_close32(out, expected, TERMS)
    np.testing.assert_array_equal(np.broadcast_to(masks.matrix(m, LQ, LK), (LQ, LK)), full)


def test_mask_functions_are_pytrees_that_jit_and_vmap_take_as_arguments():
    q, k, v = _inputs(9, lq=LK)
    pad = jnp.arange(LK) < 8
    fn = masks.all_of(masks.causal, masks.segments(SEG), pad, masks.sliding_window(3, 0))
    assert len(jax.tree.leaves(fn)) == 3  # the ids twice and the padding; the rest is static
    traces = []

    @jax.jit
    def run(q, k, v, mask):
        traces.append(1)
        return attention(q, k, v, mask, implementation="chunked", **CHUNKS)[0]

    out = run(q, k, v, fn)
    run(
        q,
        k,
        v,
        masks.all_of(masks.causal, masks.segments(SEG[::-1]), ~pad, masks.sliding_window(3, 0)),
    )
    assert len(traces) == 1  # new arrays, same structure: no retrace
    out_ref, _ = reference.attention(
        q, k, v, lambda i, j: j <= i and SEG[i] == SEG[j] and j < 8 and i - 3 <= j
    )
    assert_close32(out, out_ref, TERMS)
    # A plain callable passes as a static part of as_fn's pytree.
    band = masks.as_fn(lambda qp, kp: jnp.abs(qp[:, None] - kp[None, :]) <= 1)
    assert_close32(run(q, k, v, band), attention(q, k, v, band)[0], TERMS)


def test_per_row_masks_carry_their_batch_axis():
    seg_BxL = jnp.asarray(np.stack([SEG, SEG[::-1]]))
    fn = masks.all_of(
        masks.segments(seg_BxL), masks.lengths(jnp.array([10, 6]), None), masks.causal
    )
    assert fn.batch_shape == (2,)
    rows = jax.vmap(lambda m: masks.matrix(m, LK, LK), in_axes=(fn.batch_axes(),))(fn)
    for b in range(2):
        s, n = np.asarray(seg_BxL[b]), (10, 6)[b]
        expected = [[s[i] == s[j] and i < n and j <= i for j in range(LK)] for i in range(LK)]
        np.testing.assert_array_equal(np.broadcast_to(rows[b], (LK, LK)), expected)
    assert masks.segments(SEG).batch_shape == () and masks.causal.batch_shape == ()
    with pytest.raises(ValueError, match="batch shapes differ"):
        masks.all_of(masks.segments(seg_BxL), masks.lengths(jnp.array([1, 2, 3])))
    with pytest.raises(TypeError, match="segments: ids must be integers; got dtype float32"):
        masks.segments(jnp.zeros(3))


def test_factor_sorts_every_part_into_its_kind_and_loses_nothing():
    r = np.random.default_rng(7)
    key_M, key_1xM = r.random(LK) < 0.8, r.random((1, LK)) < 0.8
    query_Lx1, full_LxM = r.random((LQ, 1)) < 0.8, r.random((LQ, LK)) < 0.8
    segs = masks.segments(SEG[:LQ], SEG)
    mask = masks.all_of(
        masks.causal,
        masks.all_of(masks.sliding_window(3, 2), masks.lengths(6, 9)),  # nested all_of
        masks.lengths(k_len=8),
        key_M,
        key_1xM,
        query_Lx1,
        segs,
        full_LxM,
    )
    f = masks.factor(mask, LQ, LK)
    assert f.band == (3, 0)  # causal's right bound 0 and the window's left bound 3
    assert (int(f.q_len), int(f.k_len)) == (6, 8)  # the shorter lengths
    np.testing.assert_array_equal(f.key_M, key_M & key_1xM[0])
    np.testing.assert_array_equal(f.query_L, query_Lx1[:, 0])
    assert [p.name for p in f.other] == ["segments", "array"]
    # The pieces, put back together, are the mask.
    rebuilt = masks.all_of(
        masks.sliding_window(*f.band),
        masks.lengths(f.q_len, f.k_len),
        f.key_M,
        f.query_L[:, None],
        *f.other,
    )
    np.testing.assert_array_equal(masks.matrix(rebuilt, LQ, LK), masks.matrix(mask, LQ, LK))


def test_factor_of_one_part_and_of_causal_alone():
    assert masks.factor(masks.causal, LQ, LK).band == (None, 0)
    f = masks.factor(jnp.ones((LK,), bool), LQ, LK)
    assert f.band is None and f.q_len is None and f.other == () and f.key_M.shape == (LK,)
    with pytest.raises(ValueError, match=r"does not broadcast to \[Lq, Lk\]"):
        masks.factor(jnp.ones((LK + 1,), bool), LQ, LK)  # checked first
