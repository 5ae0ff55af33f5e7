"""The model without gradients: class probabilities and metrics of a whole split, and one text's
probabilities with its attention maps and one layer's attention step by step."""

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn import classifier, multihead
from experiments import parallel
from experiments.data import batching
from experiments.training import metrics, optim


@functools.partial(jax.jit, static_argnames=("cfg",))
def eval_step(params: Any, batch: dict, *, cfg: classifier.ModelConfig) -> tuple[dict, jax.Array]:
    """Per-batch metric sums and the class probabilities [B, C]."""
    _, sums, logits_BxC = optim.loss_and_metrics(
        params, batch, cfg, label_smoothing=0.0, penalty_weight=0.0, train=False, rng=None
    )
    return sums, jax.nn.softmax(logits_BxC)


def probabilities(
    params: Any,
    cfg: classifier.ModelConfig,
    ids: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    data: Any,
    dp: parallel.DataParallel,
    bag_ids: Sequence[np.ndarray] | None = None,
) -> tuple[np.ndarray, float]:
    """Class probabilities [N, C] in example order, and the summed cross-entropy, on every
    process; each process reads only its rows of each batch.

    `data` is config.data (batch size, buckets, max_len, bag_len); `dp` places a batch on the
    devices; `bag_ids` is the split's `encoding.Split.bag_ids`.
    """
    probs_NxC = np.zeros((len(ids), cfg.num_classes), np.float32)
    loss_sum = 0.0
    for idx, batch in batching.eval_batches(
        ids,
        labels,
        batch_size=data.eval_batch_size,
        buckets=tuple(data.buckets),
        max_len=data.max_len,
        rows=dp.rows(data.eval_batch_size),
        bag_ids=bag_ids,
        bag_len=data.bag_len,
    ):
        sums, probs_BxC = eval_step(params, dp.put(batch), cfg=cfg)
        probs_NxC[idx] = parallel.fetch(probs_BxC)[: len(idx)]
        loss_sum += float(sums["loss_sum"])
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
) -> dict:
    """accuracy, macro_f1, loss, confusion, num_examples and examples_per_sec on one split."""
    start = time.perf_counter()
    probs_NxC, loss_sum = probabilities(params, cfg, ids, labels, data=data, dp=dp, bag_ids=bag_ids)
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


@functools.partial(jax.jit, static_argnames=("cfg",))
def _forward(
    params: Any,
    tokens_BxL: jax.Array,
    bag_tokens_BxM: jax.Array | None,
    *,
    cfg: classifier.ModelConfig,
):
    logits_BxC, aux = classifier.apply(params, tokens_BxL, cfg, bag_tokens_BxM=bag_tokens_BxM)
    return jax.nn.softmax(logits_BxC), aux


def analyse(
    params: Any, cfg: classifier.ModelConfig, ids_L: np.ndarray, bag_ids_M: np.ndarray | None
) -> dict:
    """Probabilities [C], per-layer attention [H, L, L] and the attention each token receives [L]
    of one text's ids [L] (and what its bag reads [M], if the model's bag reads more of it).

    Chunked attention never forms the weights, so maps are computed with the matrix form:
    the same function of the same parameters.
    """
    cfg = dataclasses.replace(cfg, implementation="matrix")
    tokens_1xL = jnp.asarray(ids_L[None, :], jnp.int32)
    bag_1xM = None if bag_ids_M is None else jnp.asarray(bag_ids_M[None, :], jnp.int32)
    probs_1xC, aux = _forward(params, tokens_1xL, bag_1xM, cfg=cfg)
    attention = [np.asarray(w[0], np.float32) for w in aux["attention"]]
    if aux["pool_weights"] is not None:  # structured pooling: what the classifier reads
        received_L = np.asarray(aux["pool_weights"][0], np.float32).mean(0)
    elif attention:
        received_L = attention[-1].mean(axis=(0, 1))
    else:
        received_L = np.full(len(ids_L), 1.0 / max(len(ids_L), 1), np.float32)
    return {"probs": np.asarray(probs_1xC[0]), "attention": attention, "received": received_L}


def attention_steps(
    params: Any, cfg: classifier.ModelConfig, ids_L: np.ndarray, layer: int
) -> multihead.Steps:
    """`classifier.attention_steps` of one sequence of ids [L] (PAD ids are masked keys), as
    float32 numpy arrays."""
    st = classifier.attention_steps(params, jnp.asarray(ids_L, jnp.int32), cfg, layer=layer)
    return multihead.Steps(*(np.asarray(a, np.float32) for a in st))
