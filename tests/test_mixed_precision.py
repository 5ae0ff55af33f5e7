"""`config.model.dtype="bfloat16"`: activations in bfloat16; params, optimizer state, attention
scores and softmax in float32; and a tiny training run that learns what float32 learns."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn import classifier
from configs import default
from experiments.training import classify, optim

VOCAB, LENGTH = 48, 24
POSITIVE, NEGATIVE = range(3, 13), range(13, 23)  # ids 23-47 carry no sentiment; 0-2 reserved


def _task(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Texts of 8-24 tokens labelled by whether they hold more positive than negative words,
    with 10% of the labels flipped: the best possible accuracy is 90%, so a model that learned
    the rule scores about 90% and one that did not stays near 50%."""
    rng = np.random.default_rng(seed)
    tokens, labels = np.zeros((n, LENGTH), np.int32), np.zeros(n, np.int32)
    i = 0
    while i < n:
        length = rng.integers(8, LENGTH + 1)
        text = rng.integers(3, VOCAB, length)
        pos, neg = np.isin(text, POSITIVE).sum(), np.isin(text, NEGATIVE).sum()
        if pos == neg:
            continue
        tokens[i, :length], labels[i] = text, int(pos > neg)
        i += 1
    flip = rng.random(n) < 0.1
    return tokens, np.where(flip, 1 - labels, labels).astype(np.int32)


def _config(dtype: str) -> tuple[classifier.ModelConfig, object]:
    config = default.get_config("tiny")
    cfg = classifier.ModelConfig(
        vocab_size=VOCAB,
        d_model=32,
        num_heads=2,
        d_ff=64,
        max_len=LENGTH,
        dropout=0.0,
        embed_dropout=0.0,
        dtype=dtype,
    )
    return cfg, config.optim


def _train(dtype: str, steps: int = 150, batch: int = 64):
    """The real train step (AdamW, warmup and cosine decay, the adversarial loss of the default
    config) on the same batches for either dtype -> (final state, per-step losses)."""
    cfg, o = _config(dtype)
    tx = optim.make_optimizer(o, steps)
    state = optim.init_state(jax.random.key(0), cfg, tx)
    step = jax.jit(
        functools.partial(classify.train_step, cfg=cfg, tx=tx, **classify.loss_options(o))
    )
    tokens, labels = _task(steps * batch, seed=1)
    losses = []
    for i in range(steps):
        rows = slice(i * batch, (i + 1) * batch)
        b = {"tokens": tokens[rows], "label": labels[rows], "weight": np.ones(batch, np.float32)}
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    return cfg, state, np.array(losses)


def _float_dtypes(tree) -> set[str]:
    return {str(x.dtype) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


@pytest.fixture(scope="module")
def runs() -> dict:
    return {dtype: _train(dtype) for dtype in ("float32", "bfloat16")}


def test_bfloat16_keeps_params_and_optimizer_state_in_float32(runs):
    cfg, state, _ = runs["bfloat16"]
    assert cfg.dtype == "bfloat16"
    assert _float_dtypes(state["params"]) == {"float32"}
    assert _float_dtypes(state["opt_state"]) == {"float32"}


def test_bfloat16_computes_activations_in_bfloat16_and_scores_softmax_in_float32():
    """In the traced forward pass: the [L, L] score matrices and every exp (the softmax's) are
    float32; the feed-forward layer's matmuls are bfloat16."""
    cfg, _ = _config("bfloat16")
    params = classifier.init(jax.random.key(0), cfg)
    tokens = jnp.asarray(_task(2, seed=0)[0])
    jaxpr = jax.make_jaxpr(lambda p: classifier.apply(p, tokens, cfg))(params)

    def equations(jx):
        for eqn in jx.eqns:
            yield eqn
            for sub in jax.core.jaxprs_in_params(eqn.params):
                yield from equations(sub)

    eqns = list(equations(jaxpr.jaxpr))
    dots = [e.outvars[0].aval for e in eqns if e.primitive.name == "dot_general"]
    scores = [a for a in dots if a.shape[-2:] == (LENGTH, LENGTH)]
    feed_forward = [a for a in dots if a.shape[-1] == cfg.d_ff]
    exps = [e.outvars[0].aval for e in eqns if e.primitive.name == "exp"]
    assert scores and all(a.dtype == jnp.float32 for a in scores)
    assert exps and all(a.dtype == jnp.float32 for a in exps)
    assert feed_forward and all(a.dtype == jnp.bfloat16 for a in feed_forward)
    logits, aux = classifier.apply(params, tokens, cfg)
    assert logits.dtype == jnp.float32 and aux["attention"][0].dtype == jnp.float32


def test_bfloat16_training_learns_what_float32_learns(runs):
    tokens, labels = _task(2000, seed=2)
    accuracy = {}
    for dtype, (cfg, state, losses) in runs.items():
        assert np.isfinite(losses).all(), dtype
        logits, _ = jax.jit(functools.partial(classifier.apply, cfg=cfg))(state["params"], tokens)
        accuracy[dtype] = float((np.asarray(logits).argmax(-1) == labels).mean())
    # Far above chance and near the 90% that the flipped labels allow: the rule was learned.
    assert 0.85 <= accuracy["float32"] <= 0.93, accuracy
    assert abs(accuracy["bfloat16"] - accuracy["float32"]) <= 0.01, accuracy
