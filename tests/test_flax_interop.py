"""The Flax linen and nnx modules: the pure param tree and function, Flax's own MultiHeadAttention
(same weights: same outputs, masks, dropout and training), and one trace per config."""

import functools
import importlib
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_close32
from flax import nnx

from attn import flax_interop, masks, multihead
from attn.attention import attention

B, L, S, D, C, H = 2, 5, 6, 8, 6, 2
X = jax.random.normal(jax.random.key(0), (B, L, D))
CTX = jax.random.normal(jax.random.key(1), (B, S, C))
PAD = jnp.array([[True] * 5, [True, True, True, False, False]])  # key padding [B, L]
PAD_MASK = PAD[:, None, None, :]  # as Flax takes it: [B, 1, 1, L]
# The sums a value passes through (`conftest.tol32`): the weights, a projection over the inputs'
# features, a score over a head's (mlp's: 4 of them) and a softmax over the keys; the output, a
# weighted sum over the keys and the output projection besides.
W_TERMS = max(D, C) + 4 * (D // H) + max(L, S)
TERMS = W_TERMS + max(L, S) + D


def _pure(params, x, mask, score="scaled_dot", kv=None):
    """multihead.apply per row: the pure function the modules must equal."""
    attend = functools.partial(attention, score=score)

    def one(x, m, kv):
        return multihead.apply(params, x, m, num_heads=H, attend=attend, kv_MxW=kv)

    kv_axis = None if kv is None else 0
    return jax.vmap(one, in_axes=(0, 0, kv_axis))(x, mask, kv)


def _to_flax(params, d_kv=D):
    """Our [C, D] projections -> Flax's kernels [C, H, Dh] / [H, Dh, D]."""
    dh = D // H

    def proj(p, d_in):
        return {"kernel": p["w"].reshape(d_in, H, dh), "bias": p["b"].reshape(H, dh)}

    return {
        "query": proj(params["q"], D),
        "key": proj(params["k"], d_kv),
        "value": proj(params["v"], d_kv),
        "out": {"kernel": params["o"]["w"].reshape(H, dh, D), "bias": params["o"]["b"]},
    }


def _nnx_twin(ours: flax_interop.NnxMultiHeadAttention, d_kv=D, **kw) -> nnx.MultiHeadAttention:
    """Flax's nnx.MultiHeadAttention holding our module's weights (dropout stream seed 1)."""
    flax_mha = nnx.MultiHeadAttention(
        H, D, in_kv_features=d_kv, decode=False, rngs=nnx.Rngs(0, dropout=1), **kw
    )
    for name, layer in _to_flax(ours.pure_params(), d_kv).items():
        for p, value in layer.items():
            getattr(getattr(flax_mha, name), p)[...] = value
    return flax_mha


@pytest.mark.parametrize("score", ["scaled_dot", "general"])
def test_linen_module_holds_the_pure_tree_and_computes_the_pure_function(score):
    module = flax_interop.SelfAttention(num_heads=H, score=score)
    variables = module.init(jax.random.key(1), X, PAD_MASK)
    params = variables["params"]
    expected = jax.tree.map(jnp.shape, multihead.init(jax.random.key(0), D, H, score=score))
    assert jax.tree.map(jnp.shape, dict(params)) == expected
    y, w = module.apply(variables, X, PAD_MASK, return_weights=True)
    y_ref, w_ref = _pure(params, X, PAD, score)
    assert_close32(y, y_ref, TERMS)
    assert_close32(w, w_ref, W_TERMS)
    pure = multihead.init(jax.random.key(2), D, H, score=score)  # pure params drop straight in
    assert_close32(
        module.apply({"params": pure}, X, PAD_MASK), _pure(pure, X, PAD, score)[0], TERMS
    )


@pytest.mark.parametrize("module_type", ["linen", "nnx"])
def test_cross_attention_equals_the_pure_function_and_flax(module_type):
    if module_type == "linen":
        module = flax_interop.MultiHeadAttention(num_heads=H)
        variables = module.init(jax.random.key(3), X, CTX)
        params = variables["params"]
        y = module.apply(variables, X, CTX, mask=PAD_MASK[:, :, :, :1] | True)
        y_kv = module.apply(variables, X, inputs_kv=CTX)
        np.testing.assert_array_equal(y, y_kv)
        flax_module = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=D, out_features=D)
        y_flax = flax_module.apply({"params": _to_flax(params, C)}, X, CTX)
    else:
        module = flax_interop.NnxMultiHeadAttention(H, D, in_kv_features=C, rngs=nnx.Rngs(3))
        params = module.pure_params()
        y = module(X, CTX)
        y_flax = _nnx_twin(module, C)(X, CTX)
    assert jax.tree.map(jnp.shape, dict(params))["k"] == {"b": (D,), "w": (C, D)}
    assert_close32(y, _pure(params, X, jnp.ones((B, S), bool), kv=CTX)[0], TERMS)
    assert_close32(y, y_flax, TERMS)


MASKS = {
    "shared [L, L]": jnp.tril(jnp.ones((L, L), bool)),
    "per-head [B, H, L, L]": jax.random.bernoulli(jax.random.key(4), 0.7, (B, H, L, L))
    .at[..., 0]
    .set(True),
    "key padding [B, 1, 1, L]": PAD_MASK,
    "per-row [B, 1, L, L]": jnp.tril(jnp.ones((B, 1, L, L), bool)) & PAD_MASK,
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_masks_broadcast_as_in_flax(name):
    module = flax_interop.NnxSelfAttention(D, H, rngs=nnx.Rngs(5))
    y, w = module(X, MASKS[name], return_weights=True)
    mask_BxHxLxL = jnp.broadcast_to(MASKS[name], (B, H, L, L))
    np.testing.assert_array_equal(np.asarray(w)[~np.asarray(mask_BxHxLxL)], 0.0)
    assert_close32(y, _nnx_twin(module)(X, mask=MASKS[name]), TERMS)


@pytest.mark.parametrize("module_type", ["linen", "nnx"])
def test_per_row_mask_functions(module_type):
    seg_BxL = jnp.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 2]])
    len_B = jnp.array([5, 3], jnp.int32)
    fn = masks.all_of(masks.segments(seg_BxL), masks.lengths(len_B, len_B))
    # The same rule as a [B, 1, L, L] array.
    same = seg_BxL[:, :, None] == seg_BxL[:, None, :]
    real = jnp.arange(L)[None, :] < len_B[:, None]
    array = (same & real[:, :, None] & real[:, None, :])[:, None]
    if module_type == "linen":
        module = flax_interop.SelfAttention(num_heads=H)
        variables = module.init(jax.random.key(6), X)
        call = functools.partial(module.apply, variables, X)
    else:
        call = functools.partial(flax_interop.NnxSelfAttention(D, H, rngs=nnx.Rngs(6)), X)
    assert_close32(call(fn), call(array), TERMS)
    assert_close32(call(masks.causal), call(jnp.tril(jnp.ones((L, L), bool))), TERMS)
    # Several batch axes: [2, B, L, D] with per-row ids [2, B, L].
    x4 = jnp.stack([X, X[::-1]])
    seg4 = jnp.stack([seg_BxL, seg_BxL[::-1]])
    if module_type == "linen":
        y4 = module.apply(variables, x4, masks.segments(seg4))
    else:
        y4 = call.func(x4, masks.segments(seg4))
    assert_close32(y4[1, 0], call(masks.segments(seg_BxL))[1], TERMS)


def test_dropout_is_flax_s_and_off_when_deterministic():
    ours = flax_interop.NnxSelfAttention(
        D, H, dropout_rate=0.4, deterministic=False, rngs=nnx.Rngs(7, dropout=1)
    )
    twin = _nnx_twin(ours, dropout_rate=0.4, deterministic=False)
    for _ in range(2):  # both draw from their dropout streams, step by step alike
        y = ours(X, PAD_MASK)
        assert_close32(y, twin(X, mask=PAD_MASK), TERMS)
    plain = flax_interop.NnxSelfAttention(D, H, rngs=nnx.Rngs(7))
    y_plain = plain(X, PAD_MASK)
    assert not np.allclose(y, y_plain, atol=1e-3)
    assert_close32(ours(X, PAD_MASK, deterministic=True), y_plain, TERMS)
    module = flax_interop.SelfAttention(num_heads=H, dropout_rate=0.4)
    variables = module.init(jax.random.key(7), X, deterministic=True)
    with pytest.raises(ValueError, match="pass deterministic=True or False"):
        module.apply(variables, X)
    rngs = {"dropout": jax.random.key(8)}
    y1 = module.apply(variables, X, deterministic=False, rngs=rngs)
    twin = nn.MultiHeadDotProductAttention(num_heads=H, dropout_rate=0.4, deterministic=False)
    assert_close32(y1, twin.apply({"params": _to_flax(variables["params"])}, X, rngs=rngs), TERMS)


class _Regressor(nnx.Module):
    """Cross-attention, mean over queries, a linear head: the twin-training model."""

    def __init__(self, attention_module):
        self.attention = attention_module
        self.head = nnx.Linear(D, 1, rngs=nnx.Rngs(9))

    def __call__(self, x, ctx, mask):
        return self.head(self.attention(x, ctx, mask=mask).mean(axis=1))[:, 0]


def test_training_our_module_and_flax_s_from_the_same_weights_gives_the_same_losses():
    kw = dict(dropout_rate=0.2, deterministic=False)
    ours = flax_interop.NnxMultiHeadAttention(
        H, D, in_kv_features=C, rngs=nnx.Rngs(10, dropout=1), **kw
    )
    models = [_Regressor(ours), _Regressor(_nnx_twin(ours, C, **kw))]
    mask = jnp.ones((B, 1, L, S), bool).at[1, :, :, 4:].set(False)
    target = jnp.array([1.0, -1.0])
    losses = []
    for model in models:
        optimizer = nnx.Optimizer(model, optax.adam(0.01), wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer):
            def loss_fn(model):
                return jnp.mean((model(X, CTX, mask) - target) ** 2)

            loss, grads = nnx.value_and_grad(loss_fn)(model)
            optimizer.update(model, grads)
            return loss

        losses.append([float(step(model, optimizer)) for _ in range(10)])
    # A margin, not a float32 bound: the two models round their forward and backward passes
    # apart, and Adam divides each gradient by its own size, so a step can carry a small
    # gradient's rounding up to the learning rate into a weight. Ten steps here stay within
    # 1.5e-6 relative (3.3e-7 absolute) on this CPU.
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    assert np.mean(losses[0][-5:]) < 0.5 * losses[0][0]  # it learns (through dropout's noise)


def test_two_instances_of_one_config_trace_once():
    traces = []

    @nnx.jit
    def forward(module, x):
        traces.append(1)
        return module(x, masks.causal)

    kw = dict(score="additive", implementation="chunked", q_chunk=2, k_chunk=3)
    first = flax_interop.NnxSelfAttention(D, H, rngs=nnx.Rngs(11), **kw)
    second = flax_interop.NnxSelfAttention(D, H, rngs=nnx.Rngs(12), **kw)
    y1, y2 = forward(first, X), forward(second, X)
    assert len(traces) == 1
    assert not np.allclose(y1, y2)  # two sets of weights, one program
    forward(flax_interop.NnxSelfAttention(D, H, rngs=nnx.Rngs(13), score="dot"), X)
    assert len(traces) == 2  # another config is another program


@pytest.mark.parametrize(
    "mask, exc, words",
    [
        (PAD, ValueError, ["mask", "(2, 5)", "(2, 2, 5, 5)", "mask[:, None, None, :]"]),
        (PAD_MASK.astype(jnp.int32), TypeError, ["mask", "int32"]),
        (masks.segments(jnp.zeros((3, L), jnp.int32)), ValueError, ["segments", "(3,)", "(2,)"]),
    ],
)
def test_bad_masks_raise_one_line_errors(mask, exc, words):
    module = flax_interop.NnxSelfAttention(D, H, rngs=nnx.Rngs(14))
    with pytest.raises(exc) as info:
        module(X, mask)
    assert "\n" not in str(info.value)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_without_flax_the_import_names_the_extra_to_install(monkeypatch):
    class NoFlax:  # a machine without Flax: its import fails as Python's own finders fail it
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "flax":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    for name in [m for m in sys.modules if m.partition(".")[0] == "flax"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NoFlax(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "attn.flax_interop")
    with pytest.raises(ModuleNotFoundError) as e:
        importlib.import_module("attn.flax_interop")
    assert str(e.value) == (
        'attn.flax_interop needs Flax, which is not installed: pip install "attn[flax]"'
    )
    assert e.value.name == "flax" and e.value.__suppress_context__
