"""Section 12: a pretrained Chinese encoder fine-tuned on the embedded Chinese reviews. Each row is
`configs/finetune.py` on `data.dataset=chinese_reviews` with `--pretrained` (a Chinese BERT-family
model directory, e.g. m3e-small), trained once per seed through `python -m experiments.train`'s
own code on the dataset's fixed split, beside the run's own TF-IDF baseline and configs/default.py
from scratch (section 3's seeds):

  tfidf             char 1-3-gram TF-IDF (sublinear tf, case kept, as the fine-tune's own
                    baseline) + logistic regression, C chosen on validation
  finetuned_lr5e-5, finetuned_lr1e-4, finetuned_lr2e-4
                    configs/finetune.py at that peak learning rate, mean pooling, weights
                    averaged: the rate is chosen on validation among these
  finetuned_cls     [CLS] pooling (the checkpoint's pooler) at 1e-4
  finetuned_no_ema  without the weight average, at 1e-4

`--rows` picks rows and `--seeds` seeds; a row's seeds of an earlier call are kept while its
recipe and checkpoint are the same, and results.json is written after every run. With
`--workdirs=DIR` each run's workdir is kept as DIR/chinese/<row>/seed<N> (resumed if a call was
interrupted, and served afterwards: predict, the label audit, distillation's teacher).
"""

import json
import os
import time
from collections.abc import Callable

import numpy as np

from benchmarks import as_row, config_file, timing
from benchmarks.accuracy import tfidf_baseline, train_variant
from experiments import fields
from experiments.errors import UserError

TINY_BERT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tests/data/bert/tiny_bert")
DATASET = "chinese_reviews"
RATES = {"finetuned_lr5e-5": 5e-5, "finetuned_lr1e-4": 1e-4, "finetuned_lr2e-4": 2e-4}
# row -> overrides of configs/finetune.py; None: not trained (the TF-IDF baseline).
ROWS: dict[str, dict | None] = {
    "tfidf": None,
    **{row: {"optim.learning_rate": lr} for row, lr in RATES.items()},
    "finetuned_cls": {"optim.learning_rate": 1e-4, "model.pooling": "cls"},
    "finetuned_no_ema": {"optim.learning_rate": 1e-4, "optim.ema_decay": 0.0},
}
LABELS = {
    "finetuned_lr5e-5": "fine-tuned at learning rate 5e-5 (`configs/finetune.py`)",
    "finetuned_lr1e-4": "fine-tuned at learning rate 1e-4",
    "finetuned_lr2e-4": "fine-tuned at learning rate 2e-4",
    "finetuned_cls": "[CLS] pooling (the checkpoint's pooler) instead of the mean, at 1e-4",
    "finetuned_no_ema": "without the weight average, at 1e-4",
    "tfidf": "char 1-3-gram TF-IDF + logistic regression (the fine-tune's own baseline)",
}
TARGET, MOONSHOT = 0.025, 0.04  # over the run's own TF-IDF, every seed of the chosen rate


def row_config(row: str, quick: bool, pretrained: str):
    """The config a row trains: configs/finetune.py (its tiny variant with --quick) on the
    embedded Chinese reviews with the row's overrides."""
    config = config_file("finetune.py:tiny" if quick else "finetune.py")
    with config.unlocked():
        config.data.dataset = DATASET
        config.data.path = ""
        config.model.pretrained = pretrained
        as_row(config, ROWS[row] or {}, quick)
    return config


def run(
    quick: bool,
    pretrained: str,
    seeds: list[str],
    rows: list[str],
    previous: dict | None,
    save: Callable[[dict], None],
    workdirs: str = "",
) -> dict:
    """The chinese section of results.json; `save(section)` after every run."""
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise UserError(f"--rows: unknown {', '.join(unknown)}; known: {', '.join(ROWS)}")
    pretrained = pretrained or (TINY_BERT if quick else "")
    if not pretrained:
        raise UserError("chinese needs --pretrained=DIR (a Chinese BERT-family model directory)")
    previous = previous or {}
    same = previous.get("pretrained") == pretrained and previous.get("quick") == quick
    sec = {
        "dataset": DATASET,
        "pretrained": pretrained,
        "quick": quick,
        "runs": dict(previous.get("runs", {})) if same else {},
    }
    if "tfidf" in rows:
        start = time.perf_counter()
        data = row_config("finetuned_lr1e-4", quick, pretrained).data
        grid = (1.0, 10.0) if quick else (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
        b = tfidf_baseline(data, grid=grid, sublinear=True, analyzer="char", ngrams=(1, 3))
        b["wall_s"] = time.perf_counter() - start
        sec["runs"]["tfidf"] = b
        print(f"tfidf: test {b['test_accuracy']:.4f} (C={b['best_C']}, {b['wall_s']:.0f} s)")
        _save(sec, save)
    for row in (r for r in ROWS if r in rows and ROWS[r] is not None):
        config = row_config(row, quick, pretrained)
        recipe = json.loads(json.dumps(config.to_dict()))
        del recipe["train"]["seed"]
        old = sec["runs"].get(row, {})
        kept = old.get("seeds", {}) if fields.complete(old.get("recipe", {})) == recipe else {}
        sec["runs"][row] = {"recipe": recipe, "seeds": dict(kept)}
        for seed in seeds:
            with config.unlocked():
                config.train.seed = int(seed)
            keep = os.path.join(workdirs, "chinese", row, f"seed{seed}") if workdirs else None
            r = train_variant(config, keep=keep)
            del r["model"]  # the recipe has it
            sec["runs"][row]["seeds"][seed] = r
            print(
                f"{row}, seed {seed}: test {r['test_accuracy']:.4f}, best validation "
                f"{r['best_validation_accuracy']:.4f} ({r['wall_s']:.0f} s)"
            )
            _save(sec, save)
    sec["targets"] = targets(sec)
    sec["peak_rss_bytes"] = timing.peak_rss_bytes()
    return sec


def _save(sec: dict, save: Callable[[dict], None]) -> None:
    save({**sec, "targets": targets(sec), "peak_rss_bytes": timing.peak_rss_bytes()})


def seeds_of(sec: dict, row: str) -> dict[str, dict]:
    """A row's runs by seed ({} before any)."""
    return (sec["runs"].get(row) or {}).get("seeds", {})


def chosen_rate(sec: dict) -> str | None:
    """The learning-rate row with the best mean validation accuracy over the seeds every rate
    row has run (None before any); test is not looked at."""
    ran = {row: seeds_of(sec, row) for row in RATES if seeds_of(sec, row)}
    common = set.intersection(*(set(s) for s in ran.values())) if ran else set()
    if not common:
        return None
    return max(ran, key=lambda r: np.mean([ran[r][s]["best_validation_accuracy"] for s in common]))


def targets(sec: dict) -> dict:
    """The chosen rate's test accuracy over the run's own TF-IDF, on every seed."""
    row, tfidf = chosen_rate(sec), sec["runs"].get("tfidf")
    if row is None or tfidf is None:
        return {}
    bar = tfidf["test_accuracy"]
    accs = {s: r["test_accuracy"] for s, r in seeds_of(sec, row).items()}
    gaps = {s: a - bar for s, a in accs.items()}
    out = {}
    for key, need in (("above_tfidf", TARGET), ("moonshot", MOONSHOT)):
        out[key] = {
            "target": f"the fine-tuned Chinese encoder (learning rate chosen on validation) at "
            f"least {need * 100:g} points above its own TF-IDF baseline on every seed",
            "row": row,
            "bar": bar,
            "seed_gaps": gaps,
            "met": bool(gaps) and min(gaps.values()) >= need - 1e-9,
        }
    return out
