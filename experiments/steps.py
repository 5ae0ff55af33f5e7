"""The jitted train and eval steps: loss, optimizer and per-batch metrics over a params pytree."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from attn import classifier

# apply_if_finite would apply a non-finite update after this many skips; the train loop stops
# long before (config.optim.max_nonfinite), so this only has to be out of reach.
_NEVER = 2**30


def make_optimizer(
    optim: ml_collections.ConfigDict, total_steps: int
) -> optax.GradientTransformation:
    """AdamW with warmup + cosine decay, global-norm clipping, skipping of non-finite updates."""
    warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=optim.learning_rate * 0.01,
    )
    # Decay matrices only: biases, LayerNorm scales and offsets are vectors.
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    tx = optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(schedule, weight_decay=optim.weight_decay, mask=decay_mask),
    )
    return optax.apply_if_finite(tx, max_consecutive_errors=_NEVER)


def init_state(key: jax.Array, cfg: classifier.ModelConfig, tx: optax.GradientTransformation):
    init_key, dropout_key = jax.random.split(key)
    params = classifier.init(init_key, cfg)
    return {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.zeros([], jnp.int32),
        "rng": dropout_key,
    }


def loss_and_metrics(
    params: Any,
    batch: dict,
    cfg: classifier.ModelConfig,
    *,
    label_smoothing: float,
    penalty_weight: float,
    train: bool,
    rng: jax.Array | None,
):
    """Weighted mean cross-entropy (filler rows weigh 0) plus the pooling penalty."""
    logits_BxC, aux = classifier.apply(params, batch["tokens"], cfg, train=train, rng=rng)
    onehot_BxC = jax.nn.one_hot(batch["label"], cfg.num_classes)
    if label_smoothing:
        onehot_BxC = optax.smooth_labels(onehot_BxC, label_smoothing)
    ce_B = optax.softmax_cross_entropy(logits_BxC, onehot_BxC)
    w_B = batch["weight"]
    n = jnp.maximum(w_B.sum(), 1.0)
    loss = (ce_B * w_B).sum() / n + penalty_weight * aux["penalty"]
    correct = ((logits_BxC.argmax(-1) == batch["label"]) * w_B).sum()
    return (
        loss,
        {"loss_sum": (ce_B * w_B).sum(), "correct": correct, "count": w_B.sum()},
        logits_BxC,
    )


@functools.partial(jax.jit, static_argnames=("cfg", "tx", "label_smoothing", "penalty_weight"))
def train_step(state, batch, *, cfg, tx, label_smoothing, penalty_weight):
    """One optimizer step; a non-finite gradient leaves params unchanged and is counted."""
    rng = jax.random.fold_in(state["rng"], state["step"])

    def loss_fn(params):
        loss, metrics, _ = loss_and_metrics(
            params,
            batch,
            cfg,
            label_smoothing=label_smoothing,
            penalty_weight=penalty_weight,
            train=True,
            rng=rng,
        )
        return loss, metrics

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    new_state = {**state, "params": params, "opt_state": opt_state, "step": state["step"] + 1}
    metrics = {
        **metrics,
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "nonfinite_run": opt_state.notfinite_count,
        "nonfinite_total": opt_state.total_notfinite,
    }
    return new_state, metrics


@functools.partial(jax.jit, static_argnames=("cfg",))
def eval_step(params, batch, *, cfg):
    """Returns per-batch metric sums and the class probabilities [B, C]."""
    _, metrics, logits_BxC = loss_and_metrics(
        params, batch, cfg, label_smoothing=0.0, penalty_weight=0.0, train=False, rng=None
    )
    return metrics, jax.nn.softmax(logits_BxC)
