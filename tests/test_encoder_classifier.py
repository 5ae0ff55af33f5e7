"""attn.encoder_classifier: shapes, padding invariance, jit and gradients, `bert.encode`'s
attention weights, the step-by-step attention and the input embeddings the pictures and
`attn.importance` read, and the optional bag of hashed n-grams beside the encoder."""

import dataclasses
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn import (
    bag,
    bert,
    classifier,
    encoder_classifier,
    encoders,
    importance,
    layers,
    models,
    pooling,
)

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
    cfg = encoder_classifier.Config(encoder=enc, num_classes=3, max_len=16, pooling=pooling)
    params = encoder_classifier.init(jax.random.key(0), cfg)
    params["encoder"] = enc_params
    ids = _ids(np.random.default_rng(0), 2, 12, enc.vocab_size)
    logits, aux = encoder_classifier.apply(params, ids, cfg)
    jitted, _ = jax.jit(encoder_classifier.apply, static_argnums=2)(params, ids, cfg)
    chex.assert_shape(logits, (2, 3))
    np.testing.assert_allclose(jitted, logits, atol=1e-5)
    assert len(aux["attention"]) == enc.num_layers
    chex.assert_shape(aux["attention"][0], (2, enc.num_heads, 12, 12))
    # Appending padding changes nothing: not the logits, and no attention lands on it.
    padded = np.pad(ids, ((0, 0), (0, 4)))
    logits_pad, aux_pad = encoder_classifier.apply(params, padded, cfg)
    np.testing.assert_allclose(logits_pad, logits, atol=1e-5)
    assert float(jnp.abs(aux_pad["attention"][-1][..., 12:]).max()) == 0.0
    # A different head changes the logits: the test above could fail.
    other = encoder_classifier.init(jax.random.key(1), cfg)
    other["encoder"] = enc_params
    assert not np.allclose(encoder_classifier.apply(other, ids, cfg)[0], logits)


def test_gradients_reach_the_head_and_every_layer_and_dropout_needs_a_key(tiny):
    enc_params, enc = tiny
    cfg = encoder_classifier.Config(encoder=enc, max_len=16)
    params = {**encoder_classifier.init(jax.random.key(0), cfg), "encoder": enc_params}
    ids = _ids(np.random.default_rng(1), 2, 10, enc.vocab_size)

    def loss(p, rng):
        logits, _ = encoder_classifier.apply(p, ids, cfg, train=True, rng=rng)
        return jax.nn.log_softmax(logits)[:, 0].sum()

    grads = jax.jit(jax.grad(loss))(params, jax.random.key(2))
    for name in ("head", "encoder"):
        leaves = jax.tree.leaves(grads[name])
        assert all(bool(jnp.isfinite(g).all()) for g in leaves)
    for part in ("embed", "layer_0", "layer_1"):
        assert float(sum(jnp.abs(g).sum() for g in jax.tree.leaves(grads["encoder"][part]))) > 0
    # Dropout on: two keys give two answers, and no key is refused.
    a = encoder_classifier.apply(params, ids, cfg, train=True, rng=jax.random.key(3))[0]
    b = encoder_classifier.apply(params, ids, cfg, train=True, rng=jax.random.key(4))[0]
    assert not np.allclose(a, b)
    with pytest.raises(ValueError, match="needs an rng"):
        encoder_classifier.apply(params, ids, cfg, train=True)


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


@pytest.mark.parametrize("layer", [0, 1])
def test_attention_steps_are_the_encoders_own_weights_and_outputs(tiny, layer):
    """Each step of a layer, run alone, is what `encode` computes inside it: the weights it
    returns, and (through the residual and LayerNorm) the next layer's input."""
    params, enc = tiny
    cfg = encoder_classifier.Config(encoder=enc, max_len=16)
    clf = {**encoder_classifier.init(jax.random.key(0), cfg), "encoder": params}
    ids = _ids(np.random.default_rng(3), 2, 9, enc.vocab_size)[1]  # padded from position 4
    st = encoder_classifier.attention_steps(clf, ids, cfg, layer=layer)
    _, weights = bert.encode(params, enc, ids[None], ids[None] != 0, return_weights=True)
    np.testing.assert_allclose(st.weights_HxLxL, weights[layer][0], atol=1e-6)
    assert float(jnp.abs(st.weights_HxLxL[..., 4:]).max()) == 0.0  # padding keys masked
    np.testing.assert_allclose(
        st.scaled_HxLxL, st.raw_HxLxL / np.sqrt(enc.d_model // enc.num_heads), rtol=1e-5, atol=1e-6
    )
    if layer == 0:  # X is the embeddings after their LayerNorm
        want = bert.embed(params, enc, ids[None], ids[None] != 0)[0]
    else:  # X is the previous block's output: encode with only the layers below
        below, enc_below = bert.first_layers(params, enc, layer)
        want = bert.encode(below, enc_below, ids[None], ids[None] != 0)[0]
    np.testing.assert_allclose(st.x_LxD, want, atol=1e-5)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\)"):
        encoder_classifier.attention_steps(clf, ids, cfg, layer=2)


def test_the_input_embeddings_are_what_the_delta_moves(tiny):
    """`embed` is word + position + type before the LayerNorm; a zero delta changes nothing and
    gradient × input equals the finite difference of scaling one token's input embedding."""
    params, enc = tiny
    cfg = encoder_classifier.Config(encoder=enc, max_len=16)
    clf = {**encoder_classifier.init(jax.random.key(0), cfg), "encoder": params}
    ids = jnp.asarray(_ids(np.random.default_rng(4), 2, 8, enc.vocab_size))
    x = encoder_classifier.embed(clf, ids, cfg)
    e = params["embed"]
    want = e["tokens"][ids] + e["positions"][jnp.arange(8)] + e["types"][0]
    np.testing.assert_allclose(x, want, atol=1e-6)
    logits, _ = encoder_classifier.apply(clf, ids, cfg)
    zero, _ = encoder_classifier.apply(clf, ids, cfg, embed_delta_BxLxD=jnp.zeros_like(x))
    np.testing.assert_array_equal(zero, logits)
    g = importance.gradient(clf, ids, cfg)
    c = jnp.argmax(logits, -1)

    def log_p(b: int, pos: int, eps: float) -> float:
        delta = jnp.zeros_like(x).at[b, pos].set(eps * x[b, pos])
        out, _ = encoder_classifier.apply(clf, ids, cfg, embed_delta_BxLxD=delta)
        return float(jax.nn.log_softmax(out)[b, c[b]])

    for b, pos in ((0, 0), (0, 5), (1, 2)):
        fd = (log_p(b, pos, 1e-3) - log_p(b, pos, -1e-3)) / 2e-3
        np.testing.assert_allclose(g[b, pos], fd, rtol=2e-2, atol=1e-4)
    assert (g[1, 4:] == 0).all()  # padding


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_importance_reads_the_encoders_attention_and_erases_with_its_mask(tiny, pooling):
    """attention and rollout read the last layer's weights as the pooling does, and
    leave-one-out is the exact drop of erasing a token to PAD."""
    params, enc = tiny
    cfg = encoder_classifier.Config(encoder=enc, max_len=16, pooling=pooling)
    clf = {**encoder_classifier.init(jax.random.key(0), cfg), "encoder": params}
    ids = jnp.asarray(_ids(np.random.default_rng(5), 2, 8, enc.vocab_size))
    real = np.asarray(ids != 0)
    assert importance.has_attention(cfg)
    _, aux = encoder_classifier.apply(clf, ids, cfg)
    w = np.asarray(aux["attention"][-1]).mean(1)  # [B, query, key]
    att = np.asarray(importance.attention(clf, ids, cfg))
    for b in range(2):
        want = w[b][real[b]].mean(0) * real[b]
        np.testing.assert_allclose(att[b], want, atol=1e-6)
    roll = np.asarray(importance.rollout(clf, ids, cfg))
    assert (roll[~real] == 0).all() and np.isfinite(roll).all()
    loo = np.asarray(importance.leave_one_out(clf, ids, cfg))
    c, p = importance.predicted(clf, ids, cfg)
    erased = ids.at[0, 3].set(0)
    p_erased = importance.probabilities(clf, erased, cfg)[0, c[0]]
    np.testing.assert_allclose(loo[0, 3], p[0] - p_erased, atol=1e-6)
    off = encoder_classifier.Config(encoder=bert.first_layers(params, enc, 0)[1], max_len=16)
    assert not importance.has_attention(off)
    assert models.layout(cfg) == (enc.num_layers, enc.num_heads, "scaled_dot")
    assert models.layout(off)[0] == 0
    own = classifier.ModelConfig(vocab_size=8, num_layers=3, num_heads=2, d_model=8, score="mlp")
    assert models.layout(own) == (3, 2, "mlp")


def test_config_refuses_what_the_encoder_cannot_do(tiny):
    _, enc = tiny
    with pytest.raises(ValueError, match="at most 40 tokens"):
        encoder_classifier.Config(encoder=enc, max_len=64)
    with pytest.raises(ValueError, match="pooling"):
        encoder_classifier.Config(encoder=enc, max_len=16, pooling="max")
    with pytest.raises(ValueError, match="attention dropout needs implementation 'matrix'"):
        encoder_classifier.Config(encoder=enc, max_len=16, implementation="chunked")
    for bad in (
        {"bag_buckets": -1},
        {"bag_buckets": 64, "bag_orders": ()},
        {"bag_orders": (1, 1)},
        {"bag_dropout": 1.0},
    ):
        with pytest.raises(ValueError, match="Config.bag_"):
            encoder_classifier.Config(encoder=enc, max_len=16, **bad)
    listed = encoder_classifier.Config(encoder=enc, max_len=16, bag_buckets=64, bag_orders=[1, 3])
    assert listed.bag_orders == (1, 3)  # a list from JSON is normalised, so the config hashes


def test_config_refuses_an_implementation_the_family_cannot_run(tiny, monkeypatch):
    """A family that says it cannot run an implementation (Family.unsupported) gets a one-line
    refusal naming it and why, before anything is traced."""
    _, enc = tiny
    fam = encoders.family(enc)
    refusing = dataclasses.replace(fam, unsupported={"xla": "its score has extra terms"})
    monkeypatch.setitem(encoders._BY_CONFIG, type(enc), refusing)
    with pytest.raises(ValueError) as e:
        encoder_classifier.Config(encoder=enc, max_len=16, implementation="xla")
    message = str(e.value)
    assert message == (
        "Config.implementation 'xla' cannot run the bert encoder: its score has extra terms"
    )
    no_att = dataclasses.replace(enc, attention_dropout=0.0)
    assert encoder_classifier.Config(encoder=no_att, max_len=16, implementation="chunked")
    assert fam.unsupported == {}  # BERT's attention runs in every implementation


def _with_bag(tiny, **bag_fields):
    """A config without the bag and one with it, and the params of the first with the
    checkpoint's encoder."""
    enc_params, enc = tiny
    off = encoder_classifier.Config(encoder=enc, max_len=16, dropout=0.3)
    on = encoder_classifier.Config(encoder=enc, max_len=16, dropout=0.3, **bag_fields)
    params = {**encoder_classifier.init(jax.random.key(0), off), "encoder": enc_params}
    return off, on, params


def test_without_the_bag_the_model_and_its_random_streams_are_as_before(tiny):
    """Bag off: the logits are bit for bit those of encode -> mean pool -> dropout -> head with
    the key split as before the bag existed; bag on with a zero table (dropout on it too) gives
    the very same logits, in training and in evaluation, and the same other params."""
    off, on, params = _with_bag(tiny, bag_buckets=64, bag_dropout=0.5)
    ids = _ids(np.random.default_rng(3), 2, 12, off.encoder.vocab_size)
    rng = jax.random.key(5)
    r_enc, r_pool = jax.random.split(rng)
    mask = ids != 0
    h = bert.encode(params["encoder"], off.encoder, ids, mask, train=True, rng=r_enc)
    v = layers.dropout(jax.vmap(pooling.mean_pool)(h, mask), 0.3, train=True, rng=r_pool)
    want = v @ params["head"]["w"] + params["head"]["b"]
    got, _ = encoder_classifier.apply(params, ids, off, train=True, rng=rng)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    init_on = encoder_classifier.init(jax.random.key(0), on)
    assert set(init_on) == {"encoder", "head", "bag"} and not np.asarray(init_on["bag"]).any()
    assert init_on["bag"].shape == (64, 2)
    np.testing.assert_array_equal(
        init_on["head"]["w"], encoder_classifier.init(jax.random.key(0), off)["head"]["w"]
    )
    with_zeros = {**params, "bag": init_on["bag"]}
    for train in (True, False):
        a, _ = encoder_classifier.apply(params, ids, off, train=train, rng=rng)
        b, _ = encoder_classifier.apply(with_zeros, ids, on, train=train, rng=rng)
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def _fnv_bucket(ngram: list[int], order: int, buckets: int) -> int:
    """bag.ngram_buckets for one n-gram, in plain Python: FNV-1a seeded with the order, then
    MurmurHash3's finaliser, all mod 2**32."""
    m = 0xFFFFFFFF
    h = 2166136261 ^ order
    for t in ngram:
        h = ((h ^ t) * 16777619) & m
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    return (h ^ (h >> 16)) % buckets


def _bag_reference(table: np.ndarray, ids: np.ndarray, orders: tuple[int, ...]) -> np.ndarray:
    """The bag's logits one text at a time: each distinct n-gram bucket (per order) of the real
    positions counts once, and the sum is divided by the root of their number."""
    out = np.zeros((len(ids), table.shape[1]))
    for b, row in enumerate(ids.tolist()):
        distinct = set()
        for end, t in enumerate(row):
            if t == 0:
                continue
            for n in orders:
                gram = [row[i] if i >= 0 else 0 for i in range(end - n + 1, end + 1)]
                distinct.add((n, _fnv_bucket(gram, n, table.shape[0])))
        for _, bucket in distinct:
            out[b] += table[bucket]
        out[b] /= np.sqrt(max(len(distinct), 1))
    return out


def test_the_bag_adds_the_table_rows_of_the_distinct_hashed_ngrams(tiny):
    off, on, params = _with_bag(tiny, bag_buckets=97, bag_orders=(1, 2))
    ids = _ids(np.random.default_rng(4), 3, 12, off.encoder.vocab_size)
    ids[2, 3:6] = ids[2, 0:3]  # repeated n-grams count once
    table = np.random.default_rng(5).normal(size=(97, 2)).astype(np.float32)
    with_bag = {**params, "bag": jnp.asarray(table)}
    base, _ = encoder_classifier.apply(params, ids, off)
    got, _ = encoder_classifier.apply(with_bag, ids, on)
    want = _bag_reference(table, ids, (1, 2))
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(np.asarray(got) - np.asarray(base), want, atol=1e-5)
    # bag_tokens_BxG, when given, is what the bag reads; the encoder still reads the tokens.
    longer = np.concatenate([ids, ids[:, 1:5]], axis=1)
    longer[1, 12:] = 0  # row 1 is padded from the middle: nothing after it is read
    got, _ = encoder_classifier.apply(with_bag, ids, on, bag_tokens_BxG=longer)
    np.testing.assert_allclose(
        np.asarray(got) - np.asarray(base), _bag_reference(table, longer, (1, 2)), atol=1e-5
    )
    assert not np.allclose(_bag_reference(table, longer, (1, 2))[0], want[0], atol=1e-3)


def test_padding_adds_nothing_to_the_bag(tiny):
    """The buckets that padding would hash to hold large rows: appended padding, a padded
    bag_tokens_BxG and an all-padding text add nothing."""
    off, on, params = _with_bag(tiny, bag_buckets=97, bag_orders=(1, 2, 3))
    pads = np.unique(np.asarray(encoder_classifier.bag_ids(jnp.zeros((1, 4), jnp.int32), on)))
    table = np.random.default_rng(6).normal(size=(97, 2)).astype(np.float32)
    table[pads] = 100.0
    with_bag = {**params, "bag": jnp.asarray(table)}
    ids = _ids(np.random.default_rng(7), 2, 10, off.encoder.vocab_size)
    got, _ = encoder_classifier.apply(with_bag, ids, on)
    base, _ = encoder_classifier.apply(params, ids, off)
    np.testing.assert_allclose(
        np.asarray(got) - np.asarray(base), _bag_reference(table, ids, (1, 2, 3)), atol=1e-4
    )
    assert np.abs(np.asarray(got)).max() < 50  # no row of 100 was read
    padded = np.pad(ids, ((0, 0), (0, 6)))
    np.testing.assert_allclose(encoder_classifier.apply(with_bag, padded, on)[0], got, atol=1e-5)
    np.testing.assert_allclose(
        encoder_classifier.apply(with_bag, ids, on, bag_tokens_BxG=padded)[0], got, atol=1e-5
    )
    empty = np.zeros((1, 10), np.int32)
    empty_bag = bag.logits(with_bag["bag"], encoder_classifier.bag_ids(empty, on), empty != 0)
    assert not np.asarray(empty_bag).any()
