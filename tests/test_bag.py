"""The bag-of-n-grams linear path: values against a plain-Python reference, invariances, dropout,
and how the classifier adds it to its logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close32, classifier_terms

from attn import bag, classifier
from attn.classifier import ModelConfig

# Jitted: op by op, one classifier forward and its gradient compiled ~330 small programs.
_apply = jax.jit(classifier.apply, static_argnums=2, static_argnames="train")


def _reference(table_VxC, ids_OxBxL, real_BxL) -> np.ndarray:
    """Per row: the set of distinct ids of each order at real positions, summed and normalised."""
    n_orders, batch, _ = ids_OxBxL.shape
    out = np.zeros((batch, table_VxC.shape[1]))
    for b in range(batch):
        distinct = [
            {int(i) for i, r in zip(ids_OxBxL[n, b], real_BxL[b], strict=True) if r}
            for n in range(n_orders)
        ]
        count = sum(len(d) for d in distinct)
        for d in distinct:
            for i in d:
                out[b] += table_VxC[i] / np.sqrt(max(count, 1))
    return out


def _inputs(seed=0, n=2, batch=5, length=12, vocab=7, classes=3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (n, batch, length))  # few ids: many repeats
    lengths = np.array([12, 7, 1, 0, 4])[:batch]
    real = np.arange(length)[None] < lengths[:, None]
    table = rng.normal(size=(vocab, classes)).astype(np.float32)
    return table, ids, real


def test_logits_match_the_reference():
    table, ids, real = _inputs()
    got = jax.jit(bag.logits)(table, ids, real)
    assert_close32(got, _reference(table, ids, real), 2 * 12)
    assert np.all(np.asarray(got)[3] == 0.0)  # an empty row has an empty bag


def test_order_and_padding_length_do_not_matter():
    table, ids, real = _inputs()
    perm = np.random.default_rng(1).permutation(7)  # reorder the 7 real tokens of row 1
    shuffled = ids.copy()
    shuffled[:, 1, :7] = ids[:, 1, perm]
    assert_close32(bag.logits(table, shuffled, real)[1], bag.logits(table, ids, real)[1], 2 * 12)
    padded_ids = np.concatenate([ids, np.full(ids.shape[:2] + (5,), 3)], -1)
    padded_real = np.concatenate([real, np.zeros(real.shape[:1] + (5,), bool)], -1)
    assert_close32(bag.logits(table, padded_ids, padded_real), bag.logits(table, ids, real), 2 * 12)


def test_dropout_only_in_training_and_unbiased():
    table, ids, real = _inputs()
    key = jax.random.key(0)
    plain = bag.logits(table, ids, real)
    np.testing.assert_array_equal(bag.logits(table, ids, real, dropout=0.5, rng=key), plain)
    keys = jax.random.split(key, 4000)
    drop = jax.vmap(lambda k: bag.logits(table, ids, real, dropout=0.5, train=True, rng=k))(keys)
    assert not np.allclose(drop[0], plain)
    # Inverted dropout: the mean over many masks is the undropped bag. Statistical, not float32:
    # a dropped logit's standard deviation is about the RMS of its (unit-normal) table rows, 1,
    # so the mean of 4000 has a standard error of 1 / sqrt(4000) = 0.016; 0.06 is four of them.
    np.testing.assert_allclose(drop.mean(0), plain, atol=0.06)


def test_classifier_adds_the_bag_to_its_logits():
    kw = dict(vocab_size=30, d_model=8, num_heads=2, d_ff=16, max_len=16, num_classes=3)
    cfg, plain_cfg = ModelConfig(**kw, bag_buckets=64, bag_orders=(1, 2)), ModelConfig(**kw)
    tokens = jnp.array([[5, 9, 7, 11, 0, 0], [4, 4, 4, 0, 0, 0], [8, 3, 3, 6, 12, 13]])
    params = classifier.init(jax.random.key(0), cfg)
    assert params["bag"].shape == (64, 3) and not params["bag"].any()
    rest = {k: v for k, v in params.items() if k != "bag"}
    params["bag"] = jax.random.normal(jax.random.key(1), (64, 3))
    got, _ = _apply(params, tokens, cfg)
    without, _ = _apply(rest, tokens, plain_cfg)
    ids = classifier.ngram_buckets(tokens, (1, 2), 64)
    want = without + bag.logits(params["bag"], ids, tokens != classifier.PAD)
    assert_close32(got, want, classifier_terms(cfg, 6) + 2 * 6)

    # Only the buckets of the text's n-grams get a gradient.
    g = jax.jit(jax.grad(lambda p: _apply(p, tokens[1:2], cfg)[0].sum()))(params)["bag"]
    touched = set(np.flatnonzero(np.abs(np.asarray(g)).sum(1)).tolist())
    assert touched == set(np.unique(ids[:, 1, :3]).tolist())


def test_the_bag_reads_bag_tokens_when_given():
    """bag_tokens_BxG (more of each text) replaces the tokens in the bag, and only there."""
    kw = dict(vocab_size=30, d_model=8, num_heads=2, d_ff=16, max_len=16, num_classes=2)
    cfg = ModelConfig(**kw, bag_buckets=64, bag_orders=(1, 2))
    tokens = jnp.array([[5, 9, 7, 11, 0, 0], [4, 4, 4, 0, 0, 0]])
    longer = jnp.array([[5, 9, 20, 21, 22, 7, 11, 0], [4, 4, 4, 0, 0, 0, 0, 0]])
    params = classifier.init(jax.random.key(0), cfg)
    params["bag"] = jax.random.normal(jax.random.key(1), (64, 2))
    plain, _ = _apply(params, tokens, cfg)
    same, _ = _apply(params, tokens, cfg, bag_tokens_BxG=tokens)
    np.testing.assert_array_equal(same, plain)
    got, _ = _apply(params, tokens, cfg, bag_tokens_BxG=longer)
    bag_of = lambda t: bag.logits(params["bag"], classifier.ngram_buckets(t, (1, 2), 64), t != 0)
    assert_close32(got - plain, bag_of(longer) - bag_of(tokens), classifier_terms(cfg, 8) + 2 * 8)
    assert not np.allclose(got[0], plain[0])  # row 0 reads 3 more tokens
    assert_close32(got[1], plain[1], classifier_terms(cfg, 6) + 2 * 8)  # row 1 fits: the same bag


def test_without_the_bag_the_random_streams_are_unchanged():
    """Adding the bag fields must not move any existing config's dropout masks."""
    kw = dict(vocab_size=30, d_model=8, num_heads=2, d_ff=16, max_len=16, dropout=0.5)
    tokens = jnp.array([[5, 9, 7, 11, 0, 0]])
    cfg = ModelConfig(**kw, bag_buckets=16, bag_dropout=0.0)
    params = classifier.init(jax.random.key(0), cfg)
    plain = {k: v for k, v in params.items() if k != "bag"}
    key = jax.random.key(3)
    a, _ = _apply(params, tokens, cfg, train=True, rng=key)
    b, _ = _apply(plain, tokens, ModelConfig(**kw), train=True, rng=key)
    assert_close32(a, b, classifier_terms(cfg, 6))  # the bag table is zero, so only dropout differs


@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(bag_buckets=8, bag_orders=()), "bag_orders must be a non-empty tuple"),
        (dict(bag_orders=(1, 1)), "bag_orders"),
        (dict(bag_buckets=-1), "bag_buckets must be an integer >= 0"),
        (dict(bag_dropout=1.0), "bag_dropout must be a float in [0, 1)"),
    ],
)
def test_bad_bag_fields_are_named(kw, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace(")", r"\)")):
        ModelConfig(vocab_size=30, **kw)


def test_a_checkpoint_from_before_the_bag_fields_still_resumes():
    from experiments.training import checkpoints

    cfg = ModelConfig(vocab_size=30)
    meta = checkpoints.new_meta(cfg, ("neg", "pos"), ema=False)
    old = {**meta, "model": {k: v for k, v in meta["model"].items() if not k.startswith("bag_")}}
    assert checkpoints._run_fields(old) == checkpoints._run_fields(meta)
    other = checkpoints.new_meta(
        ModelConfig(vocab_size=30, bag_buckets=8), ("neg", "pos"), ema=False
    )
    assert checkpoints._run_fields(old) != checkpoints._run_fields(other)


def _count_reference(ids_OxBxL, real_BxL, labels_B, weight_B, buckets, classes) -> np.ndarray:
    """Per row of weight 1: each distinct id of each order at real positions adds one document."""
    out = np.zeros((buckets, classes))
    for n in range(ids_OxBxL.shape[0]):
        for b in range(ids_OxBxL.shape[1]):
            if weight_B[b]:
                for i in {int(i) for i, r in zip(ids_OxBxL[n, b], real_BxL[b], strict=True) if r}:
                    out[i, labels_B[b]] += 1
    return out


def test_document_counts_match_the_reference():
    _, ids, real = _inputs()
    labels, weight = np.array([0, 2, 1, 0, 2]), np.array([1.0, 1.0, 1.0, 1.0, 0.0])
    got = jax.jit(bag.document_counts, static_argnames=("buckets", "num_classes"))(
        ids, real, labels, weight, buckets=7, num_classes=3
    )
    want = _count_reference(ids, real, labels, weight, 7, 3)
    np.testing.assert_array_equal(got, want)
    assert want[:, 2].sum() > 0  # row 1 (class 2) counts; row 4 (class 2, weight 0) does not
    assert want.sum() > 0


def test_naive_bayes_table_is_the_centred_log_count_ratio():
    counts = np.array([[9.0, 1.0], [2.0, 2.0], [0.0, 0.0], [0.0, 5.0]])
    got = np.asarray(bag.naive_bayes_table(counts, alpha=1.0))
    p = (counts + 1) / (counts + 1).sum(0)
    r = np.log(p[:, 1] / p[:, 0])  # Wang & Manning's log-count ratio, positive = class 1
    assert_close32(got[[0, 1, 3]], np.stack([-r, r], 1)[[0, 1, 3]] / 2, 4)
    assert got[0, 0] > got[0, 1] and got[3, 1] > got[3, 0]
    np.testing.assert_array_equal(got[2], [0.0, 0.0])  # never seen: no vote either way
