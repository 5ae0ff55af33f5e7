"""attn.dot_product_attention against jax.nn.dot_product_attention over jax.nn's whole signature,
against attn.attention per (row, head), and against the per-query numpy loop for attn's own
scores and per-row masks."""

import functools
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attn
from attn import masks, reference, scores
from attn.attention import attention
from benchmarks.attention import hlo_program

B, T, S, N, K, H = 2, 5, 7, 4, 2, 8


def _qkv(seed=0, b=B, t=T, s=S, n=N, k=K, h=H, hv=None, dtype=jnp.float32):
    r = np.random.default_rng(seed)
    shapes = ((b, t, n, h), (b, s, k, h), (b, s, k, hv or h))
    return tuple(jnp.asarray(r.normal(size=shape), dtype) for shape in shapes)


def _bool(seed, shape, p=0.7):
    return jnp.asarray(np.random.default_rng(seed).random(shape) < p)


def _normal(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


# jax.nn's arguments, one feature per case, then all of them at once.
CASES = {
    "mha": dict(heads=N),
    "gqa": dict(),
    "mqa": dict(heads=1),
    "causal": dict(is_causal=True),
    "window_int": dict(local_window_size=1),
    "window_tuple": dict(local_window_size=(2, 0)),
    "lengths": dict(
        query_seq_lengths=jnp.array([3, 5], jnp.int32),
        key_value_seq_lengths=jnp.array([7, 2], jnp.int32),
    ),
    "mask_BxNxTxS": dict(mask=_bool(1, (B, N, T, S))),
    "mask_TxS": dict(mask=_bool(2, (T, S))),
    "mask_Bx1x1xS": dict(mask=_bool(3, (B, 1, 1, S))),
    "mask_1xNxTxS": dict(mask=_bool(4, (1, N, T, S))),
    "mask_1x1xTx1": dict(mask=_bool(5, (1, 1, T, 1))),
    "bias_BxNxTxS": dict(bias=_normal(6, (B, N, T, S))),
    "bias_1xNx1xS_and_mask": dict(bias=_normal(7, (1, N, 1, S)), mask=_bool(8, (B, 1, T, S))),
    "scale": dict(scale=0.25, is_causal=True),
    "everything": dict(
        bias=_normal(9, (B, 1, T, S)),
        mask=_bool(10, (B, N, T, S), 0.8),
        scale=0.5,
        is_causal=True,
        local_window_size=(3, 1),
        query_seq_lengths=jnp.array([4, 5], jnp.int32),
        key_value_seq_lengths=jnp.array([6, 3], jnp.int32),
    ),
    "unbatched": dict(batch=False, mask=_bool(11, (N, T, S))),
}
BF16 = ["gqa", "mask_Bx1x1xS", "everything", "unbatched"]


def _case(name, dtype):
    kw = dict(CASES[name])
    heads, batch = kw.pop("heads", K), kw.pop("batch", True)
    q, k, v = _qkv(seed=len(name), k=heads, dtype=dtype)
    if not batch:
        q, k, v = q[0], k[0], v[0]
    return q, k, v, kw


def _value_and_grads(fn, q, k, v, kw):
    """out, and the gradients wrt q, k, v (and bias) of a loss with a per-element cotangent."""
    bias = kw.pop("bias", None)
    cot = jnp.asarray(np.random.default_rng(99).normal(size=q.shape[:-1] + v.shape[-1:]))

    @jax.jit
    def run(q, k, v, bias):
        def loss(q, k, v, bias):
            out = fn(q, k, v, bias=bias, **kw)
            return jnp.sum(out.astype(jnp.float32) * cot), out

        argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
        return jax.value_and_grad(loss, argnums=argnums, has_aux=True)(q, k, v, bias)

    (_, out), grads = run(q, k, v, bias)
    return out, grads


def _close(a, b, dtype):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if dtype == jnp.float32:
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)
    else:  # jax.nn rounds its weights to bfloat16 before mixing the values; attn keeps float32
        np.testing.assert_allclose(a, b, atol=4e-2 * max(1.0, np.abs(b).max()), rtol=0)


def _window_mask(t, s, window):
    left, right = (window, window) if isinstance(window, int) else window
    i, j = np.arange(t)[:, None], np.arange(s)[None, :]
    return jnp.asarray((j >= i - left) & (j <= i + right))


def _jax_nn_ignores_a_lone_window() -> bool:
    """jax.nn before jax 0.8 (Colab's 0.7.2) skips every mask when no mask, causal flag or length
    is given, the window included; attn applies the window whatever else is given."""
    q = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, 1, 4)), jnp.float32)
    lone = jax.nn.dot_product_attention(q, q, q, local_window_size=0)
    return not np.allclose(lone, q, atol=1e-6)  # window 0: each query sees only itself


def _jax_nn_reference(kw):
    """jax.nn with kw but bias, its window given as the equivalent mask where jax.nn would ignore
    it."""
    kw = {a: x for a, x in kw.items() if a != "bias"}
    window = kw.get("local_window_size")
    lone = window is not None and not any(
        kw.get(a) is not None and kw.get(a) is not False
        for a in ("mask", "is_causal", "query_seq_lengths", "key_value_seq_lengths")
    )
    if lone and _jax_nn_ignores_a_lone_window():
        kw = {**kw, "local_window_size": None, "mask": _window_mask(T, S, window)}
    return functools.partial(jax.nn.dot_product_attention, **kw)


def test_the_reference_sees_a_lone_window():
    q, k, v, kw = _case("window_int", jnp.float32)
    full = jax.nn.dot_product_attention(q, k, v)
    assert not np.allclose(_jax_nn_reference(kw)(q, k, v), full, atol=1e-3)


@pytest.mark.parametrize(
    "name, dtype",
    [(n, jnp.float32) for n in CASES] + [(n, jnp.bfloat16) for n in BF16],
)
def test_equals_jax_nn_in_values_and_gradients(name, dtype):
    q, k, v, kw = _case(name, dtype)
    ours = functools.partial(attn.dot_product_attention, fully_masked="mean")
    out, grads = _value_and_grads(ours, q, k, v, dict(kw))
    out_ref, grads_ref = _value_and_grads(_jax_nn_reference(kw), q, k, v, {"bias": kw.get("bias")})
    assert out.shape == out_ref.shape == q.shape and out.dtype == out_ref.dtype
    _close(out, out_ref, dtype)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert g.dtype == g_ref.dtype
        _close(g, g_ref, dtype)


@pytest.mark.parametrize("implementation", ["chunked", "xla"])
def test_other_implementations_equal_jax_nn_with_everything(implementation):
    q, k, v, kw = _case("everything", jnp.float32)
    if implementation == "xla":
        kw.pop("bias")  # attn's xla form takes no bias; the others do
    ours = functools.partial(
        attn.dot_product_attention, fully_masked="mean", implementation=implementation,
        q_chunk=2, k_chunk=3,
    )  # fmt: skip
    out, grads = _value_and_grads(ours, q, k, v, dict(kw))
    out_ref, grads_ref = _value_and_grads(jax.nn.dot_product_attention, q, k, v, dict(kw))
    _close(out, out_ref, jnp.float32)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        _close(g, g_ref, jnp.float32)


def test_a_fully_masked_row_is_zero_here_and_the_mean_of_value_in_jax_nn():
    q, k, v = _qkv(12)
    mask = _bool(12, (B, N, T, S)).at[1, 2, 3].set(False).at[0, 0, :].set(False)
    dead = ~np.asarray(mask).any(-1)  # [B, N, T]
    assert dead.sum() >= 2
    out = attn.dot_product_attention(q, k, v, mask=mask)
    out_nn = jax.nn.dot_product_attention(q, k, v, mask=mask)
    out_mean = attn.dot_product_attention(q, k, v, mask=mask, fully_masked="mean")
    dead_BxLxH = dead.transpose(0, 2, 1)
    np.testing.assert_array_equal(np.asarray(out)[dead_BxLxH], 0.0)
    v_mean_BxXxK = np.asarray(v).mean(axis=1)  # X: key/value heads; every value, masked or not
    b, t, n = np.nonzero(dead_BxLxH)
    np.testing.assert_allclose(np.asarray(out_nn)[b, t, n], v_mean_BxXxK[b, n // (N // K)], 1e-5)
    np.testing.assert_allclose(out_mean, out_nn, atol=2e-5)
    np.testing.assert_allclose(np.asarray(out)[~dead_BxLxH], np.asarray(out_nn)[~dead_BxLxH], 2e-5)


def _per_row_heads(q, k, v, row_fn):
    """out [B, T, N, Hv] from row_fn(b, n, q_LxK, k_MxK, v_MxE), one (row, head) at a time."""
    g = q.shape[2] // k.shape[2]
    rows = [  # a row_fn that compiles gets the same shapes every time: one compile
        [row_fn(b, n, q[b, :, n], k[b, :, n // g], v[b, :, n // g]) for n in range(q.shape[2])]
        for b in range(q.shape[0])
    ]
    return np.stack([np.stack(r, axis=1) for r in rows])


def test_per_row_segment_ids_and_lengths_match_the_loop():
    q, k, v = _qkv(13, s=T)
    seg_BxL = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 2, 2]])
    len_B = np.array([5, 4], np.int32)
    mask = masks.all_of(masks.segments(seg_BxL), masks.lengths(len_B, len_B), masks.causal)
    assert mask.batch_shape == (B,)
    for implementation in ("matrix", "chunked", "xla"):
        out = attn.dot_product_attention(
            q, k, v, mask=mask, implementation=implementation, q_chunk=2, k_chunk=2
        )

        def row(b, n, q, k, v):
            rule = lambda i, j: seg_BxL[b, i] == seg_BxL[b, j] and i < len_B[b] and j <= i
            return reference.attention(q, k, v, rule)[0]

        np.testing.assert_allclose(out, _per_row_heads(q, k, v, row), atol=2e-5)


@pytest.mark.parametrize("implementation", ["matrix", "chunked"])
def test_scores_with_shared_or_per_head_params_are_attention_per_row_and_head(implementation):
    q, k, v = _qkv(14, hv=3)
    sc = scores.get_score("additive")
    shared = sc.init(jax.random.key(0), H, hidden=5)
    per_head = jax.vmap(lambda key: sc.init(key, H))(jax.random.split(jax.random.key(1), N))
    mask = _bool(15, (B, 1, 1, S)).at[:, :, :, 0].set(True)
    kw = dict(score="additive", implementation=implementation, q_chunk=2, k_chunk=3)
    for params, head_axis in ((shared, False), (per_head, True)):
        out = attn.dot_product_attention(q, k, v, mask=mask, score_params=params, **kw)

        one = jax.jit(lambda q, k, v, m, p: attention(q, k, v, m, score_params=p, **kw)[0])

        def row(b, n, q, k, v, params=params, head_axis=head_axis, one=one):
            p = jax.tree.map(lambda x, n=n: x[n], params) if head_axis else params
            return one(q, k, v, mask[b, 0, 0], p)

        np.testing.assert_allclose(out, _per_row_heads(q, k, v, row), atol=1e-6)
        assert out.shape == (B, T, N, 3)


def test_position_aware_score_and_weights():
    def alibi(params, q, k, *, q_pos, k_pos):
        return scores.scaled_dot(None, q, k) - 0.5 * jnp.abs(q_pos[:, None] - k_pos[None, :])

    q, k, v = _qkv(16)
    out, w = attn.dot_product_attention(q, k, v, score=alibi, is_causal=True, return_weights=True)
    assert w.shape == (B, N, T, S)

    def row(b, n, q, k, v):
        return reference.attention(
            q, k, v, lambda i, j: j <= i,
            score=lambda q, k, i, j: q @ k / np.sqrt(H) - 0.5 * abs(i - j),
        )  # fmt: skip

    np.testing.assert_allclose(out, _per_row_heads(q, k, v, lambda *a: row(*a)[0]), atol=2e-5)
    w_ref = _per_row_heads(q, k, v, lambda *a: row(*a)[1])  # [B, T, N, S]
    np.testing.assert_allclose(w, w_ref.transpose(0, 2, 1, 3), atol=1e-6)


@pytest.mark.parametrize("implementation", ["matrix", "chunked", "xla"])
def test_the_batched_form_compiles_to_attention_under_vmap(implementation):
    """The batched entry point costs nothing: XLA gets the very program of vmapped attention."""
    spec = jax.ShapeDtypeStruct((2, 16, 2, 8), jnp.float32)

    def vmapped(q, k, v):
        one = lambda q, k, v: attention(q, k, v, implementation=implementation)[0]
        return jax.vmap(jax.vmap(one, in_axes=1, out_axes=1))(q, k, v)

    def batched(q, k, v):
        return attn.dot_product_attention(q, k, v, implementation=implementation)

    def compiled(fn):
        grad = jax.grad(lambda q, k, v: fn(q, k, v).sum(), argnums=(0, 1, 2))
        return hlo_program(jax.jit(grad).lower(spec, spec, spec).compile().as_text())

    assert compiled(batched) == compiled(vmapped)


def test_broadcast_dropout_draws_flax_s_mask():
    q, k, v = _qkv(17, k=N)
    rng = jax.random.key(5)
    out = attn.dot_product_attention(q, k, v, dropout_rate=0.3, dropout_rng=rng)
    out_flax = nn.dot_product_attention(
        q, k, v, dropout_rng=rng, dropout_rate=0.3, broadcast_dropout=True, deterministic=False
    )
    np.testing.assert_allclose(out, out_flax, atol=2e-6)
    assert not np.allclose(out, attn.dot_product_attention(q, k, v), atol=1e-2)
    # Without broadcasting, each (row, head) draws its own mask: heads with the same q, k, v
    # (one key/value head, the same query for all) then differ.
    same_q = jnp.broadcast_to(q[:, :, :1], q.shape)
    per_row = attn.dot_product_attention(
        same_q, k[:, :, :1], v[:, :, :1], dropout_rate=0.5, dropout_rng=rng, broadcast_dropout=False
    )
    heads = [np.asarray(per_row)[0, :, n] for n in range(N)]
    assert not any(np.allclose(heads[0], h) for h in heads[1:])
    shared = attn.dot_product_attention(
        same_q, k[:, :, :1], v[:, :, :1], dropout_rate=0.5, dropout_rng=rng
    )
    # Equal up to rounding: on jax 0.7.2 identical heads come out up to 1.2e-7 apart, where
    # masks that differ move the output by O(1).
    np.testing.assert_allclose(
        shared[:, :, 1:], jnp.broadcast_to(shared[:, :, :1], (B, T, 3, H)), rtol=1e-6, atol=1e-6
    )


def test_jit_takes_mask_functions_and_scores_as_arguments():
    q, k, v = _qkv(18, s=T)
    seg = masks.segments(jnp.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]))
    jitted = jax.jit(attn.dot_product_attention)
    out = jitted(q, k, v, mask=seg, score=scores.get_score("dot"))
    np.testing.assert_allclose(out, attn.dot_product_attention(q, k, v, mask=seg, score="dot"))
    # Static choices through functools.partial, as with jax.nn.
    chunked = jax.jit(
        functools.partial(attn.dot_product_attention, is_causal=True, implementation="chunked")
    )
    np.testing.assert_allclose(
        chunked(q, k, v), jax.nn.dot_product_attention(q, k, v, is_causal=True), atol=2e-5
    )


def test_a_traced_is_causal_is_one_error_naming_how_to_make_it_static():
    q, k, v = _qkv(20, s=T)
    with pytest.raises(TypeError) as e:
        jax.jit(attn.dot_product_attention)(q, k, v, is_causal=True)
    message = str(e.value)
    assert "\n" not in message
    assert "functools.partial(attn.dot_product_attention, is_causal=True)" in message
    assert "static_argnames='is_causal'" in message
    # The static form it names works.
    static = jax.jit(attn.dot_product_attention, static_argnames="is_causal")
    np.testing.assert_allclose(
        static(q, k, v, is_causal=True),
        jax.nn.dot_product_attention(q, k, v, is_causal=True),
        atol=2e-5,
    )


_q, _k, _v = _qkv(19)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(mask=jnp.ones((B, S), bool)), ValueError, ["mask", "(2, 7)", "(2, 4, 5, 7)"]),
        (dict(mask=jnp.ones((T, S), jnp.int32)), TypeError, ["mask", "int32"]),
        (dict(bias=jnp.ones((3, 1, T, S))), ValueError, ["bias", "(3, 1, 5, 7)"]),
        (dict(value=_v.astype(jnp.int32)), TypeError, ["value", "int32"]),
        # A bfloat16 query with float32 key and value was silently computed in float32.
        (
            dict(query=_q.astype(jnp.bfloat16)),
            TypeError,
            ["one dtype", "query bfloat16, key float32, value float32"],
        ),
        (dict(value=_v.astype(jnp.float16)), TypeError, ["one dtype", "value float16"]),
        (dict(key=_k[:, :6]), ValueError, ["(2, 6, 2, 8)", "must share"]),
        (dict(query=_q[:, :, :3]), ValueError, ["N=3", "K=2"]),
        (dict(implementation="cudnn"), ValueError, ["'cudnn'", "NVIDIA GPU", "'cpu'", "'xla'"]),
        (dict(implementation="flash"), ValueError, ["implementation", "'flash'"]),
        (dict(score="additive", scale=0.5), ValueError, ["scale", "'additive'"]),
        (dict(bias=jnp.ones((T, S)), implementation="xla"), ValueError, ["bias", "'xla'"]),
        (dict(bias=jnp.ones((T, S)), implementation="splash"), ValueError, ["bias", "'splash'"]),
        (dict(query_seq_lengths=jnp.array([3, 4, 5])), ValueError, ["query_seq_lengths", "(3,)"]),
        (
            dict(mask=masks.segments(jnp.zeros((3, S), jnp.int32))),
            ValueError,
            ["segments", "(3,)", "B", "(2,)"],
        ),
        (
            dict(mask=masks.all_of(masks.causal, jnp.ones((S - 2,), bool))),
            ValueError,
            ["all_of part 1", "(5,)", "(5, 7)"],
        ),
        (
            dict(score="additive", score_params={"w_DxD": jnp.eye(H)}),
            ValueError,
            ["score_params", "'additive'"],
        ),
        (
            dict(score="general", score_params={"w_DxD": jnp.ones((3, H, H))}),
            ValueError,
            ["score_params['w_DxD']", "N=4"],
        ),
    ],
)
def test_bad_arguments_raise_one_line_errors(kwargs, exc, words):
    args = dict(query=_q, key=_k, value=_v)
    args.update(kwargs)
    with pytest.raises(exc) as info:
        attn.dot_product_attention(**args)
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w in message, (w, message)


def test_docs_use_it_in_your_jax_code_runs():
    page = pathlib.Path(__file__).parent.parent / "docs" / "library.md"
    text = page.read_text(encoding="utf-8")
    section = text[text.index("## Use it in your JAX code") :]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/library.md", "exec"), scope)
    np.testing.assert_allclose(scope["out"], scope["out_nn"], atol=2e-5)
    for name in ("out_additive", "out_packed", "out_chunked"):
        assert scope[name].shape == scope["q"].shape, name
    np.testing.assert_allclose(scope["out_chunked"], scope["out_packed"], atol=2e-5)
