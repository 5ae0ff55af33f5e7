"""attn.attention: matrix and xla forms against the per-query numpy loop, jax.nn and Flax."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close32, enable_x64
from jax.test_util import check_grads

import attn
from attn import layers, reference, scores
from attn.attention import attention

SCORES = sorted(scores.SCORES)
LQ, LK, D, E = 5, 7, 4, 3
# The sums an output passes through (`conftest.tol32`): a score (mlp's, the longest: 3 D inputs
# to a hidden layer of D), then the softmax and the weighted sum over LK keys.
TERMS = 4 * D + 2 * LK


def _inputs(seed=0, lq=LQ, lk=LK, d=D, e=E, dtype=jnp.float32):
    r = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(r.normal(size=s), dtype) for s in ((lq, d), (lk, d), (lk, e)))
    return q, k, v


def _mask(seed, lq=LQ, lk=LK, rank=2):
    """Random mask with an all-masked row (rank 2) or ~40% masked keys (rank 1)."""
    r = np.random.default_rng(seed + 100)
    if rank == 1:
        m = r.random(lk) < 0.6
        m[0], m[-1] = True, False  # at least one allowed and one masked key
        return jnp.asarray(m)
    m = r.random((lq, lk)) < 0.6
    m[:, 0] = True
    m[1] = False  # query 1 may attend nowhere
    m[2, 0] = False
    return jnp.asarray(m)


def _params(name, d=D, seed=0):
    return scores.get_score(name).init(jax.random.key(seed), d)


@pytest.mark.parametrize("name", SCORES)
@pytest.mark.parametrize("rank", [1, 2])
def test_matrix_matches_per_query_loop(name, rank):
    q, k, v = _inputs(1)
    mask, p = _mask(1, rank=rank), _params(name)
    out, w = attention(q, k, v, mask, score=name, score_params=p)
    out_ref, w_ref = reference.attention(q, k, v, np.asarray(mask), score=name, score_params=p)
    chex.assert_shape(out, (LQ, E))
    chex.assert_shape(w, (LQ, LK))
    assert_close32(out, out_ref, TERMS)
    assert_close32(w, w_ref, TERMS)


@pytest.mark.parametrize("name", SCORES)
def test_matrix_without_mask_matches_loop(name):
    q, k, v = _inputs(2)
    p = _params(name)
    out, w = attention(q, k, v, score=name, score_params=p)
    out_ref, w_ref = reference.attention(q, k, v, score=name, score_params=p)
    assert_close32(out, out_ref, TERMS)
    assert_close32(w.sum(-1), 1.0, 2 * LK)


def test_callable_score_is_used():
    q, k, v = _inputs(3)
    out, w = attention(q, k, v, score=lambda p, q, k: 2.0 * (q @ k.T))
    out_dot, w_dot = attention(q, k, v, score="dot")
    assert_close32(w, jax.nn.softmax(2.0 * (q @ k.T)), D + 2 * LK)
    assert not np.allclose(w, w_dot)


def _batched_inputs(b=2, lq=6, lk=8, h=3, d=4, seed=4):
    """[B, L, H, d] tensors and a [B, H, Lq, Lk] mask with >= 1 allowed key per row."""
    r = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(r.normal(size=(b, n, h, d)), jnp.float32) for n in (lq, lk, lk))
    m = r.random((b, h, lq, lk)) < 0.5
    m[..., 0] = True
    return q, k, v, jnp.asarray(m)


TERMS_B = 4 + 2 * 8  # scaled_dot over _batched_inputs' d=4, softmax and sum over lk=8


def _ours_bhld(q, k, v, mask, **kw):
    """Our single-sequence attention vmapped over heads then batch, on [B, L, H, d] tensors."""
    f = lambda q, k, v, m: attention(q, k, v, m, **kw)[0]
    per_head = jax.vmap(f, in_axes=(1, 1, 1, 0), out_axes=1)
    return jax.vmap(per_head)(q, k, v, mask)


def test_scaled_dot_matches_jax_nn_dot_product_attention():
    q, k, v, m = _batched_inputs()
    expected = jax.nn.dot_product_attention(q, k, v, mask=m)
    assert_close32(_ours_bhld(q, k, v, m), expected, TERMS_B)


def test_scaled_dot_matches_flax_dot_product_attention():
    q, k, v, m = _batched_inputs(seed=5)
    expected = nn.dot_product_attention(q, k, v, mask=m, deterministic=True)
    assert_close32(_ours_bhld(q, k, v, m), expected, TERMS_B)


@pytest.mark.parametrize("rank", [None, 1, 2])
@pytest.mark.parametrize("e", [3, 4, 6])  # dv below, equal to and above d
def test_xla_matches_matrix(rank, e):
    q, k, v = _inputs(6, e=e)
    mask = None if rank is None else _mask(6, rank=rank)
    out, w = attention(q, k, v, mask, implementation="xla")
    assert w is None
    assert_close32(out, attention(q, k, v, mask)[0], D + 2 * LK)


@pytest.mark.parametrize("name", SCORES)
def test_check_grads_matrix(name):
    with enable_x64():
        q, k, v = _inputs(7, dtype=jnp.float64)
        mask = _mask(7)
        p = jax.tree.map(lambda x: x.astype(jnp.float64), _params(name))
        f = lambda q, k, v, p: attention(q, k, v, mask, score=name, score_params=p)[0]
        check_grads(jax.jit(f), (q, k, v, p), order=1, modes=("fwd", "rev"))


def test_xla_grads_match_matrix():
    # jax.nn computes its softmax in float32 even for float64 input, so a float64 finite
    # difference check cannot apply; compare against the matrix form's (checked) gradients.
    q, k, v = _inputs(8)
    mask = _mask(8)
    grad = lambda impl: jax.jit(
        jax.grad(
            lambda q, k, v: jnp.sum(attention(q, k, v, mask, implementation=impl)[0] ** 2),
            argnums=(0, 1, 2),
        )
    )(q, k, v)
    for g_xla, g_matrix in zip(grad("xla"), grad("matrix"), strict=True):
        assert_close32(g_xla, g_matrix, 2 * (D + 2 * LK))


class JitTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_same_with_and_without_jit(self):
        q, k, v = _inputs(9)
        mask = _mask(9)
        for implementation, name in [
            ("matrix", "additive"),
            ("chunked", "mlp"),
            ("xla", "scaled_dot"),
        ]:
            p = _params(name)
            kw = dict(score=name, implementation=implementation, q_chunk=2, k_chunk=3)
            f = self.variant(
                lambda q, k, v, m, p, kw=kw: attention(q, k, v, m, score_params=p, **kw)
            )
            out, w = f(q, k, v, mask, p)
            out_ref, w_ref = reference.attention(q, k, v, mask, score=name, score_params=p)
            assert_close32(out, out_ref, TERMS)
            if implementation == "matrix":
                assert_close32(w, w_ref, TERMS)
            else:
                assert w is None


@pytest.mark.parametrize("implementation", ["matrix", "chunked", "xla"])
def test_vmap_over_batch_and_heads_equals_loop(implementation):
    q, k, v, m = _batched_inputs(seed=10)
    m = m.at[0, 1, 2].set(False)  # one fully masked row
    kw = dict(implementation=implementation, q_chunk=4, k_chunk=3)
    got = _ours_bhld(q, k, v, m, **kw)
    single = jax.jit(lambda q, k, v, m: attention(q, k, v, m, **kw)[0])
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            out = single(q[b, :, h], k[b, :, h], v[b, :, h], m[b, h])
            assert_close32(got[b, :, h], out, TERMS_B)


@pytest.mark.parametrize("name", SCORES)
def test_masked_keys_get_exactly_zero_weight(name):
    q, k, v = _inputs(11)
    mask = _mask(11)
    _, w = attention(q, k, v, mask, score=name, score_params=_params(name))
    assert np.all(np.asarray(w)[~np.asarray(mask)] == 0.0)
    np.testing.assert_array_equal(w[1], 0.0)  # the fully masked row
    allowed_rows = np.asarray(mask).any(-1)
    assert_close32(np.asarray(w).sum(-1)[allowed_rows], 1.0, 2 * LK)


@pytest.mark.parametrize("name", SCORES)
def test_permutation_equivariance(name):
    q, k, v = _inputs(12)
    mask, p = _mask(12), _params(name)
    out, _ = attention(q, k, v, mask, score=name, score_params=p)
    r = np.random.default_rng(12)
    pq, pk = r.permutation(LQ), r.permutation(LK)
    out_q, _ = attention(q[pq], k, v, mask[pq], score=name, score_params=p)
    assert_close32(out_q, out[pq], TERMS)
    out_k, _ = attention(q, k[pk], v[pk], mask[:, pk], score=name, score_params=p)
    assert_close32(out_k, out, TERMS)


# chunked == matrix for every score is covered in test_chunked.py; two scores suffice here.
@pytest.mark.parametrize(
    "name, implementation",
    [(n, "matrix") for n in SCORES] + [("scaled_dot", "chunked"), ("mlp", "chunked")],
)
def test_padding_invariance(name, implementation):
    q, k, v = _inputs(13)
    mask, p = _mask(13, rank=1), _params(name)
    kw = dict(score=name, score_params=p, implementation=implementation, q_chunk=2, k_chunk=3)
    out, _ = attention(q, k, v, mask, **kw)
    r = np.random.default_rng(13)
    k_pad = jnp.concatenate([k, jnp.asarray(r.normal(size=(4, D)) * 50, jnp.float32)])
    v_pad = jnp.concatenate([v, jnp.asarray(r.normal(size=(4, E)) * 50, jnp.float32)])
    mask_pad = jnp.concatenate([mask, jnp.zeros(4, bool)])
    out_pad, _ = attention(q, k_pad, v_pad, mask_pad, **kw)
    assert_close32(out_pad, out, 4 * D + 2 * (LK + 4))


@pytest.mark.parametrize("implementation", ["matrix", "chunked", "xla"])
def test_fully_masked_row_is_zero_with_finite_grads(implementation):
    q, k, v = _inputs(14)
    mask = jnp.zeros((LQ, LK), bool).at[0].set(True)  # only query 0 may attend
    kw = dict(implementation=implementation, q_chunk=2, k_chunk=3)
    out, _ = attention(q, k, v, mask, **kw)
    np.testing.assert_array_equal(out[1:], 0.0)
    assert np.all(np.isfinite(out))
    loss = lambda q, k, v, mask: attention(q, k, v, mask, **kw)[0].sum()
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    grads = grad(q, k, v, mask)
    for g in grads:
        assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(grads[0][1:], 0.0)  # masked queries influence nothing
    # with every key masked everywhere too
    g_none = grad(q, k, v, jnp.zeros((LQ, LK), bool))
    for g in g_none:
        np.testing.assert_array_equal(g, 0.0)


# chunked == matrix for every score is covered in test_chunked.py; two scores suffice here.
@pytest.mark.parametrize(
    "name, implementation",
    [(n, "matrix") for n in SCORES] + [("scaled_dot", "chunked"), ("mlp", "chunked")],
)
def test_bfloat16_close_to_float32(name, implementation):
    q, k, v = _inputs(15)
    mask, p = _mask(15), _params(name)
    kw = dict(score=name, score_params=p, implementation=implementation, q_chunk=2, k_chunk=3)
    out32, _ = attention(q, k, v, mask, **kw)
    bf = lambda x: x.astype(jnp.bfloat16)
    out16, w16 = attention(bf(q), bf(k), bf(v), mask, **kw)
    assert out16.dtype == jnp.bfloat16
    if w16 is not None:
        assert w16.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out16, np.float32)))
    # bfloat16's, not float32's: q, k and v keep 8 significant bits (2^-8 = 3.9e-3 relative), and
    # the scores (|q.k| up to a few units) and the output carry that a dozen times over.
    np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("name", SCORES)
def test_bfloat16_weights_match_float64_at_d32(name):
    # Scores in float32 whatever the input dtype: the bfloat16 values, taken exactly, must give
    # the float64 weights to float32 accuracy (scaling q in bfloat16 would cost 2e-3 here).
    q, k, v = _inputs(18, lq=16, lk=16, d=32, e=8, dtype=jnp.bfloat16)
    p = _params(name, d=32)
    mask = _mask(18, lq=16, lk=16)
    _, w = attention(q, k, v, mask, score=name, score_params=p)
    assert w.dtype == jnp.float32
    _, w_ref = reference.attention(
        np.asarray(q, np.float64), np.asarray(k, np.float64), v, np.asarray(mask),
        score=name, score_params=p,
    )  # fmt: skip
    assert_close32(w, w_ref, 4 * 32 + 2 * 16)


def test_xla_bfloat16_close_to_float32():
    q, k, v = _inputs(16)
    mask = _mask(16)
    out32, _ = attention(q, k, v, mask, implementation="xla")
    bf = lambda x: x.astype(jnp.bfloat16)
    out16, _ = attention(bf(q), bf(k), bf(v), mask, implementation="xla")
    assert out16.dtype == jnp.bfloat16
    # bfloat16's, not float32's: q, k and v keep 8 significant bits (2^-8 = 3.9e-3 relative), and
    # the scores (|q.k| up to a few units) and the output carry that a dozen times over.
    np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=5e-2, rtol=5e-2)


_q, _k, _v = _inputs(17)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(q=_q[None]), ValueError, ["q", "(1, 5, 4)"]),
        (dict(k=_k[0]), ValueError, ["k", "(4,)"]),
        (dict(v=_v[None]), ValueError, ["v", "(1, 7, 3)"]),
        (dict(k=_k[:, :3]), ValueError, ["q", "k", "(7, 3)"]),
        (dict(v=_v[:6]), ValueError, ["v", "(6, 3)"]),
        (dict(mask=jnp.ones((LK + 1,), bool)), ValueError, ["mask", "(8,)"]),
        (dict(mask=jnp.ones((LK, LQ), bool)), ValueError, ["mask", "(7, 5)"]),
        (dict(mask=jnp.ones((LQ, LK), jnp.int32)), TypeError, ["mask", "int32"]),
        (dict(score="dott"), ValueError, ["score", "'dott'", "scaled_dot", "additive"]),
        (dict(score=3), TypeError, ["score", "int"]),
        (dict(score="general"), ValueError, ["score_params", "general"]),
        (dict(implementation="flash"), ValueError, ["implementation", "'flash'", "chunked"]),
        (dict(implementation="xla", score="dot"), ValueError, ["xla", "'dot'"]),
        (
            dict(
                q=_q.astype(jnp.float16),
                k=_k.astype(jnp.float16),
                v=_v.astype(jnp.float16),
                implementation="xla",
            ),
            ValueError,
            ["xla", "float16 on CPU", "'matrix'"],
        ),
        (dict(score_params={"w_DxD": jnp.eye(D)}), ValueError, ["'scaled_dot' takes no param"]),
        (
            dict(score="additive", score_params={"w_DxD": jnp.eye(D)}),
            ValueError,
            ["score_params for score='additive'", "'v_H'", "['w_DxD']"],
        ),
        (dict(mask=lambda qp, kp: qp), TypeError, ["mask function must return bool", "int32"]),
        (dict(q_chunk=0), ValueError, ["q_chunk", "0"]),
        (dict(k_chunk=-2), ValueError, ["k_chunk", "-2"]),
        (dict(k_chunk=2.5), TypeError, ["k_chunk", "2.5"]),
    ],
)
def test_bad_arguments_raise_with_clear_message(kwargs, exc, words):
    args = dict(q=_q, k=_k, v=_v, mask=None)
    args.update(kwargs)
    with pytest.raises(exc) as info:
        attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("mask"), **args)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_xla_refuses_float64_instead_of_losing_precision():
    with enable_x64():
        q, k, v = _inputs(19, dtype=jnp.float64)
        with pytest.raises(ValueError, match="float64 inputs would silently lose precision"):
            attention(q, k, v, implementation="xla")
        out, _ = attention(q, k, v)  # the matrix form computes in float64
        assert out.dtype == jnp.float64


def test_callable_score_receives_the_params_it_is_given():
    q, k, v = _inputs(20)
    bilinear = lambda p, q, k: q @ p @ k.T
    w_DxD = jnp.asarray(np.random.default_rng(20).normal(size=(D, D)), jnp.float32)
    _, w = attention(q, k, v, score=bilinear, score_params=w_DxD)
    _, w_ref = attention(q, k, v, score="general", score_params={"w_DxD": w_DxD})
    assert_close32(w, w_ref, 2 * D + 2 * LK)


def test_validation_runs_at_trace_time_under_jit():
    with pytest.raises(ValueError, match="k and v must share Lk"):
        jax.jit(lambda q, k, v: attention(q, k, v))(_q, _k, _v[:6])


@pytest.mark.parametrize("implementation", ["matrix", "chunked", "xla"])
def test_integer_values_are_refused_not_truncated(implementation):
    q, k, _ = _inputs(21)
    v_int = jnp.arange(LK * E, dtype=jnp.int32).reshape(
        LK, E
    )  # a weighted mean of it is fractional
    with pytest.raises(TypeError, match="v must be floating point.*int32"):
        attention(q, k, v_int, implementation=implementation)
    out, _ = attention(q, k, v_int.astype(jnp.float32), implementation=implementation)
    assert out.dtype == jnp.float32 and not np.allclose(out, np.round(out))


def test_score_params_for_another_d_are_refused_by_shape():
    q, k, v = _inputs(22)
    general_8 = _params("general", d=8)
    with pytest.raises(ValueError) as info:
        attention(q, k, v, score="general", score_params=general_8)
    message = str(info.value)
    assert "\n" not in message
    for w in ("score='general'", "d=4", "['w_DxD']", "(8, 8)", "(4, 4)"):
        assert w in message, (w, message)
    with pytest.raises(
        ValueError, match=r"\['wk_DxH'\] has shape \(8, 8\).*hidden=8\) builds \(4, 8\)"
    ):
        attention(q, k, v, score="additive", score_params=_params("additive", d=8))
    # Another hidden size is no fault: the params fit d.
    p7 = scores.get_score("mlp").init(jax.random.key(0), D, hidden=7)
    out, _ = attention(q, k, v, score="mlp", score_params=p7)
    assert_close32(out, reference.attention(q, k, v, score="mlp", score_params=p7)[0], TERMS)


@pytest.mark.parametrize("implementation", ["matrix", "chunked", "xla"])
def test_fully_masked_mean_gives_jax_nn_s_numbers(implementation):
    q, k, v = _inputs(23, e=D)  # jax.nn takes values of the keys' shape
    mask = _mask(23)  # row 1 attends nowhere
    kw = dict(implementation=implementation, q_chunk=2, k_chunk=3, fully_masked="mean")
    out, w = attention(q, k, v, mask, **kw)
    expected = jax.nn.dot_product_attention(q[:, None], k[:, None], v[:, None], mask=mask)[:, 0]
    assert_close32(out, expected, D + 2 * LK)
    assert_close32(out[1], np.asarray(v).mean(0), LK)
    if w is not None:
        assert_close32(w[1], 1.0 / LK, 1)
    grads = jax.grad(lambda v: attention(q, k, v, mask, **kw)[0][1].sum())(v)
    assert_close32(grads, np.full((LK, D), 1.0 / LK), 2 * LK)


def test_attention_binds_static_arguments_in_a_form_jit_takes():
    q, k, v = _inputs(24)
    mask, p = _mask(24), _params("additive")
    bound = attn.Attention(score="additive", implementation="chunked", q_chunk=2, k_chunk=3)
    assert bound == attn.Attention("additive", "chunked", 2, 3)
    assert hash(bound) == hash(attn.Attention("additive", "chunked", 2, 3))
    assert jax.tree.leaves(bound) == []
    expected, _ = attention(
        q, k, v, mask, score="additive", score_params=p, implementation="chunked", q_chunk=2,
        k_chunk=3,
    )  # fmt: skip
    out, w = jax.jit(bound)(q, k, v, mask, score_params=p)
    assert_close32(out, expected, TERMS)
    assert w is None
    traces = []

    @jax.jit
    def run(q, attend, p):  # the bound attention is an ordinary argument
        traces.append(1)
        return attend(q, k, v, mask, score_params=p)[0]

    run(q, bound, p)
    run(q, attn.Attention(score="additive", implementation="chunked", q_chunk=2, k_chunk=3), p)
    assert len(traces) == 1  # equal by value: one trace
    # A resolved Score is a static pytree too: no static_argnames needed.
    out_score, _ = jax.jit(attention)(
        q, k, v, mask, score=scores.get_score("additive"), score_params=p
    )
    assert_close32(out_score, attention(q, k, v, mask, score="additive", score_params=p)[0], TERMS)
    with pytest.raises(ValueError, match="implementation must be one of"):
        attn.Attention(implementation="flash")
    with pytest.raises(ValueError, match="score must be one of"):
        attn.Attention(score="dott")


def test_attention_dropout_scales_kept_weights_like_flax():
    q, k, v = _inputs(25)
    mask, rng = _mask(25), jax.random.key(3)
    out, w = attention(q, k, v, mask, dropout_rate=0.25, dropout_rng=rng)
    keep, scale = layers.keep_mask(rng, 0.25, (LQ, LK))
    np.testing.assert_allclose(out, (np.asarray(w) * np.asarray(keep) * scale) @ v, atol=1e-5)
    # Flax's draw on request: jax.random.bernoulli's mask for the same key.
    out, _ = attention(q, k, v, mask, dropout_rate=0.25, dropout_rng=rng, dropout_draw="bernoulli")
    keep = jax.random.bernoulli(rng, 0.75, (LQ, LK))
    assert_close32(out, (np.asarray(w) * np.asarray(keep) / 0.75) @ np.asarray(v), 2 * LK)
    assert_close32(w, attention(q, k, v, mask)[1], TERMS)  # weights before dropout
    assert not np.allclose(out, attention(q, k, v, mask)[0], atol=1e-3)
    for kw, words in (
        (dict(dropout_rate=0.1), "needs a dropout_rng"),
        (
            dict(dropout_rate=0.1, dropout_rng=rng, implementation="chunked"),
            "only implementation='matrix'",
        ),
        (dict(dropout_rate=1.0, dropout_rng=rng), "dropout_rate must be a float in"),
        (dict(fully_masked="nan"), "fully_masked must be one of"),
        (dict(dropout_draw="flax"), "dropout_draw must be one of"),
    ):
        with pytest.raises(ValueError, match=words):
            attention(q, k, v, mask, **kw)
