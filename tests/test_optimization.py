"""The train step's extras (weight average, adversarial perturbation) and the optimizer check.

The train step itself, with and without the adversarial loss, is in test_golden.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_close32, classifier_terms, tol32

from attn import classifier
from experiments.training import classify, metrics, optim

CFG = classifier.ModelConfig(vocab_size=20, d_model=8, num_heads=2, d_ff=16, max_len=6)
# Two examples, the first padded: [B=2, L=6].
BATCH = {
    "tokens": jnp.array([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]]),
    "label": jnp.array([0, 1]),
    "weight": jnp.ones(2),
}


def test_ema_is_the_normalised_decay_weighted_average_of_all_updates():
    decay, n = 0.9, 25
    ps = jax.random.normal(jax.random.PRNGKey(0), (n, 3, 2))
    ema = {"w": jnp.full((3, 2), 100.0)}  # the initial value must carry no weight
    for t in range(n):
        ema = optim._ema_update(ema, {"w": ps[t]}, jnp.asarray(t, jnp.int32), decay)
    w = decay ** np.arange(n - 1, -1, -1.0)
    expected = np.tensordot(w / w.sum(), np.asarray(ps), axes=1)
    assert_close32(ema["w"], expected, 2 * 25)
    # After the first update the bias-corrected average is the new params (up to rounding).
    first = optim._ema_update({"w": ps[1]}, {"w": ps[0]}, jnp.asarray(0, jnp.int32), decay)
    assert_close32(first["w"], ps[0], 2)


def test_adversarial_delta_has_norm_eps_per_example_along_the_gradient():
    g = jax.random.normal(jax.random.PRNGKey(1), (3, 5, 4))
    g = g.at[1].multiply(100.0)  # the scale of an example's gradient must not matter
    delta = classify._adversarial_delta(g, 2.5)
    assert_close32(jnp.sqrt((delta**2).sum(axis=(1, 2))), 2.5, 2 * 20)
    cos = (delta * g).sum(axis=(1, 2)) / jnp.sqrt((delta**2).sum((1, 2)) * (g**2).sum((1, 2)))
    assert_close32(cos, 1.0, 3 * 20)


def test_adversarial_delta_raises_the_loss_more_than_a_random_one():
    params = classifier.init(jax.random.PRNGKey(0), CFG)

    @jax.jit
    def loss(delta):
        kw = dict(label_smoothing=0.0, penalty_weight=0.0, train=False, rng=None)
        return classify.loss_and_metrics(params, BATCH, CFG, embed_delta_BxLxD=delta, **kw)[0]

    zero = jnp.zeros((2, 6, 8))
    adversarial = classify._adversarial_delta(jax.jit(jax.grad(loss))(zero), 0.5)
    random = classify._adversarial_delta(jax.random.normal(jax.random.PRNGKey(2), zero.shape), 0.5)
    assert loss(adversarial) > loss(random) and loss(adversarial) > loss(zero)
    # Padding gets no gradient, so no perturbation.
    assert float(jnp.abs(adversarial[0, 4:]).max()) == 0.0


def test_embedding_norm_counts_real_tokens_of_each_example():
    params = classifier.init(jax.random.PRNGKey(3), CFG)
    tokens = np.asarray(BATCH["tokens"])
    table, pos = np.asarray(params["embed"]["tokens"]), np.asarray(params["embed"]["positions"])
    expected = [
        np.sqrt(sum(np.sum((table[t] + pos[i]) ** 2) for i, t in enumerate(row) if t != 0))
        for row in tokens
    ]
    got = classify._embedding_norm(params, BATCH["tokens"], CFG)
    assert_close32(got, expected, 6 * 8)


def test_adversarial_delta_scales_each_example_by_its_own_factor():
    g = jax.random.normal(jax.random.PRNGKey(4), (2, 5, 4))
    delta = classify._adversarial_delta(g, 0.5, jnp.array([3.0, 10.0]))
    assert_close32(jnp.sqrt((delta**2).sum(axis=(1, 2))), [1.5, 5.0], 2 * 20)


def test_a_relative_eps_is_that_fraction_of_the_example_embedding_norm():
    # One example: relative eps r must give the very step of absolute eps r * ||x||.
    batch = {k: v[1:] for k, v in BATCH.items()}
    tx = optax.apply_if_finite(optax.sgd(0.1), 10)  # train_step reports its skip counts
    state = optim.init_state(jax.random.PRNGKey(5), CFG, tx)
    norm = float(classify._embedding_norm(state["params"], batch["tokens"], CFG)[0])
    kw = dict(cfg=CFG, tx=tx, label_smoothing=0.0, penalty_weight=0.0)
    rel, _ = classify.train_step(state, batch, adversarial_eps=0.3, adversarial_relative=True, **kw)
    ab, _ = classify.train_step(state, batch, adversarial_eps=0.3 * norm, **kw)
    small, _ = classify.train_step(state, batch, adversarial_eps=0.3, **kw)
    leaves = lambda s: jax.tree.leaves(s["params"])
    # The two steps differ by the rounding of a forward and a backward pass (times the SGD rate
    # of 0.1); an eps that is not r * ||x|| moves some parameter by more than that.
    terms = 2 * classifier_terms(CFG, 6)
    for a, b in zip(leaves(rel), leaves(ab), strict=True):
        assert_close32(a, b, terms)
    assert any(
        not np.allclose(a, b, atol=tol32(terms), rtol=0)
        for a, b in zip(leaves(rel), leaves(small), strict=True)
    )


@pytest.mark.parametrize(
    "accuracy, loss, best_accuracy, best_loss, want",
    [
        (0.8, 0.5, 0.7, 0.1, True),  # higher accuracy wins whatever the loss
        (0.6, 0.1, 0.7, 0.5, False),
        (0.8, 0.3, 0.8, 0.4, True),  # a tie goes to the lower loss
        (0.8, 0.4, 0.8, 0.4, False),
        (0.8, 0.5, 0.8, 0.4, False),
        (0.8, 0.3, 0.8, None, False),  # kept before losses were recorded: the first stays
        (0.9, float("nan"), 0.1, 0.4, False),  # a diverged model never becomes the best
        (0.1, 0.7, metrics.NO_BEST, None, True),
    ],
)
def test_the_kept_checkpoint_rule(accuracy, loss, best_accuracy, best_loss, want):
    assert metrics.improves({"accuracy": accuracy, "loss": loss}, best_accuracy, best_loss) is want
