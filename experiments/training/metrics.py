"""Metrics: accuracy and macro-F1 from a confusion matrix, and the log of a run (`metrics.jsonl`
plus TensorBoard events) that stays exact across resumes."""

import json
import os

import numpy as np
from tensorboardX import SummaryWriter

FILENAME = "metrics.jsonl"


def confusion_metrics(confusion_CxC: np.ndarray) -> dict:
    """Accuracy and macro-F1 from a confusion matrix (rows = true label, columns = prediction).

    Macro-F1 averages over the classes that occur, as truth or as prediction (scikit-learn's
    labels by default): a class absent from both, e.g. a stray label's class in a test split
    without it, has no F1 to count, and counting it as 0 would lower the mean for nothing.
    """
    total = confusion_CxC.sum()
    tp_C = np.diag(confusion_CxC).astype(np.float64)
    predicted_C, true_C = confusion_CxC.sum(0), confusion_CxC.sum(1)
    precision_C = tp_C / np.maximum(predicted_C, 1)
    recall_C = tp_C / np.maximum(true_C, 1)
    f1_C = 2 * precision_C * recall_C / np.maximum(precision_C + recall_C, 1e-12)
    occurs_C = (predicted_C + true_C) > 0
    macro_f1 = f1_C[occurs_C].mean() if occurs_C.any() else 0.0
    return {"accuracy": float(tp_C.sum() / max(total, 1)), "macro_f1": float(macro_f1)}


# The best validation accuracy before any evaluation: below every accuracy, so the first
# evaluation with a finite loss improves on it.
NO_BEST = -1.0


def improves(validation: dict, best_accuracy: float, best_loss: float | None = None) -> bool:
    """Whether an evaluation replaces the kept best checkpoint (best_loss None: none kept yet, or
    kept before losses were recorded): a finite loss (a diverged model never becomes the best) and
    higher accuracy, or the same accuracy and a lower loss. On easy data accuracy can tie for
    most of a run, and the earliest of equals was often the least trained."""
    if not np.isfinite(validation["loss"]):
        return False
    if validation["accuracy"] != best_accuracy:
        return validation["accuracy"] > best_accuracy
    return best_loss is not None and validation["loss"] < best_loss


def read(workdir: str) -> list[dict]:
    path = os.path.join(workdir, FILENAME)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class Log:
    """Appends one JSON object per line; on resume drops the lines of steps after the checkpoint.

    Dropping them makes a resumed run's file identical to an uninterrupted run's.
    """

    def __init__(self, workdir: str, resume_step: int):
        self.path = os.path.join(workdir, FILENAME)
        kept = [r for r in read(workdir) if r["step"] <= resume_step]
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        os.replace(tmp, self.path)
        self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, split: str, metrics: dict) -> None:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "split": split, **scalars}) + "\n")
        for k, v in scalars.items():
            self.tb.add_scalar(f"{split}/{k}", v, step)

    def close(self) -> None:
        self.tb.close()
