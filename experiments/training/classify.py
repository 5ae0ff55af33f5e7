"""The classification objective: the loss (cross-entropy, or with a teacher the distillation loss
of `attn.distillation`; the pooling penalty, the adversarial term), one train step (a pure
function; the loop jits it over a `functools.partial`), and the model's class probabilities and
metrics over a whole split. A whole run of it is `pipeline`'s."""

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from tqdm import tqdm

from attn import classifier, distillation, models
from experiments import parallel
from experiments.training import (
    loop,
    metrics,
    optim,
    xla_options,
)


def loss_options(
    o: ml_collections.ConfigDict, distill: ml_collections.ConfigDict | None = None
) -> dict:
    """The keyword arguments of `train_step` that config.optim `o` sets, and config.distill
    `distill` where it names a teacher."""
    options = {
        "label_smoothing": o.label_smoothing,
        "penalty_weight": o.penalty_weight,
        "ema_decay": o.ema_decay,
        "adversarial_eps": o.adversarial_eps,
        "adversarial_relative": o.adversarial_relative,
    }
    if distill is not None and distill.teacher:
        options["distill"] = {
            "loss": distill.loss,
            "temperature": distill.temperature,
            "weight": distill.weight,
        }
    return options


def loss_and_metrics(
    params: Any,
    batch: dict,
    cfg: classifier.ModelConfig,
    *,
    label_smoothing: float,
    penalty_weight: float,
    train: bool,
    rng: jax.Array | None,
    embed_delta_BxLxD: jax.Array | None = None,
    distill: dict | None = None,
):
    """Weighted mean cross-entropy (filler rows weigh 0) plus the pooling penalty; `cfg`'s type
    says which model (`attn.models.module`). With `distill` (`attn.distillation.mixed`'s loss,
    temperature and weight), each row's loss is that against batch["teacher"] [B, C] logits,
    batch["labelled"] [B] saying which rows' labels are their own."""
    logits_BxC, aux = models.module(cfg).apply(
        params,
        batch["tokens"],
        cfg,
        train=train,
        rng=rng,
        embed_delta_BxLxD=embed_delta_BxLxD,
        bag_tokens_BxG=batch.get("bag_tokens"),
    )
    if distill is not None:
        ce_B = distillation.mixed(
            logits_BxC, batch["teacher"], batch["label"], batch["labelled"], **distill
        )
    else:
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


def _adversarial_delta(
    g_BxLxD: jax.Array, eps: float, scale_B: jax.Array | None = None
) -> jax.Array:
    """eps (times scale_B, if given) times each example's embedding gradient scaled to unit L2
    norm over [L, D]: the first-order worst case perturbation of that size (Miyato et al. 2017)."""
    norm_B = jnp.sqrt(jnp.sum(jnp.square(g_BxLxD), axis=(1, 2)))
    size_B = eps if scale_B is None else eps * scale_B
    return jax.lax.stop_gradient(g_BxLxD * (size_B / (norm_B + 1e-12))[:, None, None])


def _embedding_norm(params: Any, tokens_BxL: jax.Array, cfg: classifier.ModelConfig) -> jax.Array:
    """[B] L2 norm of each example's input embeddings over its real tokens and all D."""
    x_BxLxD = classifier.embed(params, tokens_BxL, cfg)
    real_BxL = tokens_BxL != classifier.PAD
    return jnp.sqrt(jnp.sum(jnp.square(x_BxLxD) * real_BxL[..., None], axis=(1, 2)))


def train_step(
    state: dict,
    batch: dict,
    *,
    cfg: classifier.ModelConfig,
    tx: optax.GradientTransformation,
    label_smoothing: float,
    penalty_weight: float,
    ema_decay: float = 0.0,
    adversarial_eps: float = 0.0,
    adversarial_relative: bool = False,
    frozen: Callable[[Any], Any] | None = None,
    distill: dict | None = None,
) -> tuple[dict, dict]:
    """One optimizer step; a non-finite gradient leaves params unchanged and is counted.

    frozen(params) -> bools marks params not to differentiate (`optim.stop_frozen`); `distill`
    makes the loss a teacher's (`loss_and_metrics`), the adversarial term's too.

    With an "ema" entry in state, it also moves the average towards the new params by ema_decay.
    With adversarial_eps > 0 the loss gains the loss at adversarially perturbed embeddings; the
    perturbation's L2 norm is adversarial_eps, or with adversarial_relative that fraction of the
    example's own embedding norm, so one value holds across embedding scales and text lengths.
    """
    rng = jax.random.fold_in(state["rng"], state["step"])

    def loss_fn(params, delta_BxLxD):
        loss, metrics, _ = loss_and_metrics(
            optim.stop_frozen(params, frozen),
            batch,
            cfg,
            label_smoothing=label_smoothing,
            penalty_weight=penalty_weight,
            train=True,
            rng=rng,
            embed_delta_BxLxD=delta_BxLxD,
            distill=distill,
        )
        return loss, metrics

    if adversarial_eps:
        grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
        zero_BxLxD = jnp.zeros((*batch["tokens"].shape, cfg.d_model), jnp.float32)
        (loss, metrics), (grads, g_BxLxD) = grad_fn(state["params"], zero_BxLxD)
        scale_B = (
            _embedding_norm(state["params"], batch["tokens"], cfg) if adversarial_relative else None
        )
        delta_BxLxD = _adversarial_delta(g_BxLxD, adversarial_eps, scale_B)
        _, (adv_grads, _) = grad_fn(state["params"], delta_BxLxD)
        grads = jax.tree.map(jnp.add, grads, adv_grads)
    else:
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, metrics), grads = grad_fn(state["params"], None)
    return optim.apply_gradients(state, grads, tx, {**metrics, "loss": loss}, ema_decay=ema_decay)


def sums_and_probabilities(
    params: Any, batch: dict, *, cfg: classifier.ModelConfig
) -> tuple[dict, jax.Array]:
    """Per-batch metric sums and the class probabilities [B, C]; `eval_step` compiles it."""
    _, sums, logits_BxC = loss_and_metrics(
        params, batch, cfg, label_smoothing=0.0, penalty_weight=0.0, train=False, rng=None
    )
    return sums, jax.nn.softmax(logits_BxC)


@functools.cache
def _jitted_eval_step() -> Callable:
    # Built on first use, when the backend that picks the options is up.
    return jax.jit(
        sums_and_probabilities, static_argnames=("cfg",), compiler_options=xla_options.forward()
    )


def eval_step(params: Any, batch: dict, *, cfg: classifier.ModelConfig) -> tuple[dict, jax.Array]:
    """`sums_and_probabilities` jitted, with `xla_options.forward()`."""
    return _jitted_eval_step()(params, batch, cfg=cfg)


def probabilities(
    params: Any,
    cfg: classifier.ModelConfig,
    ids: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    data: Any,
    dp: parallel.DataParallel,
    bag_ids: Sequence[np.ndarray] | None = None,
    desc: str = "",
) -> tuple[np.ndarray, float]:
    """Class probabilities [N, C] in example order, and the summed cross-entropy, on every
    process; each process reads only its rows of each batch.

    `data` is config.data (batch size, buckets, max_len, bag_len); `dp` places a batch on the
    devices; `bag_ids` is the split's `encoding.Split.bag_ids`; `desc` names a progress bar on
    stderr (none without it: validation between training steps keeps the train bar alone).
    """
    probs_NxC = np.zeros((len(ids), cfg.num_classes), np.float32)
    loss_sum = 0.0
    bar = tqdm(
        total=len(ids),
        desc=desc,
        unit="text",
        mininterval=1,
        leave=False,
        disable=not desc or not parallel.is_primary(),
    )
    for idx, batch in loop.eval_batches(ids, labels, data=data, dp=dp, bag_ids=bag_ids):
        sums, probs_BxC = eval_step(params, batch, cfg=cfg)
        probs_NxC[idx] = parallel.fetch(probs_BxC)[: len(idx)]
        loss_sum += float(sums["loss_sum"])
        bar.update(len(idx))
    bar.close()
    return probs_NxC, loss_sum


def evaluate(
    params: Any,
    cfg: classifier.ModelConfig,
    ids: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    data: Any,
    dp: parallel.DataParallel,
    bag_ids: Sequence[np.ndarray] | None = None,
    desc: str = "",
) -> dict:
    """accuracy, macro_f1, loss, confusion, num_examples and examples_per_sec on one split
    (`desc`: a progress bar's name, as `probabilities`)."""
    start = time.perf_counter()
    probs_NxC, loss_sum = probabilities(
        params, cfg, ids, labels, data=data, dp=dp, bag_ids=bag_ids, desc=desc
    )
    seconds = time.perf_counter() - start
    confusion = np.zeros((cfg.num_classes, cfg.num_classes), np.int64)
    np.add.at(confusion, (labels, probs_NxC.argmax(-1)), 1)
    n = len(ids)
    return {
        **metrics.confusion_metrics(confusion),
        "loss": loss_sum / max(n, 1),
        "confusion": confusion.tolist(),
        "num_examples": n,
        "examples_per_sec": n / max(seconds, 1e-9),
    }
