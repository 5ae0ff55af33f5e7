"""The Flax linen and nnx wrappers hold the pure param tree and compute the pure function."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn import flax_interop, masks, multihead
from attn.attention import attention

B, L, D, H = 2, 5, 8, 2
X = jax.random.normal(jax.random.key(0), (B, L, D))
MASK = jnp.array([[True] * 5, [True, True, True, False, False]])


def _pure(params, score="scaled_dot", mask=MASK):
    attend = functools.partial(attention, score=score)
    fn = jax.vmap(lambda x, m: multihead.apply(params, x, m, num_heads=H, attend=attend))
    return fn(X, mask)


@pytest.mark.parametrize("score", ["scaled_dot", "general"])
def test_linen_module_equals_pure_function(score):
    module = flax_interop.SelfAttention(num_heads=H, score=score)
    variables = module.init(jax.random.key(1), X, MASK)
    params = variables["params"]
    expected = jax.tree.map(jnp.shape, multihead.init(jax.random.key(0), D, H, score=score))
    assert jax.tree.map(jnp.shape, dict(params)) == expected
    y, w = module.apply(variables, X, MASK, return_weights=True)
    y_ref, w_ref = _pure(params, score)
    np.testing.assert_allclose(y, y_ref, atol=1e-6)
    np.testing.assert_allclose(w, w_ref, atol=1e-6)
    # Pure params drop straight into the module.
    pure = multihead.init(jax.random.key(2), D, H, score=score)
    np.testing.assert_allclose(
        module.apply({"params": pure}, X, MASK), _pure(pure, score)[0], atol=1e-6
    )


def test_linen_accepts_one_unbatched_sequence_and_checks_the_mask():
    module = flax_interop.SelfAttention(num_heads=H)
    variables = module.init(jax.random.key(1), X[0])
    y = module.apply(variables, X[0])
    y_ref, _ = multihead.apply(variables["params"], X[0], None, num_heads=H)
    np.testing.assert_allclose(y, y_ref, atol=1e-6)
    with pytest.raises(ValueError, match="mask shape"):
        module.apply(variables, X, MASK[:, :3])


def test_linen_takes_query_key_masks_and_mask_functions():
    module = flax_interop.SelfAttention(num_heads=H)
    variables = module.init(jax.random.key(1), X)
    pairs_BxLxL = jax.vmap(lambda m: masks.matrix(masks.all_of(masks.causal, m), L, L))(MASK)
    y, w = module.apply(variables, X, pairs_BxLxL, return_weights=True)
    y_ref, w_ref = _pure(variables["params"], mask=pairs_BxLxL)
    np.testing.assert_allclose(y, y_ref, atol=1e-6)
    assert np.all(np.asarray(w)[:, :, 0, 1:] == 0.0)  # causal: the first query sees only itself
    y_fn = module.apply(variables, X, masks.causal)  # one function for every sequence
    y_all = module.apply(
        variables, X, jnp.broadcast_to(masks.matrix(masks.causal, L, L), (B, L, L))
    )
    np.testing.assert_allclose(y_fn, y_all, atol=1e-6)


@pytest.mark.parametrize("module_type", ["linen", "nnx"])
def test_attend_chooses_the_implementation(module_type):
    attend = functools.partial(
        attention, score="additive", implementation="chunked", q_chunk=2, k_chunk=3
    )
    if module_type == "linen":
        module = flax_interop.SelfAttention(num_heads=H, score="additive", attend=attend)
        variables = module.init(jax.random.key(1), X, MASK)
        params = variables["params"]
        y, w = module.apply(variables, X, MASK, return_weights=True)
    else:
        module = flax_interop.NnxSelfAttention(
            D, H, score="additive", attend=attend, rngs=nnx.Rngs(3)
        )
        params = module.pure_params()
        y, w = module(X, MASK, return_weights=True)
    assert w is None  # chunked forms no weights
    np.testing.assert_allclose(y, _pure(params, "additive")[0], atol=1e-5)


@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_nnx_module_equals_pure_function_and_trains(score):
    module = flax_interop.NnxSelfAttention(D, H, score=score, rngs=nnx.Rngs(3))
    params = module.pure_params()
    state = nnx.state(module, nnx.Param)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(
        jnp.shape, multihead.init(jax.random.key(0), D, H, score=score)
    )
    assert len(jax.tree.leaves(state)) == len(jax.tree.leaves(params))
    y, w = module(X, MASK, return_weights=True)
    y_ref, w_ref = _pure(params, score)
    np.testing.assert_allclose(y, y_ref, atol=1e-6)
    np.testing.assert_allclose(w, w_ref, atol=1e-6)

    def loss(m):
        return jnp.sum(m(X, MASK) ** 2)

    grads = nnx.grad(loss)(module)
    pure_grads = jax.grad(lambda p: jnp.sum(_pure(p, score)[0] ** 2))(params)
    flat = jax.tree.leaves(nnx.state(grads))
    np.testing.assert_allclose(
        np.concatenate([np.ravel(g) for g in flat]),
        np.concatenate([np.ravel(g) for g in jax.tree.leaves(pure_grads)]),
        rtol=1e-5,
        atol=1e-6,
    )
