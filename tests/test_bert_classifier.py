"""attn.bert_classifier: shapes, padding invariance, jit and gradients, and `bert.encode`'s
attention weights."""

import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn import bert, bert_classifier

DATA = pathlib.Path(__file__).parent / "data" / "bert"


@pytest.fixture(scope="module")
def tiny():
    params, enc = bert.load(DATA / "tiny_bert")
    return params, enc


def _ids(rng: np.random.Generator, batch: int, length: int, vocab: int) -> np.ndarray:
    ids = rng.integers(10, vocab, size=(batch, length)).astype(np.int32)
    ids[:, 0] = 6  # [CLS]
    ids[1, length // 2 :] = 0  # a shorter text, padded
    return ids


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_shapes_jit_and_padding_invariance(tiny, pooling):
    enc_params, enc = tiny
    cfg = bert_classifier.Config(encoder=enc, num_classes=3, max_len=16, pooling=pooling)
    params = bert_classifier.init(jax.random.key(0), cfg)
    params["encoder"] = enc_params
    ids = _ids(np.random.default_rng(0), 2, 12, enc.vocab_size)
    logits, aux = bert_classifier.apply(params, ids, cfg)
    jitted, _ = jax.jit(bert_classifier.apply, static_argnums=2)(params, ids, cfg)
    chex.assert_shape(logits, (2, 3))
    np.testing.assert_allclose(jitted, logits, atol=1e-5)
    assert len(aux["attention"]) == enc.num_layers
    chex.assert_shape(aux["attention"][0], (2, enc.num_heads, 12, 12))
    # Appending padding changes nothing: not the logits, and no attention lands on it.
    padded = np.pad(ids, ((0, 0), (0, 4)))
    logits_pad, aux_pad = bert_classifier.apply(params, padded, cfg)
    np.testing.assert_allclose(logits_pad, logits, atol=1e-5)
    assert float(jnp.abs(aux_pad["attention"][-1][..., 12:]).max()) == 0.0
    # A different head changes the logits: the test above could fail.
    other = bert_classifier.init(jax.random.key(1), cfg)
    other["encoder"] = enc_params
    assert not np.allclose(bert_classifier.apply(other, ids, cfg)[0], logits)


def test_gradients_reach_the_head_and_every_layer_and_dropout_needs_a_key(tiny):
    enc_params, enc = tiny
    cfg = bert_classifier.Config(encoder=enc, max_len=16)
    params = {**bert_classifier.init(jax.random.key(0), cfg), "encoder": enc_params}
    ids = _ids(np.random.default_rng(1), 2, 10, enc.vocab_size)

    def loss(p, rng):
        logits, _ = bert_classifier.apply(p, ids, cfg, train=True, rng=rng)
        return jax.nn.log_softmax(logits)[:, 0].sum()

    grads = jax.jit(jax.grad(loss))(params, jax.random.key(2))
    for name in ("head", "encoder"):
        leaves = jax.tree.leaves(grads[name])
        assert all(bool(jnp.isfinite(g).all()) for g in leaves)
    for part in ("embed", "layer_0", "layer_1"):
        assert float(sum(jnp.abs(g).sum() for g in jax.tree.leaves(grads["encoder"][part]))) > 0
    # Dropout on: two keys give two answers, and no key is refused.
    a = bert_classifier.apply(params, ids, cfg, train=True, rng=jax.random.key(3))[0]
    b = bert_classifier.apply(params, ids, cfg, train=True, rng=jax.random.key(4))[0]
    assert not np.allclose(a, b)
    with pytest.raises(ValueError, match="needs an rng"):
        bert_classifier.apply(params, ids, cfg, train=True)


def test_encode_returns_the_states_it_returns_without_weights(tiny):
    params, enc = tiny
    ids = _ids(np.random.default_rng(2), 2, 8, enc.vocab_size)
    mask = ids != 0
    h = bert.encode(params, enc, ids, mask)
    h2, weights = bert.encode(params, enc, ids, mask, return_weights=True)
    np.testing.assert_array_equal(h, h2)
    assert len(weights) == enc.num_layers
    rows = np.asarray(weights[0]).sum(-1)  # each query's weights over the keys sum to 1
    np.testing.assert_allclose(rows, 1.0, atol=1e-5)


def test_config_refuses_what_the_encoder_cannot_do(tiny):
    _, enc = tiny
    with pytest.raises(ValueError, match="max_positions=40"):
        bert_classifier.Config(encoder=enc, max_len=64)
    with pytest.raises(ValueError, match="pooling"):
        bert_classifier.Config(encoder=enc, max_len=16, pooling="max")
    with pytest.raises(ValueError, match="attention dropout needs implementation 'matrix'"):
        bert_classifier.Config(encoder=enc, max_len=16, implementation="chunked")
    ids = jnp.ones((1, 4), jnp.int32)
    cfg = bert_classifier.Config(encoder=enc, max_len=16)
    params = bert_classifier.init(jax.random.key(0), cfg)
    with pytest.raises(ValueError, match="no adversarial"):
        bert_classifier.apply(params, ids, cfg, bag_tokens_BxG=ids)
