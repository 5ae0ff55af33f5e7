"""attn.scores: lookup, init shapes, dtypes and closed-form special cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close32

from attn import classifier, reference, scores
from attn.attention import attention


def _qk(seed=0, dtype=jnp.float32):
    r = np.random.default_rng(seed)
    return jnp.asarray(r.normal(size=(3, 4)), dtype), jnp.asarray(r.normal(size=(5, 4)), dtype)


def test_lookup_by_name_score_and_callable():
    for name in ("dot", "scaled_dot", "general", "additive", "mlp"):
        sc = scores.get_score(name)
        assert sc.name == name and sc.fn is getattr(scores, name)
        assert scores.get_score(sc) is sc
    fn = lambda p, q, k: q @ k.T
    sc = scores.get_score(fn)
    assert sc.fn is fn and not sc.has_params and sc.init(jax.random.key(0), 4) is None


@pytest.mark.parametrize("name", ["additive", "mlp"])
def test_init_hidden_size_and_output_shape(name):
    sc = scores.get_score(name)
    p = sc.init(jax.random.key(0), 4, hidden=7)
    assert all(7 in x.shape for x in jax.tree.leaves(p))
    q, k = _qk()
    assert sc.fn(p, q, k).shape == (3, 5)


def test_scaled_dot_and_general_closed_forms():
    q, k = _qk(1)
    assert_close32(scores.scaled_dot(None, q, k), q @ k.T / 2.0, 4)
    w = {"w_DxD": jnp.eye(4)}
    assert_close32(scores.general(w, q, k), scores.dot(None, q, k), 2 * 4)


@pytest.mark.parametrize("name", ["dot", "scaled_dot", "general", "additive", "mlp"])
def test_bfloat16_inputs_give_float32_scores(name):
    sc = scores.get_score(name)
    q, k = _qk(2, jnp.bfloat16)
    s = sc.fn(sc.init(jax.random.key(0), 4), q, k)
    assert s.dtype == jnp.float32


def test_unknown_name_lists_valid_names():
    with pytest.raises(
        ValueError, match=r"score must be one of .*'additive'.*'scaled_dot'.*'dotx'"
    ):
        scores.get_score("dotx")


def test_callables_that_declare_positions_receive_them():
    def rel(p, q, k, *, q_pos, k_pos):
        return (q_pos[:, None] - k_pos[None, :]).astype(jnp.float32)

    sc = scores.get_score(rel)
    assert sc.positional and sc.has_params is None
    assert not scores.get_score(lambda p, q, k: q @ k.T).positional
    assert not scores.SCORES["scaled_dot"].positional
    q, k = _qk()
    s = scores.evaluate(sc, None, q, k, jnp.arange(3) + 10, jnp.arange(5))
    np.testing.assert_array_equal(s, np.arange(10, 13)[:, None] - np.arange(5)[None, :])


def test_bfloat16_scaled_dot_is_the_float32_dot_scaled():
    # bf16 x bf16 products are exact in float32: nothing may be rounded to bf16 on the way.
    # d=8: 1/sqrt(8) is not a power of two, so scaling bf16 q would round it.
    r = np.random.default_rng(3)
    q, k = (jnp.asarray(r.normal(size=(n, 8)), jnp.bfloat16) for n in (6, 5))
    s = scores.scaled_dot(None, q, k)
    assert s.dtype == jnp.float32
    expected = np.asarray(q, np.float64) @ np.asarray(k, np.float64).T / np.sqrt(8)
    assert_close32(s, expected, 8 + 1)


def test_concat_is_the_additive_score():
    assert scores.get_score("concat") is scores.get_score("additive")
    r = np.random.default_rng(4)
    q, k, v = (jnp.asarray(r.normal(size=(n, 4)), jnp.float32) for n in (3, 5, 5))
    p = scores.get_score("concat").init(jax.random.key(0), 4)
    out, w = attention(q, k, v, score="concat", score_params=p)
    out_ref, w_ref = reference.attention(q, k, v, score="additive", score_params=p)
    assert_close32(w, w_ref, 2 * 4 + 5)
    assert_close32(out, out_ref, 2 * 4 + 2 * 5)
    cfg = classifier.ModelConfig(vocab_size=10, d_model=8, num_heads=2, score="concat")
    assert cfg.score == "additive" and cfg == classifier.ModelConfig(
        vocab_size=10, d_model=8, num_heads=2, score="additive"
    )
    params = classifier.init(jax.random.key(1), cfg)
    logits, _ = classifier.apply(params, jnp.array([[3, 4, 5, 0]]), cfg)
    assert logits.shape == (1, 2) and np.isfinite(logits).all()
    with pytest.raises(ValueError, match=r"score must be one of .*'concat'"):
        classifier.ModelConfig(vocab_size=10, score="concatenate")
    with pytest.raises(ValueError, match=r"score must be one of .*'concat'.*'mlp'"):
        scores.get_score("bilinear")
