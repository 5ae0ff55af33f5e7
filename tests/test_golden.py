"""One train step on a fixed batch gives recorded numbers: a silent model change fails here.

The values were recorded from the code as it was when this test was added: a tiny model with
hashed n-grams and dropout on, the default config's optimizer settings (without warmup, which
would make the first update zero) and its adversarial loss, all written out below. If a change is
meant to alter the model, the loss or the optimizer, re-record them and say why in the commit.
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import classifier_terms, tol32

from attn import classifier
from experiments.training import classify, optim

CFG = classifier.ModelConfig(
    vocab_size=40,
    num_classes=2,
    max_len=8,
    d_model=16,
    num_heads=2,
    d_ff=32,
    ngram_buckets=64,
    ngram_orders=(2, 3),
    dropout=0.15,
    embed_dropout=0.15,
)
OPTIM = ml_collections.ConfigDict(
    {
        "learning_rate": 5e-3,
        "warmup_steps": 0,
        "weight_decay": 0.1,
        "clip_norm": 1.0,
        "label_smoothing": 0.0,
        "adversarial_eps": 2.0,
        "adversarial_relative": False,
        "ema_decay": 0.0,
        "penalty_weight": 0.1,
    }
)
# Re-recorded when dropout's masks became attn.layers.keep_mask's 16-bit draws.
LOSS, GRAD_NORM = 0.4449106752872467, 4.828751564025879
PARAM_NORM = 27.86347007751465  # of the new params, summed in float64
# Another CPU or XLA may round the same step otherwise, within `conftest.tol32`: the loss passes
# through a forward's sums, the gradients through a backward's too, and the gradient norm sums
# every parameter's square in float32. Each new parameter is its init plus one Adam step (the
# clipped gradient's sign times the learning rate), a few float32 operations on it.
TERMS = classifier_terms(CFG, 8)


def _batch() -> dict:
    """[B=4, L=8]: two rows padded, the last row a filler (weight 0)."""
    tokens = (np.arange(32).reshape(4, 8) * 7 % 37 + 3).astype(np.int32)
    tokens[1, 5:] = 0
    tokens[3, 2:] = 0
    return {
        "tokens": jnp.asarray(tokens),
        "mask": jnp.asarray(tokens != 0),
        "label": jnp.array([0, 1, 1, 0], jnp.int32),
        "weight": jnp.array([1, 1, 1, 0], jnp.float32),
    }


TX = optim.make_optimizer(OPTIM, total_steps=100)
STATE = optim.init_state(jax.random.PRNGKey(0), CFG, TX)


@functools.cache
def _step(adversarial_eps: float):
    options = {**classify.loss_options(OPTIM), "adversarial_eps": adversarial_eps}
    return jax.jit(functools.partial(classify.train_step, cfg=CFG, tx=TX, **options))


def test_one_train_step_gives_the_recorded_loss_and_gradient_norm():
    new, m = _step(OPTIM.adversarial_eps)(STATE, _batch())
    assert float(m["loss"]) == pytest.approx(LOSS, abs=tol32(TERMS))
    n = sum(x.size for x in jax.tree.leaves(STATE["params"]))
    assert float(m["grad_norm"]) == pytest.approx(GRAD_NORM, abs=tol32(2 * TERMS + n, GRAD_NORM))
    norm = np.sqrt(
        sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(new["params"]))
    )
    assert norm == pytest.approx(PARAM_NORM, abs=tol32(8, PARAM_NORM))


def test_adversarial_loss_changes_the_update_not_the_reported_loss():
    plain, m_plain = _step(0.0)(STATE, _batch())
    adv, m_adv = _step(OPTIM.adversarial_eps)(STATE, _batch())
    assert float(m_adv["loss"]) == pytest.approx(float(m_plain["loss"]), abs=tol32(TERMS))
    assert float(m_adv["grad_norm"]) > float(m_plain["grad_norm"])  # the two gradients add
    diff = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), plain["params"], adv["params"])
    assert max(jax.tree.leaves(diff)) > 1e-4
