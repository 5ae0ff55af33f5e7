"""The masked-token objective (`attn.masked_lm`) as a run of the train loop: its model config,
params, train step and validation, beside `classify`'s. A whole run of it is `pipeline`'s.

The state is the classifier's own (`optim.init_state`, no bag: the bag is not pretrained)
with the masked-token head as one more entry of its params, "mlm", so a pretrained workdir's
encoder sits where a classifier's does and `warm_start` reads both alike.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from attn import classifier, masked_lm
from experiments import fields, parallel
from experiments.training import loop, optim

HEAD = "mlm"
LABEL = "masked-token"  # what this objective's accuracy and loss are of


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> classifier.ModelConfig:
    """The classifier's config without the bag, whose table pretraining would never train."""
    cfg = fields.model_config(config, vocab_size, num_classes=2)
    return dataclasses.replace(cfg, bag_buckets=0)


def encoder_params(params: dict) -> dict:
    """The classifier's params of a pretraining state's params: all but the head."""
    return {k: v for k, v in params.items() if k != HEAD}


def predicted(config: ml_collections.ConfigDict, vocab_size: int) -> int:
    """How many of the most frequent ids the head predicts: config.pretrain.head_vocab, at most
    the vocabulary (0 = all of it)."""
    return min(config.pretrain.head_vocab or vocab_size, vocab_size)


def _loss(params, tokens_BxL, key, cfg, rate, predicted, *, train: bool, rng):
    corrupted_BxL, targets = masked_lm.corrupt(
        key, tokens_BxL, vocab_size=cfg.vocab_size, rate=rate, predicted=predicted
    )
    model = encoder_params(params)
    h_BxLxD, _ = classifier.encode(model, corrupted_BxL, cfg, train=train, rng=rng)
    logits_BxPxV = masked_lm.head_logits(
        params[HEAD], model["embed"]["tokens"][:predicted], h_BxLxD, targets["positions"]
    )
    return masked_lm.loss(logits_BxPxV, targets)


def train_step(
    state: dict,
    batch: dict,
    *,
    cfg: classifier.ModelConfig,
    tx: optax.GradientTransformation,
    rate: float,
    predicted: int,
    frozen: Callable[[Any], Any] | None = None,
) -> tuple[dict, dict]:
    """One optimizer step on freshly masked tokens: the masks of step s are a function of the
    state's rng and s, so a resumed run masks exactly as an uninterrupted one. frozen(params) ->
    bools marks params not to differentiate (`optim.stop_frozen`)."""
    k_mask, k_drop = jax.random.split(jax.random.fold_in(state["rng"], state["step"]))
    grad_fn = jax.value_and_grad(
        lambda params, *a, **k: _loss(optim.stop_frozen(params, frozen), *a, **k), has_aux=True
    )
    (loss, sums), grads = grad_fn(
        state["params"], batch["tokens"], k_mask, cfg, rate, predicted, train=True, rng=k_drop
    )
    return optim.apply_gradients(state, grads, tx, {**sums, "loss": loss})


@functools.partial(jax.jit, static_argnames=("cfg", "rate", "predicted"))
def _eval_step(params, tokens_BxL, key, *, cfg, rate, predicted):
    _, sums = _loss(params, tokens_BxL, key, cfg, rate, predicted, train=False, rng=None)
    return sums


def evaluate(
    params: Any,
    cfg: classifier.ModelConfig,
    ids: Sequence[np.ndarray],
    *,
    rate: float,
    predicted: int,
    seed: int,
    data: Any,
    dp: parallel.DataParallel,
) -> dict:
    """Masked-token accuracy and loss per target on texts `ids`, with the same masks at every
    evaluation (drawn from `seed` and the batch number), so evaluations compare."""
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
    labels = np.zeros(len(ids), np.int32)
    for n, (_, batch) in enumerate(loop.eval_batches(ids, labels, data=data, dp=dp)):
        sums = _eval_step(
            params,
            batch["tokens"],
            jax.random.fold_in(key, n),
            cfg=cfg,
            rate=rate,
            predicted=predicted,
        )
        for k in totals:
            totals[k] += float(sums[k])
    count = max(totals["count"], 1.0)
    return {
        "accuracy": totals["correct"] / count,
        "loss": totals["loss_sum"] / count,
        "num_targets": int(totals["count"]),
        "num_examples": len(ids),
    }
