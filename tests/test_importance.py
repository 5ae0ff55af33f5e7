"""Token importance and erasure: on hand-built models whose prediction rests on one known token,
each method finds it when it can; leave-one-out and the erasure drops against per-text loops;
erasing really removes a token's n-grams and bag features; rollout, gradient and padding checks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close32, classifier_terms

from attn import bag as bag_lib
from attn import classifier, importance
from attn.classifier import PAD, ModelConfig

KEY, DECOY = 5, 6  # the token the prediction rests on, and one attention may go to instead
D = 8
HAND = ModelConfig(
    vocab_size=8,
    d_model=D,
    num_heads=1,
    num_layers=1,
    d_ff=4,
    positions="none",
    pooling="mean",
    dropout=0.0,
    embed_dropout=0.0,
)
TEXTS = jnp.array(
    [[3, 4, KEY, 6, 7, 3, 0, 0], [KEY, 7, 6, 4, 0, 0, 0, 0], [4, 6, 3, 7, KEY, 4, 3, 0]],
    jnp.int32,
)


def _normalised(t: int) -> np.ndarray:
    """LayerNorm (scale 1, bias 0) of the one-hot embedding of token t."""
    e = np.eye(D)[t]
    return (e - e.mean()) / e.std()


def hand_built(route: str) -> dict:
    """Every query attends to one token: KEY when route == "attention" (its value then carries the
    evidence into every position), DECOY when route == "residual" (attention carries nothing). In
    both, KEY's embedding also writes the evidence (channel 0) into its own residual stream, which
    the head reads after mean pooling; the other tokens write nothing there."""
    p = jax.tree.map(
        lambda x: np.zeros(x.shape, np.float32), classifier.init(jax.random.key(0), HAND)
    )
    tok = np.zeros((8, D), np.float32)
    for t in range(3, 8):
        tok[t, t] = 1.0  # one-hot: after LayerNorm, token t is _normalised(t)
    tok[KEY, 0] = 4.0
    p["embed"]["tokens"] = tok
    layer = p["layer_0"]
    for ln in (layer["ln1"], layer["ln2"], p["final_ln"]):
        ln["scale"] = np.ones(D, np.float32)
    target = KEY if route == "attention" else DECOY
    channel = np.eye(D)[0]
    layer["mha"]["q"]["b"] = 40.0 * channel.astype(np.float32)  # one query for every position
    layer["mha"]["k"]["w"] = (np.outer(_normalised(target), channel) / D).astype(np.float32)
    if route == "attention":
        layer["mha"]["v"]["w"] = (2 * np.outer(_normalised(KEY), channel) / D).astype(np.float32)
        layer["mha"]["o"]["w"] = np.eye(D, dtype=np.float32)
    # A constant the feed-forward adds: LayerNorm is then no longer blind to a token's scale.
    layer["ff2"]["b"] = np.array([0, -0.5, 0.5, 0, 0, 0, 0, 0], np.float32)
    p["head"]["w"][0, 1] = 10.0
    return jax.tree.map(jnp.asarray, p)


METHODS = {
    "attention": importance.attention,
    "rollout": importance.rollout,
    "gradient": importance.gradient,
    "leave_one_out": importance.leave_one_out,
}


def _top_token(method: str, params: dict) -> list[int]:
    scores_BxL = jax.jit(METHODS[method], static_argnames="cfg")(params, TEXTS, cfg=HAND)
    s = np.where(np.asarray(TEXTS) != PAD, np.asarray(scores_BxL), -np.inf)
    return [int(TEXTS[b, s[b].argmax()]) for b in range(len(TEXTS))]


def test_the_hand_built_models_predict_from_the_key_token():
    for route in ("attention", "residual"):
        params = hand_built(route)
        c_B, p_B = importance.predicted(params, TEXTS, HAND)
        assert (np.asarray(c_B) == 1).all() and (np.asarray(p_B) > 0.6).all(), (route, p_B)
        without_key = jnp.where(TEXTS == KEY, PAD, TEXTS)
        assert (np.asarray(importance.probabilities(params, without_key, HAND))[:, 1] < 0.5).all()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_ranks_the_token_attention_routes_through_first(method):
    assert _top_token(method, hand_built("attention")) == [KEY] * len(TEXTS)


@pytest.mark.parametrize("method", ["leave_one_out", "gradient"])
def test_leave_one_out_and_gradient_find_the_token_attention_looks_past(method):
    assert _top_token(method, hand_built("residual")) == [KEY] * len(TEXTS)


@pytest.mark.parametrize("method", ["attention", "rollout"])
def test_attention_points_elsewhere_when_the_model_reads_past_it(method):
    # The failure the erasure tests exist to catch: the map is sharp, and wrong.
    assert _top_token(method, hand_built("residual")) == [DECOY] * len(TEXTS)


def test_comprehensiveness_of_the_key_token_is_the_whole_drop():
    params = hand_built("attention")
    candidates = TEXTS != PAD
    loo = importance.leave_one_out(params, TEXTS, HAND)
    comp, suff = importance.erasure_drops(params, TEXTS, loo, candidates, HAND, percents=(1, 100))
    _, p_B = importance.predicted(params, TEXTS, HAND)
    key_drop = np.asarray(loo)[np.asarray(TEXTS) == KEY]
    assert_close32(comp[:, 0], key_drop, classifier_terms(HAND, 8))  # 1% of a text: one token
    # Keeping every token changes nothing.
    assert_close32(suff[:, 1], 0.0, classifier_terms(HAND, 8))
    uniform = importance.probabilities(params, jnp.zeros_like(TEXTS), HAND)[:, 1]
    assert_close32(comp[:, 1], p_B - uniform, classifier_terms(HAND, 8))  # everything erased
    assert (np.asarray(comp[:, 0]) > 0.5).all()


# A model with every feature erasure must remove: hashed n-gram embeddings and a bag reading a
# longer cut of the text, learned positions, CLS pooling.
RICH = ModelConfig(
    vocab_size=12,
    d_model=8,
    num_heads=2,
    num_layers=2,
    d_ff=16,
    pooling="cls",
    ngram_buckets=64,
    bag_buckets=32,
    dropout=0.0,
    embed_dropout=0.0,
)


# A probability or logit of RICH on `_rich_batch` (6 tokens, the bag's 10 and their bigrams).
RICH_TERMS = classifier_terms(RICH, 6) + 2 * 10


def _random_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """init, with the tables init leaves at zero (n-grams, bag) filled too."""
    params = classifier.init(jax.random.key(seed), cfg)
    k1, k2 = jax.random.split(jax.random.key(seed + 1))
    if cfg.ngram_buckets:
        params["embed"]["ngrams"] = jax.random.normal(k1, params["embed"]["ngrams"].shape)
    if cfg.bag_buckets:
        params["bag"] = jax.random.normal(k2, params["bag"].shape)
    return params


def _rich_batch() -> tuple[jax.Array, importance.Bag]:
    """Two texts; the second is cut for attention (6 of its 9 tokens: CLS and 3 from the start,
    2 from the end) while the bag reads all of it."""
    tokens = np.array([[2, 3, 4, 5, 0, 0], [2, 6, 7, 8, 10, 11]], np.int32)
    bag_tokens = np.array([[2, 3, 4, 5, 0, 0, 0, 0, 0, 0], [2, 6, 7, 8, 9, 3, 9, 10, 11, 0]])
    source = np.array([[0, 1, 2, 3, -1, -1, -1, -1, -1, -1], [0, 1, 2, 3, -1, -1, -1, 4, 5, -1]])
    return jnp.asarray(tokens), importance.Bag(jnp.asarray(bag_tokens, jnp.int32), source)


_apply = jax.jit(classifier.apply, static_argnames="cfg")  # compiled once per shape: fast loops


def _one(params, tokens_L, bag_G, cfg) -> np.ndarray:
    """The model's probabilities of one text, straight from classifier.apply."""
    logits, _ = _apply(
        params, jnp.asarray(tokens_L)[None], cfg=cfg, bag_tokens_BxG=jnp.asarray(bag_G)[None]
    )
    return np.asarray(jax.nn.softmax(logits)[0])


@pytest.mark.parametrize("chunk", [None, 4])  # all 6 positions at once; 4, then the other 2
def test_leave_one_out_matches_a_per_text_loop(chunk):
    params = _random_params(RICH)
    tokens, bag = _rich_batch()
    loo = jax.jit(importance.leave_one_out, static_argnames=("cfg", "chunk"))(
        params, tokens, RICH, bag, chunk=chunk
    )
    for b in range(len(tokens)):
        t_L, m_G, src_G = (np.asarray(a[b]) for a in (tokens, bag.tokens_BxG, bag.source_BxG))
        p_C = _one(params, t_L, m_G, RICH)
        c = p_C.argmax()
        for pos in range(len(t_L)):
            if t_L[pos] == PAD:
                assert loo[b, pos] == 0.0
                continue
            erased_t, erased_m = t_L.copy(), m_G.copy()
            erased_t[pos] = PAD
            erased_m[src_G == pos] = PAD
            want = p_C[c] - _one(params, erased_t, erased_m, RICH)[c]
            assert_close32(loo[b, pos], want, RICH_TERMS)


def test_erasure_drops_match_erasing_by_hand():
    params = _random_params(RICH)
    tokens, bag = _rich_batch()
    candidates = (tokens != PAD) & (tokens != 2)  # CLS is never ranked
    scores = jax.random.normal(jax.random.key(3), tokens.shape)
    percents = (20, 50, 100)
    drops = jax.jit(importance.erasure_drops, static_argnums=4, static_argnames="percents")
    comp, suff = drops(params, tokens, scores, candidates, RICH, percents=percents, bag=bag)
    for b in range(len(tokens)):
        t_L, m_G, src_G = (np.asarray(a[b]) for a in (tokens, bag.tokens_BxG, bag.source_BxG))
        p_C = _one(params, t_L, m_G, RICH)
        c = p_C.argmax()
        cand = np.flatnonzero(np.asarray(candidates[b]))
        ranked = cand[np.argsort(-np.asarray(scores[b])[cand], kind="stable")]
        for j, pct in enumerate(percents):
            top = ranked[: -(-pct * len(cand) // 100)]
            gone_t, gone_m = t_L.copy(), m_G.copy()
            gone_t[top] = PAD
            gone_m[np.isin(src_G, top)] = PAD
            assert_close32(comp[b, j], p_C[c] - _one(params, gone_t, gone_m, RICH)[c], RICH_TERMS)
            rest = np.setdiff1d(cand, top)
            only_t, only_m = t_L.copy(), m_G.copy()
            only_t[rest] = PAD
            only_m[np.isin(src_G, rest) | ((src_G < 0) & (m_G != PAD) & (m_G != 2))] = PAD
            assert_close32(suff[b, j], p_C[c] - _one(params, only_t, only_m, RICH)[c], RICH_TERMS)


def test_erasing_removes_the_tokens_ngrams_and_bag_features():
    cfg = ModelConfig(
        vocab_size=12,
        d_model=4,
        num_heads=1,
        num_layers=0,
        positions="none",
        ngram_buckets=1 << 16,  # so that no other n-gram of the texts shares a bucket
        ngram_orders=(2,),
        bag_buckets=1 << 16,
        bag_orders=(1, 2),
    )
    tokens, bag = _rich_batch()
    keep = jnp.ones(tokens.shape, bool).at[1, 3].set(False)  # token 8 of text 2
    erased, erased_bag = importance.erase(tokens, keep, bag, keep_outside=True)
    assert erased[1, 3] == PAD and (erased[0] == tokens[0]).all()
    assert erased_bag.tokens_BxG[1, 3] == PAD  # the bag's copy of it too, and only it
    assert (erased_bag.tokens_BxG[1, 4:] == bag.tokens_BxG[1, 4:]).all()
    # No n-gram the erased text's model reads contains token 8: its bigrams and unigram are gone.
    ids = np.asarray(classifier.ngram_buckets(erased, cfg.ngram_orders, cfg.ngram_buckets))
    with_8 = classifier.ngram_buckets(jnp.array([[7, 8, 9]]), (2,), 1 << 16)[0, 0, 1:]
    assert not np.isin(np.asarray(with_8), ids[0, 1][np.asarray(erased[1]) != PAD]).any()
    feats = bag_lib.weights(
        classifier.bag_ids(erased_bag.tokens_BxG, cfg), erased_bag.tokens_BxG != PAD
    )
    present = set(np.asarray(feats[0])[:, 1][np.asarray(feats[1])[:, 1] > 0].ravel().tolist())
    gone = classifier.bag_ids(jnp.array([[7, 8, 9]]), cfg)[:, 0]  # unigram 8, bigrams 7-8, 8-9
    assert {int(gone[0, 1]), int(gone[1, 1]), int(gone[1, 2])}.isdisjoint(present)
    # The model reads exactly what a text without the token gives (positions none, no n-gram
    # crossing the gap): erasing is removing, not replacing.
    params = _random_params(cfg)
    p = importance.probabilities(params, erased, cfg, erased_bag)[1]
    assert not np.allclose(p, importance.probabilities(params, tokens, cfg, bag)[1], atol=1e-4)
    unk = importance.probabilities(
        params, tokens.at[1, 3].set(1), cfg, bag._replace(tokens_BxG=bag.tokens_BxG.at[1, 3].set(1))
    )[1]
    assert not np.allclose(p, unk, atol=1e-4)  # UNK is a token the model reads


def test_erasing_equals_deleting_when_nothing_reads_order():
    # No positions, no n-grams: a PAD hole and a deleted token are the same text to the model.
    cfg = ModelConfig(vocab_size=12, d_model=8, num_heads=2, num_layers=2, positions="none")
    params = _random_params(cfg)
    tokens = jnp.array([[3, 9, 4, 11, 5, 6]], jnp.int32)
    keep = jnp.array([[True, False, True, False, True, True]])
    erased, _ = importance.erase(tokens, keep, keep_outside=True)
    deleted = jnp.array([[3, 4, 5, 6]], jnp.int32)
    assert_close32(
        importance.probabilities(params, erased, cfg),
        importance.probabilities(params, deleted, cfg),
        classifier_terms(cfg, 6),
    )


def test_top_k_takes_the_highest_candidates_and_counts_round_up():
    scores = jnp.array([[0.5, 0.9, 0.9, 0.1, 3.0, 0.2]])
    candidates = jnp.array([[True, True, True, True, False, True]])  # 3.0 is CLS, say
    top = importance.top_k(scores, candidates, jnp.array([2]))
    assert np.asarray(top).tolist() == [[False, True, True, False, False, False]]
    top = importance.top_k(scores, candidates, jnp.array([1]))  # a tie: the earlier one
    assert np.asarray(top).tolist() == [[False, True, False, False, False, False]]
    lengths = np.array([48, 10, 7, 1, 0])
    cand = jnp.arange(48)[None, :] < jnp.asarray(lengths)[:, None]
    counts = importance.top_counts(cand, (1, 2, 5, 10, 20))
    assert np.asarray(counts).T.tolist() == [
        [1, 1, 3, 5, 10],
        [1, 1, 1, 1, 2],
        [1, 1, 1, 1, 2],
        [1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0],
    ]


def test_rollout_of_one_layer_is_half_attention_half_identity():
    cfg = ModelConfig(vocab_size=12, d_model=8, num_heads=2, num_layers=1)
    params = _random_params(cfg)
    tokens = jnp.array([[3, 4, 5, 6, 0], [7, 8, 9, 10, 11]], jnp.int32)
    n = np.asarray((tokens != PAD).sum(1))[:, None]
    want = 0.5 * importance.attention(params, tokens, cfg) + 0.5 / n * (tokens != PAD)
    assert_close32(importance.rollout(params, tokens, cfg), want, classifier_terms(cfg, 5))


def test_rollout_of_two_layers_against_a_loop():
    cfg = ModelConfig(vocab_size=12, d_model=8, num_heads=2, num_layers=2, pooling="cls")
    params = _random_params(cfg)
    tokens = jnp.array([[2, 3, 4, 5, 6, 0]], jnp.int32)
    _, aux = classifier.apply(params, tokens, cfg)
    r = np.eye(6)
    for w in aux["attention"]:
        a = 0.5 * np.asarray(w[0]).mean(0) + 0.5 * np.eye(6)
        r = (a / a.sum(1, keepdims=True)) @ r
    want = np.where(np.asarray(tokens[0]) != PAD, r[0], 0.0)  # cls: the CLS row
    assert_close32(importance.rollout(params, tokens, cfg)[0], want, classifier_terms(cfg, 6))


def test_gradient_times_input_is_the_derivative_of_scaling_a_token():
    cfg = RICH
    params = _random_params(cfg)
    tokens, bag = _rich_batch()
    g = importance.gradient(params, tokens, cfg, bag)
    c_B, _ = importance.predicted(params, tokens, cfg, bag)
    x = classifier.embed(params, tokens, cfg)

    def log_p(b: int, pos: int, eps: float) -> float:  # token pos of text b scaled by 1 + eps
        delta = jnp.zeros_like(x).at[b, pos].set(eps * x[b, pos])
        logits, _ = _apply(
            params, tokens, cfg=cfg, embed_delta_BxLxD=delta, bag_tokens_BxG=bag.tokens_BxG
        )
        return float(jax.nn.log_softmax(logits)[b, c_B[b]])

    eps = 1e-3
    for b, pos in ((0, 1), (0, 3), (1, 0), (1, 5)):
        fd = (log_p(b, pos, eps) - log_p(b, pos, -eps)) / (2 * eps)
        # Not a float32 bound: a central difference at 1e-3 truncates by about 1e-6 relative,
        # but rounds by the two log-probabilities' float32 error over 2e-3, whose worst case
        # (`conftest.tol32` of the model's sums / 2e-3 = 0.08) exceeds the gradients here. Inputs
        # this close round alike in practice; 2% (1e-4 near zero) is a margin, not a bound.
        np.testing.assert_allclose(g[b, pos], fd, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_scores_do_not_change_with_padding(method):
    cfg = dataclasses.replace(RICH, bag_buckets=0)
    params = _random_params(cfg)
    text = jnp.array([[2, 3, 4, 5, 6]], jnp.int32)
    padded = jnp.pad(text, ((0, 0), (0, 3)))
    fn = jax.jit(METHODS[method], static_argnames="cfg")
    short, long = fn(params, text, cfg=cfg), fn(params, padded, cfg=cfg)
    assert_close32(long[:, :5], short, classifier_terms(cfg, 8))
    assert (long[:, 5:] == 0).all()


def test_random_scores_only_real_tokens():
    tokens = jnp.array([[3, 4, 0, 0]], jnp.int32)
    s = importance.random(jax.random.key(0), tokens)
    assert (s[0, :2] > 0).all() and (s[0, 2:] == 0).all()
    assert not np.allclose(s, importance.random(jax.random.key(1), tokens))


def test_a_model_without_attention_has_no_attention_scores():
    cfg = ModelConfig(vocab_size=12, d_model=8, num_heads=2, num_layers=0)
    params = _random_params(cfg)
    tokens = jnp.array([[3, 4, 5]], jnp.int32)
    assert not importance.has_attention(cfg)
    for fn in (importance.attention, importance.rollout):
        with pytest.raises(ValueError, match="num_layers=0"):
            fn(params, tokens, cfg)
    assert importance.leave_one_out(params, tokens, cfg).shape == (1, 3)  # the rest still works
    # Structured pooling attends without an encoder layer: its weights are the attention.
    cfg = dataclasses.replace(cfg, pooling="structured")
    params = _random_params(cfg)
    assert importance.has_attention(cfg)
    _, aux = classifier.apply(params, tokens, cfg)
    assert_close32(
        importance.attention(params, tokens, cfg),
        aux["pool_weights"].mean(1),
        classifier_terms(cfg, 3),
    )
    with pytest.raises(ValueError, match="num_layers=0"):
        importance.rollout(params, tokens, cfg)


def test_chunked_models_get_the_matrix_form_weights():
    cfg = ModelConfig(vocab_size=12, d_model=8, num_heads=2, implementation="chunked", q_chunk=2)
    params = _random_params(cfg)
    tokens = jnp.array([[3, 4, 5, 6]], jnp.int32)
    want = importance.attention(params, tokens, dataclasses.replace(cfg, implementation="matrix"))
    assert_close32(importance.attention(params, tokens, cfg), want, classifier_terms(cfg, 4))


def test_logit_halves_are_the_encoder_and_the_bag():
    params = _random_params(RICH)
    tokens, bag = _rich_batch()
    encoder, added = importance.logit_halves(params, tokens, RICH, bag)
    logits, _ = classifier.apply(params, tokens, RICH, bag_tokens_BxG=bag.tokens_BxG)
    assert_close32(encoder + added, logits, RICH_TERMS)
    read = bag.tokens_BxG
    want = bag_lib.logits(params["bag"], classifier.bag_ids(read, RICH), read != PAD)
    assert_close32(added, want, RICH_TERMS)
    with pytest.raises(ValueError, match="no bag"):
        importance.logit_halves(params, tokens, dataclasses.replace(RICH, bag_buckets=0))


def test_scaling_a_tokens_input_moves_only_its_own_position_in_one_layer():
    # The one layer is pre-LayerNorm: the other positions read token j through LayerNorm(x_j),
    # which is blind to the scale of x_j. Gradient × input (the derivative of scaling x_j) so sees
    # only position j's own stream, never what attention carries from j to the other tokens.
    cfg = ModelConfig(vocab_size=12, d_model=8, num_heads=2, num_layers=1, ngram_buckets=64)
    params = _random_params(cfg)
    tokens = jnp.array([[3, 4, 5, 6, 7]], jnp.int32)
    x = classifier.embed(params, tokens, cfg)
    h, _ = classifier.encode(params, tokens, cfg)
    scaled, _ = classifier.encode(
        params, tokens, cfg, embed_delta_BxLxD=jnp.zeros_like(x).at[0, 2].set(0.5 * x[0, 2])
    )
    others = np.array([0, 1, 3, 4])
    assert_close32(scaled[0, others], h[0, others], classifier_terms(cfg, 5))
    assert not np.allclose(scaled[0, 2], h[0, 2], atol=1e-2)
