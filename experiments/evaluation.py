"""Evaluation of a whole split: every example counted once, metrics from the confusion matrix."""

import time
from typing import Any

import jax
import numpy as np

from attn import classifier
from experiments import batching, steps


def confusion_metrics(confusion_CxC: np.ndarray) -> dict:
    """Accuracy and macro-F1 from a confusion matrix (rows = true label, columns = prediction)."""
    total = confusion_CxC.sum()
    tp_C = np.diag(confusion_CxC).astype(np.float64)
    precision_C = tp_C / np.maximum(confusion_CxC.sum(0), 1)
    recall_C = tp_C / np.maximum(confusion_CxC.sum(1), 1)
    f1_C = 2 * precision_C * recall_C / np.maximum(precision_C + recall_C, 1e-12)
    return {"accuracy": float(tp_C.sum() / max(total, 1)), "macro_f1": float(f1_C.mean())}


def predict_probs(
    params: Any,
    cfg: classifier.ModelConfig,
    encoded: list[np.ndarray],
    labels: np.ndarray,
    *,
    data: Any,
    put: Any = jax.device_put,
) -> tuple[np.ndarray, float]:
    """Class probabilities [N, C] in example order, and the summed cross-entropy."""
    probs_NxC = np.zeros((len(encoded), cfg.num_classes), np.float32)
    loss_sum = 0.0
    for batch in batching.eval_batches(
        encoded,
        labels,
        batch_size=data.eval_batch_size,
        buckets=tuple(data.buckets),
        max_len=data.max_len,
    ):
        index_B = batch.pop("index")
        metrics, probs = steps.eval_step(params, put(batch), cfg=cfg)
        keep = index_B >= 0
        probs_NxC[index_B[keep]] = np.asarray(probs)[keep]
        loss_sum += float(metrics["loss_sum"])
    return probs_NxC, loss_sum


def evaluate(params, cfg, encoded, labels, *, data, put=jax.device_put) -> dict:
    """accuracy, macro_f1, loss, confusion, num_examples and examples_per_sec on one split."""
    start = time.perf_counter()
    probs_NxC, loss_sum = predict_probs(params, cfg, encoded, labels, data=data, put=put)
    seconds = time.perf_counter() - start
    confusion = np.zeros((cfg.num_classes, cfg.num_classes), np.int64)
    np.add.at(confusion, (labels, probs_NxC.argmax(-1)), 1)
    n = len(encoded)
    return {
        **confusion_metrics(confusion),
        "loss": loss_sum / max(n, 1),
        "confusion": confusion.tolist(),
        "num_examples": n,
        "examples_per_sec": n / max(seconds, 1e-9),
    }
