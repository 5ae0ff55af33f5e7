"""attn.chunked: online-softmax chunked attention equals the matrix form, in value and gradient."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close32, enable_x64
from jax.test_util import check_grads

from attn import chunked, reference, scores
from attn.attention import attention

SCORES = sorted(scores.SCORES)
LQ, LK, D, E = 7, 10, 4, 3  # not multiples of the chunk sizes below
# The sums a value and its gradients pass through (`conftest.tol32`): a score (mlp's: 3 D inputs
# to a hidden layer of D), a softmax and a weighted sum over LK keys, and the backward's again.
TERMS = 2 * (4 * D + 2 * LK)


def _inputs(seed, lq=LQ, lk=LK, dtype=jnp.float32):
    r = np.random.default_rng(seed)
    return tuple(jnp.asarray(r.normal(size=s), dtype) for s in ((lq, D), (lk, D), (lk, E)))


def _mask(seed, rank, lq=LQ, lk=LK):
    r = np.random.default_rng(seed + 100)
    if rank is None:
        return None
    if rank == 1:
        m = r.random(lk) < 0.6
        m[0], m[-1] = True, False
        return jnp.asarray(m)
    m = r.random((lq, lk)) < 0.5
    m[:, 0] = True
    m[3] = False  # a query that may attend nowhere
    m[5, :4] = False  # a query whose whole first key chunk is masked
    return jnp.asarray(m)


def _params(name):
    return scores.get_score(name).init(jax.random.key(1), D)


@functools.partial(jax.jit, static_argnames=("name", "implementation", "q_chunk", "k_chunk"))
def _value_and_grads(q, k, v, mask, p, *, name, implementation, q_chunk=3, k_chunk=4):
    def loss(q, k, v, p):
        out, _ = attention(
            q, k, v, mask, score=name, score_params=p, implementation=implementation,
            q_chunk=q_chunk, k_chunk=k_chunk,
        )  # fmt: skip
        return jnp.sum(jnp.sin(out)), out  # sin: a cotangent that differs per element

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, p)
    return out, grads


@pytest.mark.parametrize(
    "name, rank",
    [(name, 2) for name in SCORES] + [("scaled_dot", 1), ("additive", 1), ("scaled_dot", None)],
)
def test_chunked_matches_matrix_value_and_grad(name, rank):
    q, k, v = _inputs(0)
    mask, p = _mask(0, rank), _params(name)
    out_c, g_c = _value_and_grads(q, k, v, mask, p, name=name, implementation="chunked")
    out_m, g_m = _value_and_grads(q, k, v, mask, p, name=name, implementation="matrix")
    assert_close32(out_c, out_m, TERMS)
    for a, b in zip(jax.tree.leaves(g_c), jax.tree.leaves(g_m), strict=True):
        assert_close32(a, b, TERMS)
    # the matrix form is itself checked against the loop; check the chunked output directly too
    out_ref, _ = reference.attention(q, k, v, mask, score=name, score_params=p)
    assert_close32(out_c, out_ref, TERMS)


def test_cosine_score_has_finite_gradients_equal_to_the_matrix_form():
    # Undefined at zero: padding with zero rows would give 0/0 and NaN gradients at L=200.
    def cos(p, q, k):
        qn = q / jnp.linalg.norm(q, axis=-1, keepdims=True)
        return 10 * qn @ (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).T

    q = jax.random.normal(jax.random.key(0), (200, 8))
    grad = lambda impl: jax.jit(
        jax.grad(lambda q: attention(q, q, q, score=cos, implementation=impl)[0].sum())
    )(q)
    g_chunked, g_matrix = grad("chunked"), grad("matrix")
    assert np.all(np.isfinite(g_chunked))
    assert_close32(g_chunked, g_matrix, 2 * (8 + 2 * 200))


def test_score_never_sees_positions_past_the_end():
    # Finite on every real (q_i, k_j, i, j) and NaN beyond: chunks must hold real rows only.
    def beyond_is_nan(p, q, k, *, q_pos, k_pos):
        return q @ k.T + jnp.log(LQ - q_pos)[:, None] + jnp.log(LK - k_pos)[None, :]

    def loss(q, k, v, impl):
        out, _ = attention(
            q, k, v, _mask(5, 2), score=beyond_is_nan, implementation=impl, q_chunk=3, k_chunk=4
        )
        return jnp.sum(jnp.sin(out))

    q, k, v = _inputs(5)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    for a, b in zip(grad(q, k, v, "chunked"), grad(q, k, v, "matrix"), strict=True):
        assert np.all(np.isfinite(a))
        assert_close32(a, b, TERMS)


@pytest.mark.parametrize("q_chunk, k_chunk", [(1, 1), (7, 10), (64, 64), (2, 5), (4, 3)])
def test_any_chunk_sizes(q_chunk, k_chunk):
    q, k, v = _inputs(1)
    mask = _mask(1, 2)
    out_c, g_c = _value_and_grads(
        q, k, v, mask, None, name="scaled_dot", implementation="chunked",
        q_chunk=q_chunk, k_chunk=k_chunk,
    )  # fmt: skip
    out_m, g_m = _value_and_grads(q, k, v, mask, None, name="scaled_dot", implementation="matrix")
    assert_close32(out_c, out_m, TERMS)
    for a, b in zip(g_c[:3], g_m[:3], strict=True):
        assert_close32(a, b, TERMS)


def test_fully_masked_row_is_zero():
    q, k, v = _inputs(2)
    out = chunked.attention(q, k, v, _mask(2, 2), q_chunk=3, k_chunk=4)
    np.testing.assert_array_equal(out[3], 0.0)
    out = chunked.attention(q, k, v, jnp.zeros((LK,), bool), q_chunk=3, k_chunk=4)
    np.testing.assert_array_equal(out, 0.0)


def test_large_scores_do_not_overflow():
    # exp(q.k) overflows float32 here; the running max must keep every chunk in range.
    q, k, v = _inputs(3)
    out_c, _ = attention(100 * q, 100 * k, v, implementation="chunked", q_chunk=3, k_chunk=4)
    out_m, _ = attention(100 * q, 100 * k, v)
    assert np.all(np.isfinite(out_c))
    # Scores reach 4e4 here, where float32 rounds by about 2e-3; that moves a weight only where
    # a row's best two scores tie within it. They are 230 or more apart, so the weights are
    # one-hot (exp(-230) is 0 in float32) and both forms pick the same value row.
    assert_close32(out_c, out_m, TERMS)


# The other scores' chunked gradients equal the matrix form's (above), which are checked there.
@pytest.mark.parametrize("name", ["scaled_dot", "additive"])
def test_check_grads_chunked(name):
    with enable_x64():
        q, k, v = _inputs(4, lq=6, lk=6, dtype=jnp.float64)
        mask = _mask(4, 2, lq=6, lk=6)
        p = jax.tree.map(lambda x: x.astype(jnp.float64), _params(name))
        f = lambda q, k, v, p: attention(
            q, k, v, mask, score=name, score_params=p, implementation="chunked",
            q_chunk=2, k_chunk=4,
        )[0]  # fmt: skip
        check_grads(jax.jit(f), (q, k, v, p), order=1, modes=("fwd", "rev"))


def _temp_bytes(implementation, length, d=16):
    q = jax.ShapeDtypeStruct((length, d), jnp.float32)
    loss = lambda q: jnp.sum(
        attention(q, q, q, implementation=implementation, q_chunk=128, k_chunk=128)[0]
    )
    compiled = jax.jit(jax.grad(loss)).lower(q).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_backward_memory_stays_below_the_score_matrix():
    # One float32 [L, L] matrix is 16 MiB at L = 2048; the matrix form's backward needs several.
    length = 2048
    score_matrix = length * length * 4
    assert _temp_bytes("matrix", length) >= score_matrix
    assert _temp_bytes("chunked", length) < score_matrix / 8


def test_backward_memory_is_linear_in_length():
    # Without checkpointing each query chunk, the scan keeps a running max per (query, key chunk):
    # 4 * L * L / 128 bytes, 8 MiB at L = 16k, which makes the 4x longer input cost ~6x more.
    small, large = _temp_bytes("chunked", 4096), _temp_bytes("chunked", 16384)
    assert large / small <= 4.5, (small, large)


def test_program_size_does_not_grow_with_the_number_of_chunks():
    # lax.scan/lax.map, not Python loops: 32x more chunks must not mean a bigger program
    # (a loop would repeat the chunk body 512 times).
    def n_lines(length):
        q = jax.ShapeDtypeStruct((length, 8), jnp.float32)
        f = lambda q: attention(q, q, q, implementation="chunked", q_chunk=8, k_chunk=8)[0]
        return len(jax.jit(jax.grad(lambda q: f(q).sum())).lower(q).as_text().splitlines())

    assert n_lines(4096) <= 1.1 * n_lines(128)
