"""attn.fused on CPU: every refusal, the Pallas splash kernel against the matrix form, and the
cuDNN path as far as a CPU can take it.

Splash runs in Pallas's interpreters: through `attn.attention` inside jax's TPU interpret mode
(`force_tpu_interpret_mode`), which runs one sequence but not a vmapped kernel, and under vmap
in Pallas's generic interpreter (`fused.splash(..., interpret=True)`). cuDNN cannot run on a
CPU: its path is checked with jax.nn's XLA form standing in for the kernel (attn's mask routing,
padding, batching and zeroing around it), and traced with jax's own cuDNN primitives and
batching rules, which is where a vmapped call can fail.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import enable_x64
from jax.experimental.pallas import tpu as pltpu

import attn
from attn import fused, masks
from attn.attention import attention

# jax 0.7.2 and 0.10.2 have it; a jax without it skips what needs it.
tpu_interpret = pytest.mark.skipif(
    not hasattr(pltpu, "force_tpu_interpret_mode"),
    reason="this jax has no jax.experimental.pallas.tpu.force_tpu_interpret_mode",
)

LQ, LK, D, E = 20, 23, 8, 6  # not multiples of splash's 128-row blocks; dv != d
EPS = float(jnp.finfo(jnp.float32).eps)


def _inputs(seed=0, lq=LQ, lk=LK, d=D, e=E, lead=(), dtype=jnp.float32):
    r = np.random.default_rng(seed)
    shapes = ((*lead, lq, d), (*lead, lk, d), (*lead, lk, e))
    return tuple(jnp.asarray(r.normal(size=s), dtype) for s in shapes)


def _close(got, want, terms):
    """got and want: ((loss, out), grads) of jax.value_and_grad(..., has_aux=True); the outputs
    and gradients are compared (the loss sums hundreds of outputs, so it carries their errors
    summed). Float32 bound: each output is a softmax-weighted mean over at most LK keys of scores
    summed over D products, and the kernels order those sums differently (blocks, a running
    max and sum, q scaled before the dot). Each sum carries a relative error of at most about
    (its terms) * eps, so outputs and gradients agree within 8 (LK + D) eps of their largest
    magnitude: a factor 8 for exp, the division and the backward's two passes."""
    got, want = ((r[0][1], *r[1]) for r in (got, want))
    for g, w in zip(got, want, strict=True):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, atol=8 * terms * EPS * float(np.abs(w).max()), rtol=0)


def _value_and_grads(q, k, v, mask, implementation, fully_masked="zero"):
    def loss(q, k, v):
        out = attention(q, k, v, mask, implementation=implementation, fully_masked=fully_masked)
        return jnp.sin(out[0]).sum(), out[0]

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)


KEYS_M = jnp.arange(LK) < 19  # the last 4 keys are padding
SPLASH_MASKS = {
    # Queries 17.. may attend nowhere: output 0 (or the mean of v), finite gradients.
    "key padding, query lengths": masks.all_of(KEYS_M, masks.lengths(q_len=17)),
    "causal, key lengths": masks.all_of(masks.causal, masks.lengths(k_len=15)),
    "sliding window, key padding": masks.all_of(masks.sliding_window(3, 2), KEYS_M),
}


@tpu_interpret
@pytest.mark.parametrize("name", sorted(SPLASH_MASKS))
def test_splash_equals_the_matrix_form_in_value_and_gradient(name):
    q, k, v = _inputs(1)
    mask = SPLASH_MASKS[name]
    fully_masked = "mean" if name.startswith("causal") else "zero"
    want = _value_and_grads(q, k, v, mask, "matrix", fully_masked)
    with pltpu.force_tpu_interpret_mode():
        got = jax.jit(_value_and_grads, static_argnums=(4, 5))(
            q, k, v, mask, "splash", fully_masked
        )
    _close(got, want, LK + D)
    if name == "key padding, query lengths":
        assert np.all(got[0][1][17:] == 0)  # rows with nothing allowed are exactly 0


def test_splash_under_vmap_over_rows_and_heads():
    """Per-row key lengths (one row has none) shared by the heads, in Pallas's generic
    interpreter, which runs the kernel's batching rule (one more grid axis per vmap)."""
    q, k, v = _inputs(2, lead=(2, 3))
    k_len_B = jnp.array([17, 0])
    scale = D**-0.5

    def batched(one):
        return jax.vmap(jax.vmap(one, in_axes=(0, 0, 0, None)), in_axes=(0, 0, 0, 0))

    def loss(q, k, v, one):
        out = batched(one)(q, k, v, k_len_B)
        return jnp.sin(out).sum(), out

    def splash(q, k, v, n):
        return fused.splash(q, k, v, masks.lengths(k_len=n), scale=scale, interpret=True)

    def matrix(q, k, v, n):
        return attention(q, k, v, masks.lengths(k_len=n))[0]

    grads = functools.partial(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    got = jax.jit(grads, static_argnums=3)(q, k, v, splash)
    _close(got, grads(q, k, v, matrix), LK + D)
    assert np.all(got[0][1][1] == 0)


def _xla_for_cudnn(monkeypatch):
    """jax.nn's XLA form in place of its cuDNN one, which needs an NVIDIA GPU."""
    real = jax.nn.dot_product_attention

    def xla(*args, implementation, **kwargs):
        assert implementation == "cudnn"
        return real(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", xla)


CUDNN_MASKS = {
    # cuDNN's causal mask with its key lengths; the row of length 0 may attend nowhere.
    "causal, key lengths": lambda n: masks.all_of(masks.causal, masks.lengths(k_len=n)),
    # A left window with key lengths could leave a query no key: lengths go in the dense mask.
    "left window, key lengths": lambda n: masks.all_of(
        masks.sliding_window(2, 0), masks.lengths(k_len=n)
    ),
    # A window with a right side, key padding and a query mask: all dense, or row zeroing.
    "window, arrays": lambda n: masks.all_of(
        masks.sliding_window(1, 3), jnp.arange(LQ - 1) < n, jnp.arange(LQ - 1)[:, None] != 4
    ),
}


@pytest.mark.parametrize("fully_masked", ["zero", "mean"])
@pytest.mark.parametrize("name", sorted(CUDNN_MASKS))
def test_cudnn_path_equals_the_matrix_form_under_vmap_and_grad(monkeypatch, name, fully_masked):
    _xla_for_cudnn(monkeypatch)
    q, k, v = _inputs(3, lq=LQ - 1, lk=LQ - 1, lead=(2, 3))  # odd: cuDNN pads a dense mask
    k_len_B = jnp.array([13, 0])
    make_mask = CUDNN_MASKS[name]

    def loss(q, k, v, impl):
        def one(q, k, v, n):
            if impl == "cudnn":
                return fused.cudnn(q, k, v, make_mask(n), scale=D**-0.5, fully_masked=fully_masked)
            return attention(q, k, v, make_mask(n), fully_masked=fully_masked)[0]

        # k and v shared by the heads, the mask by the heads and rows of its row.
        out = jax.vmap(jax.vmap(one, in_axes=(0, None, None, None)))(q, k, v, k_len_B)
        return jnp.sin(out).sum(), out

    grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
    _close(grads(q, k[:, 0], v[:, 0], "cudnn"), grads(q, k[:, 0], v[:, 0], "matrix"), LQ + D)


def test_cudnn_traces_through_jax_s_cudnn_batching_and_differentiation_rules(monkeypatch):
    """The real cuDNN primitives, traced (not compiled) with jax's cuDNN version check stubbed:
    their batching rules reshape every operand with the query's batch axes, so k and v shared
    by the heads, a mask shared by them, and the ones a vmapped grad seeds must all arrive
    mapped alike."""
    cudnn_lib = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    if not hasattr(cudnn_lib, "check_cudnn_version"):
        pytest.skip("this jax checks for cuDNN elsewhere")
    monkeypatch.setattr(cudnn_lib, "check_cudnn_version", lambda: 90800)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    q, k, v = _inputs(4, lq=16, lk=16, lead=(2, 3), dtype=jnp.bfloat16)
    k, v, keep_BxM = k[:, 0], v[:, 0], jnp.arange(16) < jnp.array([[12], [16]])

    def one(q, k, v, keep_M):
        mask = masks.all_of(masks.causal, keep_M)
        return attention(q, k, v, mask, implementation="cudnn")[0].astype(jnp.float32)

    heads = jax.vmap(one, in_axes=(0, None, None, None))
    rows = jax.vmap(heads)
    g = jax.eval_shape(jax.grad(lambda q, k, v: rows(q, k, v, keep_BxM).sum(), (0, 1, 2)), q, k, v)
    assert [x.shape for x in g] == [q.shape, k.shape, v.shape]
    per_head = jax.vmap(jax.grad(lambda q, k, v, m: one(q, k, v, m).sum()), (0, None, None, None))
    assert jax.eval_shape(jax.vmap(per_head), q, k, v, keep_BxM).shape == q.shape
    # attn.dot_product_attention: jax.nn's layout, its key lengths and causal mask.
    out = jax.eval_shape(
        functools.partial(attn.dot_product_attention, is_causal=True, implementation="cudnn"),
        q.transpose(0, 2, 1, 3),
        k[:, :, None],
        v[:, :, None],
        key_value_seq_lengths=jnp.array([12, 16]),
    )
    assert out.shape == (2, 16, 3, E)


@tpu_interpret
def test_the_batched_form_traces_splash_per_row_and_head():
    q, k, v = _inputs(5, lq=16, lk=16, lead=(2, 3))
    qkv = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]  # [B, L, N, H]
    f = functools.partial(attn.dot_product_attention, is_causal=True, implementation="splash")
    with pltpu.force_tpu_interpret_mode():  # traced only: jax cannot interpret it vmapped
        g = jax.eval_shape(
            jax.grad(lambda q, k, v: f(q, k, v, key_value_seq_lengths=jnp.array([9, 16])).sum()),
            *qkv,
        )
    assert g.shape == qkv[0].shape


def test_the_fused_names_are_implementations_and_bind_statically():
    assert set(fused.FUSED) <= set(attn.IMPLEMENTATIONS)
    assert attn.Attention(implementation="splash") == attn.Attention(implementation="splash")


_q, _k, _v = _inputs(6)


@pytest.mark.parametrize(
    "implementation, kwargs, words",
    [
        ("cudnn", {}, ["'cudnn'", "NVIDIA GPU", "'cpu'", "'xla'"]),
        ("splash", {}, ["'splash'", "TPU", "force_tpu_interpret_mode", "'cpu'", "'xla'"]),
        ("cudnn", dict(score="dot"), ["scaled dot product only", "'matrix' or 'chunked'"]),
        ("splash", dict(score="dot"), ["scaled dot product only", "'matrix' or 'chunked'"]),
    ],
)
def test_off_their_hardware_or_score_the_kernels_refuse_in_one_line(implementation, kwargs, words):
    with pytest.raises(ValueError) as info:
        attention(_q, _k, _v, implementation=implementation, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w in message, (w, message)


@tpu_interpret
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (
            {n: x.astype(jnp.float16) for n, x in zip("qkv", (_q, _k, _v), strict=True)},
            ["'splash'", "float32 or bfloat16", "float16"],
        ),
        (dict(mask=masks.segments(jnp.arange(LQ), jnp.arange(LK))), ["segments mask", "'xla'"]),
        (dict(mask=jnp.ones((LQ, LK), bool)), ["array mask", "'xla'"]),
        (dict(mask=lambda qp, kp: qp[:, None] >= kp[None, :]), ["<lambda> mask"]),
        (dict(k=_k[:5], v=_v[:5], mask=masks.causal), ["Lq <= Lk", "Lq=20, Lk=5"]),
        (
            dict(dropout_rate=0.1, dropout_rng=jax.random.key(0)),
            ["attention dropout", "implementation='matrix'"],
        ),
    ],
)
def test_splash_refuses_what_its_kernel_cannot_compute_in_one_line(kwargs, words):
    args = dict(q=_q, k=_k, v=_v, implementation="splash")
    args.update(kwargs)
    with pltpu.force_tpu_interpret_mode(), pytest.raises(ValueError) as info:
        attention(**args)
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w in message, (w, message)


@tpu_interpret
def test_splash_refuses_float64_which_it_would_compute_in_float32():
    with enable_x64(), pltpu.force_tpu_interpret_mode(), pytest.raises(ValueError) as info:
        attention(*(x.astype(jnp.float64) for x in (_q, _k, _v)), implementation="splash")
    assert "float32 or bfloat16; got float64" in str(info.value)


_q264, _k264, _ = _inputs(7, d=264)


@pytest.mark.parametrize(
    "q, k, words",
    [
        (_q, _k, ["'cudnn'", "float16 or bfloat16", "float32", "'bfloat16'", "'xla'"]),
        (_q264.astype(jnp.bfloat16), _k264, ["head dims up to 256", "264", "'xla'"]),
    ],
)
def test_cudnn_refuses_dtypes_and_head_dims_its_kernel_lacks_in_one_line(monkeypatch, q, k, words):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # checked before the kernel
    v = _v.astype(q.dtype)
    with pytest.raises(ValueError) as info:
        attention(q, k.astype(q.dtype), v, implementation="cudnn")
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w in message, (w, message)
