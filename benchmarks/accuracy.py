"""Section 3: accuracy. The default config and two pooling variants trained end to end, against
character n-gram TF-IDF + logistic regression baselines on the same splits."""

import tempfile
import time

import ml_collections
import numpy as np

from benchmarks import config_file, timing
from experiments import baseline, metrics, train
from experiments.data import datasets


def tfidf_baseline(
    data_cfg,
    *,
    grid: tuple[float, ...],
    sublinear: bool,
    analyzer: str = "char",
    ngrams: tuple[int, int] = (1, 3),
    max_train: int | None = None,
) -> dict:
    """`baseline.tfidf_logreg` on `data_cfg`'s splits with lbfgs (the solver the committed
    numbers were measured with; `train`'s own baseline uses liblinear for two classes)."""
    split = datasets.load_splits(data_cfg)
    texts = {s: (x, y) for s, (x, y, _) in split.items()}
    texts["train"] = tuple(v[:max_train] for v in texts["train"])
    return baseline.tfidf_logreg(
        texts,
        analyzer=analyzer,
        ngrams=ngrams,
        lowercase=data_cfg.lowercase,
        sublinear=sublinear,
        grid=grid,
        solver="lbfgs",
    )


def train_variant(config: ml_collections.ConfigDict) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        test = train.train_and_evaluate(config, workdir)
        wall = time.perf_counter() - start
        rows = metrics.read(workdir)
    rates = [r["examples_per_sec"] for r in rows if r["split"] == "train"]
    return {
        "test_accuracy": test["accuracy"],
        "best_validation_accuracy": max(r["accuracy"] for r in rows if r["split"] == "validation"),
        "examples_per_sec": float(np.median(rates)) if rates else None,
        "test_macro_f1": test["macro_f1"],
        "best_step": test["step"],
        "wall_s": wall,
        "model": config.model.to_dict(),
        "epochs": config.train.num_epochs,
        "max_steps": config.train.max_steps,
    }


def run(quick: bool) -> dict:
    """The accuracy section of results.json."""
    base = "default.py:tiny" if quick else "default.py"
    default = config_file(base)
    results = {"default": train_variant(default)}
    structured = config_file(base if quick else "default.py:structured")
    structured.model.pooling = "structured"  # a no-op for the named variant; tiny needs it
    results["structured"] = train_variant(structured)
    if default.model.pooling == "mean":
        results["mean"] = {**results["default"], "same_as": "default"}
    else:
        mean = config_file(base)
        mean.model.pooling = "mean"
        results["mean"] = train_variant(mean)
    for name in ("default", "structured", "mean"):
        r = results[name]
        print(f"{name}: test {r['test_accuracy']:.4f} ({r['wall_s']:.0f} s)")
    grid = (1.0, 10.0) if quick else (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
    for key, sublinear in (("tfidf_logreg", False), ("tfidf_sublinear_logreg", True)):
        results[key] = tfidf_baseline(
            default.data, grid=grid, sublinear=sublinear, max_train=2000 if quick else None
        )
        b = results[key]
        print(f"{key}: test {b['test_accuracy']:.4f} (C={b['best_C']}, {b['wall_s']:.0f} s)")
    # The bar is the better of the two on test: stricter than choosing between them on validation.
    b = max(
        results["tfidf_logreg"], results["tfidf_sublinear_logreg"], key=lambda r: r["test_accuracy"]
    )
    d = results["default"]
    results["config"] = base
    results["peak_rss_bytes"] = timing.peak_rss_bytes()
    results["targets"] = {
        "beats_baseline": {
            "target": "default config beats the better TF-IDF+logreg test accuracy in < 5 min "
            "on 2 cores",
            "accuracy": d["test_accuracy"],
            "baseline": b["test_accuracy"],
            "wall_s": d["wall_s"],
            "met": d["test_accuracy"] > b["test_accuracy"] and d["wall_s"] < 300,
        }
    }
    return results
