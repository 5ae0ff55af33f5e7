"""Multi-head self-attention vs Flax and vs a per-head numpy loop; its step-by-step values."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import enable_x64
from jax.test_util import check_grads

from attn import masks, multihead, positions, reference, scores
from attn.attention import attention

D, H, L = 12, 3, 7


def _x_and_mask(seed=0):
    x_LxD = jax.random.normal(jax.random.key(seed), (L, D))
    mask_L = jnp.arange(L) < 5  # last two positions are padding
    return x_LxD, mask_L


def _to_flax(params):
    """Our [D, D] projections -> Flax DenseGeneral kernels [D, H, Dh] / [H, Dh, D]."""
    dh = D // H

    def proj(p):
        return {"kernel": p["w"].reshape(D, H, dh), "bias": p["b"].reshape(H, dh)}

    return {
        "query": proj(params["q"]),
        "key": proj(params["k"]),
        "value": proj(params["v"]),
        "out": {"kernel": params["o"]["w"].reshape(H, dh, D), "bias": params["o"]["b"]},
    }


def test_matches_flax_multihead_dot_product_attention():
    params = multihead.init(jax.random.key(1), D, H)
    # Random biases so the bias layout is checked too (init makes them zero).
    params = jax.tree.map(
        lambda a: jax.random.normal(jax.random.key(a.size), a.shape) if a.ndim == 1 else a, params
    )
    x_LxD, mask_L = _x_and_mask()
    y_LxD, w_HxLxL = multihead.apply(params, x_LxD, mask_L, num_heads=H)

    flax_mha = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=D, out_features=D)
    mask_1x1xLxL = jnp.broadcast_to(mask_L, (L, L))[None, None]
    y_flax = flax_mha.apply(
        {"params": _to_flax(params)}, x_LxD[None], x_LxD[None], mask=mask_1x1xLxL
    )[0]
    np.testing.assert_allclose(y_LxD, y_flax, atol=1e-5, rtol=1e-5)
    assert w_HxLxL.shape == (H, L, L)
    np.testing.assert_array_equal(w_HxLxL[:, :, ~np.asarray(mask_L)], 0.0)


def _per_head_reference(params, x_LxD, mask, score="scaled_dot"):
    """(y [L, D], weights [H, L, L]) from the numpy loop, one head at a time."""
    x = np.asarray(x_LxD, np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    dh = D // H
    outs, ws = [], []
    for h in range(H):
        cols = slice(h * dh, (h + 1) * dh)
        q, k, v = ((x @ p[n]["w"] + p[n]["b"])[:, cols] for n in "qkv")
        sp = None if "score" not in p else {n: a[h] for n, a in p["score"].items()}
        out, w = reference.attention(q, k, v, mask, score=score, score_params=sp)
        outs.append(out)
        ws.append(w)
    return np.concatenate(outs, axis=1) @ p["o"]["w"] + p["o"]["b"], np.stack(ws)


@pytest.mark.parametrize("score", ["scaled_dot", "general", "additive"])
def test_matches_per_head_reference_loop(score):
    params = multihead.init(jax.random.key(2), D, H, score=score)
    x_LxD, mask_L = _x_and_mask(3)
    attend = functools.partial(attention, score=score)
    y_LxD, w_HxLxL = multihead.apply(params, x_LxD, mask_L, num_heads=H, attend=attend)
    y_ref, w_ref = _per_head_reference(params, x_LxD, np.asarray(mask_L), score)
    np.testing.assert_allclose(w_HxLxL, w_ref, atol=1e-5)
    np.testing.assert_allclose(y_LxD, y_ref, atol=1e-5)


def test_chunked_matches_matrix_and_returns_no_weights():
    params = multihead.init(jax.random.key(4), D, H)
    x_LxD, mask_L = _x_and_mask(5)
    y_m, _ = multihead.apply(params, x_LxD, mask_L, num_heads=H)
    attend = functools.partial(attention, implementation="chunked", q_chunk=3, k_chunk=2)
    y_c, w_c = multihead.apply(params, x_LxD, mask_L, num_heads=H, attend=attend)
    np.testing.assert_allclose(y_m, y_c, atol=1e-5)
    assert w_c is None


def test_indivisible_heads_raise_naming_both():
    with pytest.raises(ValueError, match=r"d_model=10.*num_heads=3"):
        multihead.init(jax.random.key(0), 10, 3)
    params = multihead.init(jax.random.key(0), 12, 3)
    with pytest.raises(ValueError, match=r"d_model=12.*num_heads=5"):
        multihead.apply(params, jnp.zeros((4, 12)), None, num_heads=5)


def test_check_grads_through_heads_and_score_params():
    with enable_x64():
        params = multihead.init(jax.random.key(6), D, H, score="general", dtype=jnp.float64)
        x_LxD = jax.random.normal(jax.random.key(7), (L, D), jnp.float64)
        mask_L = jnp.arange(L) < 5

        def f(p, x):
            attend = functools.partial(attention, score="general")
            return multihead.apply(p, x, mask_L, num_heads=H, attend=attend)[0]

        check_grads(jax.jit(f), (params, x_LxD), order=1, modes=("rev",))


@pytest.mark.parametrize("form", ["array", "function"])
def test_query_key_masks_as_array_or_function_match_the_loop(form):
    # apply takes every mask attention takes: [L, L] arrays and functions of positions too.
    params = multihead.init(jax.random.key(8), D, H)
    x_LxD, mask_L = _x_and_mask(9)
    mask_fn = masks.all_of(masks.causal, mask_L)
    mask = masks.matrix(mask_fn, L, L) if form == "array" else mask_fn
    assert form == "function" or mask.shape == (L, L)
    y_LxD, w_HxLxL = multihead.apply(params, x_LxD, mask, num_heads=H)
    y_ref, w_ref = _per_head_reference(params, x_LxD, lambda i, j: j <= i and bool(mask_L[j]))
    np.testing.assert_allclose(y_LxD, y_ref, atol=1e-5)
    np.testing.assert_allclose(w_HxLxL, w_ref, atol=1e-6)


def test_params_that_do_not_fit_raise_naming_the_entry():
    params = multihead.init(jax.random.key(0), D, H, score="additive")
    x_LxD, mask_L = _x_and_mask()
    attend = functools.partial(attention, score="additive")
    # score params built for 3 heads, applied with 4
    p4 = multihead.init(jax.random.key(0), D, 4)
    p4["score"] = params["score"]
    with pytest.raises(ValueError, match=r"params\['score'\]\['b_H'\].*num_heads=4"):
        multihead.apply(p4, x_LxD, mask_L, num_heads=4, attend=attend)
    with pytest.raises(ValueError, match=r"params\['q'\]\['w'\] has shape \(12, 12\).*d_model=6"):
        multihead.apply(params, x_LxD[:, :6], mask_L, num_heads=H, attend=attend)
    # params of a parameterized score under a parameter-free attend, and the reverse
    with pytest.raises(ValueError, match="'scaled_dot' takes no parameters"):
        multihead.apply(params, x_LxD, mask_L, num_heads=H)
    plain = multihead.init(jax.random.key(0), D, H)
    with pytest.raises(ValueError, match="'additive' has parameters"):
        multihead.apply(plain, x_LxD, mask_L, num_heads=H, attend=attend)


@pytest.mark.parametrize("score", ["scaled_dot", "dot", "general", "additive", "mlp"])
def test_steps_recombine_to_their_weights_and_equal_apply(score):
    params = multihead.init(jax.random.key(10), D, H, score=score)
    x_LxD, mask_L = _x_and_mask(11)
    st = jax.jit(functools.partial(multihead.steps, num_heads=H, score=score))(
        params, x_LxD, mask_L
    )
    dh = D // H
    np.testing.assert_array_equal(st.x_LxD, x_LxD)
    for name, t in (("q", st.q_HxLxK), ("k", st.k_HxLxK), ("v", st.v_HxLxK)):
        proj = x_LxD @ params[name]["w"] + params[name]["b"]
        np.testing.assert_allclose(t, proj.reshape(L, H, dh).swapaxes(0, 1), atol=1e-5)
    q, k, v = (np.asarray(t, np.float64) for t in (st.q_HxLxK, st.k_HxLxK, st.v_HxLxK))
    if score in ("scaled_dot", "dot"):
        np.testing.assert_allclose(st.raw_HxLxL, q @ k.swapaxes(1, 2), atol=1e-5)
        scale = 1 / np.sqrt(dh) if score == "scaled_dot" else 1.0
        np.testing.assert_allclose(st.scaled_HxLxL, scale * q @ k.swapaxes(1, 2), atol=1e-5)
    else:  # no scaling: raw is the score function's matrix
        np.testing.assert_array_equal(st.raw_HxLxL, st.scaled_HxLxL)
    # softmax of the scaled scores over real keys gives the weights; weights V the outputs
    s = np.where(np.asarray(mask_L), np.asarray(st.scaled_HxLxL, np.float64), -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(st.weights_HxLxL, w, atol=1e-6)
    assert np.all(np.asarray(st.weights_HxLxL)[:, :, ~np.asarray(mask_L)] == 0.0)
    np.testing.assert_allclose(st.out_HxLxK, w @ v, atol=1e-5)
    # ... and equal what attention and apply compute
    sp = params.get("score")
    for h in range(H):
        sp_h = None if sp is None else jax.tree.map(lambda a, h=h: a[h], sp)
        out, w_h = attention(
            st.q_HxLxK[h], st.k_HxLxK[h], st.v_HxLxK[h], mask_L, score=score, score_params=sp_h
        )
        np.testing.assert_allclose(st.out_HxLxK[h], out, atol=1e-6)
        np.testing.assert_allclose(st.weights_HxLxL[h], w_h, atol=1e-6)
    attend = functools.partial(attention, score=score)
    y, w_apply = multihead.apply(params, x_LxD, mask_L, num_heads=H, attend=attend)
    np.testing.assert_allclose(st.y_LxD, y, atol=1e-6)
    np.testing.assert_allclose(st.weights_HxLxL, w_apply, atol=1e-6)
    y_ref, w_ref = _per_head_reference(params, x_LxD, np.asarray(mask_L), score)
    np.testing.assert_allclose(st.y_LxD, y_ref, atol=1e-5)
    np.testing.assert_allclose(st.weights_HxLxL, w_ref, atol=1e-5)


def _halved_dot(params, q_LxD, k_MxD):
    return scores.dot(params, q_LxD, k_MxD) / 2.0


def test_steps_draw_a_scores_unscaled_form_as_the_raw_scores():
    """A score that says it is another divided by a constant: raw is that other score's matrix,
    scaled (what the softmax sees) the score's own, and the steps carry the score."""
    dot = scores.get_score("dot")
    halved = scores.Score("halved", _halved_dot, dot.init, False, unscaled=dot, divisor="2")
    params = multihead.init(jax.random.key(10), D, H, score=halved)
    x_LxD, mask_L = _x_and_mask(11)
    st = multihead.steps(params, x_LxD, mask_L, num_heads=H, score=halved)
    q, k = (np.asarray(t, np.float64) for t in (st.q_HxLxK, st.k_HxLxK))
    np.testing.assert_allclose(st.raw_HxLxL, q @ k.swapaxes(1, 2), atol=1e-5)
    np.testing.assert_allclose(st.scaled_HxLxL, q @ k.swapaxes(1, 2) / 2, atol=1e-5)
    assert st.score is halved
    attend = functools.partial(attention, score=halved)
    _, w = multihead.apply(params, x_LxD, mask_L, num_heads=H, attend=attend)
    np.testing.assert_allclose(st.weights_HxLxL, w, atol=1e-6)


def test_a_batched_x_and_params_for_another_d_raise_naming_the_fault():
    params = multihead.init(jax.random.key(12), D, H, score="general")
    attend = functools.partial(attention, score="general")
    with pytest.raises(ValueError, match=r"x must be \[L, features\], one sequence.*\(2, 7, 12\)"):
        multihead.apply(params, jnp.zeros((2, L, D)), None, num_heads=H, attend=attend)
    # score params of the right head count but built for another head dim (D=24 -> Dh=8)
    params["score"] = multihead.init(jax.random.key(12), 24, H, score="general")["score"]
    with pytest.raises(ValueError) as info:
        multihead.apply(params, jnp.zeros((L, D)), None, num_heads=H, attend=attend)
    assert "\n" not in str(info.value)
    for w in ("d=4", "['w_DxD']", "(8, 8)", "(4, 4)"):
        assert w in str(info.value)


def test_cross_attention_matches_the_per_head_loop():
    d_kv, m = 5, 9
    params = multihead.init(jax.random.key(13), D, H, d_kv=d_kv)
    assert params["k"]["w"].shape == params["v"]["w"].shape == (d_kv, D)
    x_LxD = jax.random.normal(jax.random.key(14), (L, D))
    kv_MxW = jax.random.normal(jax.random.key(15), (m, d_kv))
    mask_M = jnp.arange(m) < 7
    y, w = multihead.apply(params, x_LxD, mask_M, num_heads=H, kv_MxW=kv_MxW)
    assert w.shape == (H, L, m)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x, kv, dh = np.asarray(x_LxD, np.float64), np.asarray(kv_MxW, np.float64), D // H
    outs = []
    for h in range(H):
        cols = slice(h * dh, (h + 1) * dh)
        q = (x @ p["q"]["w"] + p["q"]["b"])[:, cols]
        k, v = ((kv @ p[n]["w"] + p[n]["b"])[:, cols] for n in "kv")
        outs.append(reference.attention(q, k, v, np.asarray(mask_M))[0])
    y_ref = np.concatenate(outs, axis=1) @ p["o"]["w"] + p["o"]["b"]
    np.testing.assert_allclose(y, y_ref, atol=1e-5)
    with pytest.raises(ValueError, match=r"params\['k'\]\['w'\] has shape \(5, 12\).*4 features"):
        multihead.apply(params, x_LxD, mask_M, num_heads=H, kv_MxW=kv_MxW[:, :4])


def test_attention_dropout_draws_a_mask_per_head_and_needs_a_key():
    # Two identical heads (same q, k, v columns, identity output): equal halves without dropout.
    keys = jax.random.split(jax.random.key(0), 3)
    p = {
        name: {"w": jnp.tile(jax.random.normal(k, (4, 2)), (1, 2)), "b": jnp.zeros(4)}
        for name, k in zip("qkv", keys, strict=True)
    }
    p["o"] = {"w": jnp.eye(4), "b": jnp.zeros(4)}
    x = jax.random.normal(jax.random.key(1), (6, 4))
    y0, _ = multihead.apply(p, x, num_heads=2)
    np.testing.assert_allclose(y0[:, :2], y0[:, 2:], atol=1e-6)
    y1, _ = multihead.apply(p, x, num_heads=2, dropout_rate=0.5, dropout_rng=jax.random.key(2))
    assert float(jnp.abs(y1[:, :2] - y1[:, 2:]).max()) > 0.01  # each head its own mask
    with pytest.raises(ValueError, match="needs a dropout_rng"):
        multihead.apply(p, x, num_heads=2, dropout_rate=0.5)


def _rotated(x_LxK, theta):
    """Rotary positions 0..L-1, in float64 numpy: channel c and c + K/2 as one complex number."""
    x = np.asarray(x_LxK, np.float64)
    half = x.shape[-1] // 2
    z = x[:, :half] + 1j * x[:, half:]
    angle = np.arange(len(x))[:, None] * theta ** (-np.arange(half) * 2.0 / x.shape[-1])
    z = z * np.exp(1j * angle)
    return np.concatenate([z.real, z.imag], axis=-1)


ROTARY = functools.partial(positions.rotary, theta=100.0)


def test_a_qk_transform_rotates_q_and_k_before_the_score_as_the_loop_does():
    """Rotary positions through apply equal the per-head loop with a pair score of rotated
    vectors (rot(q_i, i) . rot(k_j, j) / sqrt(Dh)), under key padding."""
    params = multihead.init(jax.random.key(20), D, H)
    x_LxD, mask_L = _x_and_mask(21)
    y, w = multihead.apply(params, x_LxD, mask_L, num_heads=H, qk_transform=ROTARY)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x, dh = np.asarray(x_LxD, np.float64), D // H
    outs, ws = [], []
    for h in range(H):
        cols = slice(h * dh, (h + 1) * dh)
        q, k, v = ((x @ p[n]["w"] + p[n]["b"])[:, cols] for n in "qkv")
        rq, rk = _rotated(q, 100.0), _rotated(k, 100.0)

        def pair(q_i, k_j, i, j, rq=rq, rk=rk):
            return float(rq[i] @ rk[j]) / np.sqrt(dh)

        out, w_h = reference.attention(q, k, v, np.asarray(mask_L), score=pair)
        outs.append(out)
        ws.append(w_h)
    np.testing.assert_allclose(w, np.stack(ws), atol=1e-5)
    np.testing.assert_allclose(
        y, np.concatenate(outs, axis=1) @ p["o"]["w"] + p["o"]["b"], atol=1e-5
    )
    y_plain, _ = multihead.apply(params, x_LxD, mask_L, num_heads=H)
    assert float(jnp.abs(y - y_plain).max()) > 1e-3  # the transform is not a no-op here


@pytest.mark.parametrize("implementation", ["chunked", "xla"])
def test_a_qk_transform_runs_in_every_implementation_under_a_window(implementation):
    """The transform acts on q and k before attend, so chunked (a sliding window and key padding
    evaluated block by block) and xla give the matrix form's outputs."""
    params = multihead.init(jax.random.key(22), D, H)
    x_LxD, mask_L = _x_and_mask(23)
    mask = masks.all_of(masks.sliding_window(2, 2), mask_L)
    y_m, _ = multihead.apply(params, x_LxD, mask, num_heads=H, qk_transform=ROTARY)
    attend = functools.partial(attention, implementation=implementation, q_chunk=3, k_chunk=2)
    y, w = multihead.apply(params, x_LxD, mask, num_heads=H, attend=attend, qk_transform=ROTARY)
    np.testing.assert_allclose(y, y_m, atol=1e-5)
    assert w is None


def test_steps_show_the_transformed_q_and_k_the_scores_come_from():
    params = multihead.init(jax.random.key(24), D, H)
    x_LxD, mask_L = _x_and_mask(25)
    st = multihead.steps(params, x_LxD, mask_L, num_heads=H, qk_transform=ROTARY)
    dh = D // H
    for name, t in (("q", st.q_HxLxK), ("k", st.k_HxLxK)):
        proj = np.asarray(x_LxD @ params[name]["w"] + params[name]["b"], np.float64)
        want = np.stack([_rotated(proj[:, h * dh : (h + 1) * dh], 100.0) for h in range(H)])
        np.testing.assert_allclose(t, want, atol=1e-5)
    q, k = np.asarray(st.q_HxLxK, np.float64), np.asarray(st.k_HxLxK, np.float64)
    np.testing.assert_allclose(st.raw_HxLxL, q @ k.swapaxes(1, 2), atol=1e-5)
    y, w = multihead.apply(params, x_LxD, mask_L, num_heads=H, qk_transform=ROTARY)
    np.testing.assert_allclose(st.y_LxD, y, atol=1e-6)
    np.testing.assert_allclose(st.weights_HxLxL, w, atol=1e-6)


def test_a_qk_transform_that_changes_shape_or_dtype_is_refused_in_one_line():
    params = multihead.init(jax.random.key(26), D, H)
    x_LxD, mask_L = _x_and_mask(27)
    for bad, words in (
        (lambda x, pos: x[..., :2], "must return q as it was given, float32[3, 7, 4]"),
        (lambda x, pos: x.astype(jnp.bfloat16), "got bfloat16[3, 7, 4]"),
    ):
        with pytest.raises(ValueError) as e:
            multihead.apply(params, x_LxD, mask_L, num_heads=H, qk_transform=bad)
        assert words in str(e.value) and "\n" not in str(e.value)
