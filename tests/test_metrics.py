"""Accuracy and macro-F1 from a confusion matrix, against scikit-learn on the same predictions."""

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

from experiments.training import metrics


def _confusion(y_true, y_pred, num_classes):
    confusion = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(confusion, (y_true, y_pred), 1)
    return confusion


@pytest.mark.parametrize(
    "y_true, y_pred, num_classes",
    [
        # A stray label's class (1) with no example in truth or prediction: left out, F1 1.0.
        ([0] * 26 + [2] * 29, [0] * 26 + [2] * 29, 3),
        ([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 0, 2], 4),
        ([0, 0, 0, 1], [1, 1, 1, 1], 2),  # class 0 never predicted: its F1 is 0 and counts
        ([0, 1, 1, 3], [2, 1, 1, 3], 5),  # class 2 only predicted, class 0 only true
    ],
)
def test_confusion_metrics_match_sklearn(y_true, y_pred, num_classes):
    got = metrics.confusion_metrics(_confusion(y_true, y_pred, num_classes))
    assert got["accuracy"] == pytest.approx(accuracy_score(y_true, y_pred))
    assert got["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro"))


def test_random_predictions_match_sklearn():
    rng = np.random.default_rng(0)
    for _ in range(50):
        c = int(rng.integers(2, 6))
        y_true = rng.integers(0, c, 40)
        y_pred = np.where(rng.random(40) < 0.6, y_true, rng.integers(0, c, 40))
        got = metrics.confusion_metrics(_confusion(y_true, y_pred, c + 1))  # one empty class
        assert got["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro"))


def test_an_empty_confusion_matrix():
    assert metrics.confusion_metrics(np.zeros((2, 2), np.int64)) == {
        "accuracy": 0.0,
        "macro_f1": 0.0,
    }
