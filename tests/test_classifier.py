"""Classifier: shapes, invariances, training behaviour, ModelConfig validation."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_close32, classifier_terms

from attn import classifier, encoder, layers
from attn.attention import attention
from attn.classifier import ModelConfig

TINY = dict(vocab_size=30, d_model=8, num_heads=2, d_ff=16, max_len=16, pool_hidden=6, pool_hops=3)
TOKENS = jnp.array(
    [[2, 5, 9, 7, 11, 0, 0, 0], [2, 4, 0, 0, 0, 0, 0, 0], [2, 8, 3, 3, 6, 12, 13, 9]]
)
POOLINGS = ("cls", "mean", "max", "structured")


def _cfg(**kw) -> ModelConfig:
    return ModelConfig(**{**TINY, **kw})


def _run(cfg, tokens=TOKENS, seed=0, **kw):
    params = classifier.init(jax.random.key(seed), cfg)
    return classifier.apply(params, tokens, cfg, **kw)


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
@pytest.mark.parametrize("ngram_buckets", [0, 17])
def test_shapes(pooling, positions, ngram_buckets):
    # eval_shape traces without compiling: the full grid stays cheap. Values are checked elsewhere.
    cfg = _cfg(pooling=pooling, positions=positions, ngram_buckets=ngram_buckets, num_classes=3)
    params = jax.eval_shape(lambda k: classifier.init(k, cfg), jax.random.key(0))
    assert ("positions" in params["embed"]) == (positions == "learned")
    assert ("ngrams" in params["embed"]) == (ngram_buckets > 0)
    logits, aux = jax.eval_shape(lambda p, t: classifier.apply(p, t, cfg), params, TOKENS)
    B, L = TOKENS.shape
    assert logits.shape == (B, 3) and logits.dtype == jnp.float32
    assert isinstance(aux["attention"], tuple) and len(aux["attention"]) == cfg.num_layers
    assert aux["attention"][0].shape == (B, cfg.num_heads, L, L)
    assert aux["penalty"].shape == () and aux["penalty"].dtype == jnp.float32
    if pooling == "structured":
        assert aux["pool_weights"].shape == (B, cfg.pool_hops, L)
    else:
        assert aux["pool_weights"] is None


def test_bfloat16_compute_gives_finite_float32_logits_close_to_float32():
    cfg = _cfg(pooling="structured", ngram_buckets=11)
    params = classifier.init(jax.random.key(0), cfg)
    lo16, aux = classifier.apply(params, TOKENS, dataclasses.replace(cfg, dtype="bfloat16"))
    lo32, _ = classifier.apply(params, TOKENS, cfg)
    assert lo16.dtype == jnp.float32 and aux["penalty"].dtype == jnp.float32
    chex.assert_tree_all_finite(lo16)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    # bfloat16's, not float32's: every activation keeps 8 significant bits (2^-8 = 3.9e-3
    # relative), through about 25 roundings on the way to a logit.
    np.testing.assert_allclose(lo16, lo32, atol=0.1)


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_appending_padding_does_not_change_logits(pooling, positions):
    cfg = _cfg(pooling=pooling, positions=positions, ngram_buckets=13, num_layers=2)
    params = classifier.init(jax.random.key(1), cfg)
    padded = jnp.pad(TOKENS, ((0, 0), (0, 5)))
    lo, aux = classifier.apply(params, TOKENS, cfg)
    lo_pad, aux_pad = classifier.apply(params, padded, cfg)
    assert_close32(lo, lo_pad, classifier_terms(cfg, 13))
    assert_close32(aux["penalty"], aux_pad["penalty"], classifier_terms(cfg, 13))


@pytest.mark.parametrize("pooling", POOLINGS)
def test_all_padding_row_gives_finite_logits(pooling):
    # Batches are topped up with all-PAD filler rows (weight 0): they must stay finite.
    # Their gradients are checked in test_one_adamw_step_lowers_the_loss.
    cfg = _cfg(pooling=pooling, ngram_buckets=7)
    logits, aux = _run(cfg, tokens=TOKENS.at[1].set(0))
    chex.assert_tree_all_finite((logits, aux))


def test_masked_keys_get_zero_attention_weight():
    cfg = _cfg(num_layers=2)
    _, aux = _run(cfg)
    key_is_pad_Bx1x1xL = np.asarray(TOKENS == 0)[:, None, None, :]
    for w_BxHxLxL in aux["attention"]:
        w = np.asarray(w_BxHxLxL)
        assert np.all(np.where(key_is_pad_Bx1x1xL, w, 0.0) == 0.0)
        # Every real query distributes all its weight over real keys.
        real_q = np.asarray(TOKENS != 0)
        assert_close32(w.sum(-1).transpose(0, 2, 1)[real_q], 1.0, 2 * 8)


def test_encoder_is_permutation_equivariant():
    d, h, L = 8, 2, 6
    params = encoder.init(jax.random.key(2), d, h, 16)
    x = jax.random.normal(jax.random.key(3), (L, d))
    mask = jnp.array([True, True, False, True, True, False])
    perm = jnp.array([4, 2, 0, 5, 1, 3])
    y, w = encoder.apply(params, x, mask, num_heads=h)
    y_p, w_p = encoder.apply(params, x[perm], mask[perm], num_heads=h)
    assert_close32(y_p, y[perm], 6 * 8 + 4 * 4 + 2 * 6 + 16)
    assert_close32(w_p, w[:, perm][:, :, perm], 2 * 8 + 4 * 4 + 6)


def test_classifier_without_positions_ignores_token_order():
    cfg = _cfg(positions="none", pooling="mean", num_layers=2)
    shuffled = TOKENS.at[0, :5].set(TOKENS[0, jnp.array([3, 0, 4, 1, 2])])
    lo, _ = _run(cfg)
    lo_s, _ = _run(cfg, tokens=shuffled)
    assert_close32(lo, lo_s, classifier_terms(cfg, TOKENS.shape[1]))
    lo_p, _ = _run(_cfg(positions="learned", pooling="mean", num_layers=2), tokens=shuffled)
    lo_l, _ = _run(_cfg(positions="learned", pooling="mean", num_layers=2))
    assert not np.allclose(lo_p[0], lo_l[0], atol=1e-5)  # with positions, order matters


def test_ngram_buckets_depend_only_on_the_last_n_tokens():
    t = jnp.array([[5, 6, 7, 8, 9, 10]])
    ids = classifier.ngram_buckets(t, (2, 3), 1000)
    ids2 = classifier.ngram_buckets(t.at[0, 2].set(20), (2, 3), 1000)
    assert ids.shape == (2, 1, 6) and ids.dtype == jnp.int32
    assert np.all((ids >= 0) & (ids < 1000))
    changed = np.asarray(ids != ids2)[:, 0]
    np.testing.assert_array_equal(changed[0], [0, 0, 1, 1, 0, 0])  # bigrams ending at 2, 3
    np.testing.assert_array_equal(changed[1], [0, 0, 1, 1, 1, 0])  # trigrams ending at 2, 3, 4
    assert not np.array_equal(ids[0], ids[1])  # orders hash apart


def test_fresh_ngram_table_is_zero_so_unseen_ngrams_add_nothing():
    cfg = _cfg(ngram_buckets=13)
    params = classifier.init(jax.random.key(0), cfg)
    np.testing.assert_array_equal(params["embed"]["ngrams"], np.zeros((13, cfg.d_model)))
    plain = {**params, "embed": {k: v for k, v in params["embed"].items() if k != "ngrams"}}
    lo_n, _ = classifier.apply(params, TOKENS, cfg)
    lo, _ = classifier.apply(plain, TOKENS, _cfg())
    assert_close32(lo_n, lo, classifier_terms(cfg, TOKENS.shape[1]))


def test_ngrams_change_logits_and_ignore_padding_positions():
    cfg = _cfg(ngram_buckets=13)
    params = classifier.init(jax.random.key(0), cfg)
    # A trained table: rows away from their zero init.
    params["embed"]["ngrams"] = jax.random.normal(jax.random.key(1), (13, cfg.d_model))
    plain = {**params, "embed": {k: v for k, v in params["embed"].items() if k != "ngrams"}}
    lo_n, _ = classifier.apply(params, TOKENS, cfg)
    lo, _ = classifier.apply(plain, TOKENS, _cfg())
    assert not np.allclose(lo_n, lo, atol=1e-4)
    x = classifier.embed(params, TOKENS, cfg)
    x_plain = classifier.embed(plain, TOKENS, _cfg())
    pad = np.asarray(TOKENS == 0)
    np.testing.assert_array_equal(np.asarray(x)[pad], np.asarray(x_plain)[pad])


def test_too_long_input_with_learned_positions_raises():
    cfg = _cfg(max_len=4)
    with pytest.raises(ValueError, match="max_len=4"):
        _run(cfg)
    logits, _ = _run(dataclasses.replace(cfg, positions="sinusoidal"))
    chex.assert_shape(logits, (3, 2))


def _loss(params, tokens, labels, cfg, rng):
    logits, aux = classifier.apply(params, tokens, cfg, train=True, rng=rng)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return ce + 0.1 * aux["penalty"]


def test_one_adamw_step_lowers_the_loss():
    cfg = _cfg(pooling="structured", dropout=0.0, embed_dropout=0.0, ngram_buckets=7)
    params = classifier.init(jax.random.key(4), cfg)
    tokens = jnp.concatenate([TOKENS, jnp.zeros_like(TOKENS[:1])])  # plus an all-PAD filler row
    labels = jnp.array([0, 1, 1, 0])
    rng = jax.random.key(5)
    opt = optax.adamw(1e-2, weight_decay=1e-4)
    state = opt.init(params)
    loss_and_grad = jax.jit(jax.value_and_grad(_loss), static_argnums=3)
    loss0, grads = loss_and_grad(params, tokens, labels, cfg, rng)
    chex.assert_tree_all_finite(grads)
    updates, state = opt.update(grads, state, params)
    loss1, _ = loss_and_grad(optax.apply_updates(params, updates), tokens, labels, cfg, rng)
    assert loss1 < loss0


def test_train_requires_rng_and_dropout_depends_on_it():
    cfg = _cfg(dropout=0.3, embed_dropout=0.3)
    params = classifier.init(jax.random.key(0), cfg)
    with pytest.raises(ValueError, match="rng"):
        classifier.apply(params, TOKENS, cfg, train=True)
    a, _ = classifier.apply(params, TOKENS, cfg, train=True, rng=jax.random.key(1))
    a2, _ = classifier.apply(params, TOKENS, cfg, train=True, rng=jax.random.key(1))
    b, _ = classifier.apply(params, TOKENS, cfg, train=True, rng=jax.random.key(2))
    e1, _ = classifier.apply(params, TOKENS, cfg)
    e2, _ = classifier.apply(params, TOKENS, cfg, rng=jax.random.key(3))
    np.testing.assert_array_equal(a, a2)
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(e1, e2)


def test_jit_and_no_jit_agree_and_config_is_a_static_arg():
    cfg = _cfg(pooling="structured", ngram_buckets=5)
    params = classifier.init(jax.random.key(6), cfg)
    eager, _ = classifier.apply(params, TOKENS, cfg)
    # A fresh function, so the cache count below is this test's alone.
    fn = jax.jit(lambda p, t, c: classifier.apply(p, t, c), static_argnums=2)
    jitted, _ = fn(params, TOKENS, cfg)
    again, _ = fn(params, TOKENS, dataclasses.replace(cfg))  # equal config: cache hit
    assert_close32(eager, jitted, classifier_terms(cfg, TOKENS.shape[1]))
    np.testing.assert_array_equal(jitted, again)
    assert fn._cache_size() == 1


@pytest.mark.parametrize("implementation", ["chunked", "xla"])
def test_other_implementations_match_matrix(implementation):
    cfg = _cfg(num_layers=2, q_chunk=3, k_chunk=2)
    params = classifier.init(jax.random.key(7), cfg)
    lo_m, _ = classifier.apply(params, TOKENS, cfg)
    lo_c, aux = classifier.apply(
        params, TOKENS, dataclasses.replace(cfg, implementation=implementation)
    )
    assert_close32(lo_m, lo_c, classifier_terms(cfg, TOKENS.shape[1]))
    assert aux["attention"] is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("vocab_size", 0),
        ("vocab_size", 2.5),
        ("num_classes", 1),
        ("d_model", 0),
        ("num_heads", 0),
        ("num_heads", 3),  # 8 % 3 != 0
        ("num_layers", -1),
        ("d_ff", 0),
        ("max_len", 0),
        ("positions", "rotary"),
        ("pooling", "sum"),
        ("pool_hops", 0),
        ("pool_hidden", 0),
        ("dropout", 1.0),
        ("dropout", -0.1),
        ("embed_dropout", 1.5),
        ("score", "cosine"),
        ("implementation", "flash"),
        ("implementation", "xla"),  # with score="general" below
        ("implementation", "cudnn"),  # likewise
        ("implementation", "splash"),  # likewise
        ("q_chunk", 0),
        ("k_chunk", True),
        ("ngram_buckets", -1),
        ("ngram_orders", (0, 2)),
        ("ngram_orders", "23"),
        ("ngram_orders", (2, 2)),
        ("dtype", "float16"),
    ],
)
def test_bad_config_field_raises_naming_it(field, value):
    extra = {"score": "general"} if value in ("xla", "cudnn", "splash") else {}
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}"):
        _cfg(**{field: value, **extra})


def test_config_lists_valid_options_and_is_hashable():
    with pytest.raises(ValueError, match="'cls', 'max', 'mean', 'structured'"):
        _cfg(pooling="attention")
    cfg = _cfg(ngram_orders=[2, 3], ngram_buckets=5)  # a list from a ConfigDict is normalised
    assert cfg.ngram_orders == (2, 3)
    assert hash(cfg) == hash(_cfg(ngram_orders=(2, 3), ngram_buckets=5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 16


def test_encode_is_apply_before_pooling_and_embed_delta_shifts_the_embeddings():
    cfg = _cfg(pooling="mean", ngram_buckets=17)
    params = classifier.init(jax.random.key(0), cfg)
    h_BxLxD, _ = classifier.encode(params, TOKENS, cfg)
    mask_BxLx1 = (TOKENS != 0)[..., None]
    pooled_BxD = (h_BxLxD * mask_BxLx1).sum(1) / mask_BxLx1.sum(1)
    logits, _ = classifier.apply(params, TOKENS, cfg)
    assert_close32(
        pooled_BxD @ params["head"]["w"] + params["head"]["b"],
        logits,
        classifier_terms(cfg, TOKENS.shape[1]),
    )
    # A delta equal to minus the position embeddings is the same as having no positions.
    minus_pos = -params["embed"]["positions"][None, : TOKENS.shape[1]]
    minus_pos_BxLxD = jnp.broadcast_to(minus_pos, (*TOKENS.shape, cfg.d_model))
    shifted, _ = classifier.apply(params, TOKENS, cfg, embed_delta_BxLxD=minus_pos_BxLxD)
    no_pos = {**params, "embed": {k: v for k, v in params["embed"].items() if k != "positions"}}
    unpositioned, _ = classifier.apply(
        no_pos, TOKENS, _cfg(pooling="mean", ngram_buckets=17, positions="none")
    )
    assert_close32(shifted, unpositioned, classifier_terms(cfg, TOKENS.shape[1]))


def test_ids_outside_the_vocabulary_read_as_unk():
    cfg = _cfg(ngram_buckets=11)
    odd = TOKENS.at[0, 1].set(cfg.vocab_size).at[0, 3].set(-4).at[2, 7].set(10**6)
    unk = TOKENS.at[0, 1].set(classifier.UNK).at[0, 3].set(classifier.UNK)
    unk = unk.at[2, 7].set(classifier.UNK)
    params = classifier.init(jax.random.key(8), cfg)
    params["embed"]["ngrams"] = jax.random.normal(jax.random.key(9), (11, cfg.d_model))
    lo_odd, _ = classifier.apply(params, odd, cfg)
    lo_unk, _ = classifier.apply(params, unk, cfg)
    lo, _ = classifier.apply(params, TOKENS, cfg)
    assert_close32(lo_odd, lo_unk, classifier_terms(cfg, TOKENS.shape[1]))
    assert not np.allclose(lo_odd, lo, atol=1e-4)


def test_params_built_for_another_config_are_refused_by_name():
    params = classifier.init(jax.random.key(0), _cfg(d_model=16))
    with pytest.raises(ValueError, match=r"\['embed'\]\['tokens'\] has shape \(30, 16\), cfg"):
        classifier.apply(params, TOKENS, _cfg())
    with pytest.raises(ValueError, match=r"missing \['embed'\]\['ngrams'\]"):
        classifier.encode(classifier.init(jax.random.key(0), _cfg()), TOKENS, _cfg(ngram_buckets=5))
    with pytest.raises(ValueError, match=r"unexpected \['layer_1'\]"):
        jax.jit(classifier.apply, static_argnums=2)(
            classifier.init(jax.random.key(0), _cfg(num_layers=2)), TOKENS, _cfg()
        )


def test_attend_is_attention_with_the_config_fields():
    cfg = _cfg(score="additive", implementation="chunked", q_chunk=3, k_chunk=5)
    attend = classifier.attend(cfg)
    assert attend.func is attention
    assert attend.keywords == dict(score="additive", implementation="chunked", q_chunk=3, k_chunk=5)
    assert classifier.attend(dataclasses.replace(cfg)) is attend


@pytest.mark.parametrize("score", ["scaled_dot", "mlp"])
def test_attention_steps_are_the_model_own_values(score):
    cfg = _cfg(num_layers=2, score=score, ngram_buckets=7)
    params = classifier.init(jax.random.key(10), cfg)
    _, aux = classifier.apply(params, TOKENS, cfg)
    for b in (0, 2):
        for layer in (0, 1):
            st = classifier.attention_steps(params, TOKENS[b], cfg, layer=layer)
            assert_close32(
                st.weights_HxLxL, aux["attention"][layer][b], classifier_terms(cfg, TOKENS.shape[1])
            )
    # layer 1's X is LayerNorm1 of layer 0's output, which encode computes
    x_BxLxD = classifier.embed(params, TOKENS, cfg)
    y0, _ = encoder.apply(params["layer_0"], x_BxLxD[0], TOKENS[0] != 0, num_heads=cfg.num_heads,
                          attend=classifier.attend(cfg))  # fmt: skip
    st = classifier.attention_steps(params, TOKENS[0], cfg, layer=1)
    assert_close32(
        st.x_LxD,
        layers.layer_norm(params["layer_1"]["ln1"], y0),
        classifier_terms(cfg, TOKENS.shape[1]),
    )
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\); got 2"):
        classifier.attention_steps(params, TOKENS[0], cfg, layer=2)
    with pytest.raises(ValueError, match="one sequence of ids"):
        classifier.attention_steps(params, TOKENS, cfg)
