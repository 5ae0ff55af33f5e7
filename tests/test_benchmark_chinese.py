"""The Chinese fine-tuning and label-audit sections of the benchmarks: the learning rate chosen on
validation alone, the target read per seed, the audited file's provenance and the accuracies
reweighted to the test split."""

import collections
import csv
import json
import os

import numpy as np
import pytest

from benchmarks import audit, chinese, docs
from experiments.errors import UserError


def _run(test: float, val: float) -> dict:
    return {"test_accuracy": test, "best_validation_accuracy": val, "wall_s": 60.0}


def test_the_rate_is_chosen_on_validation_over_the_seeds_every_rate_ran():
    sec = {
        "runs": {
            "finetuned_lr5e-5": {"seeds": {"0": _run(0.99, 0.80)}},
            "finetuned_lr1e-4": {"seeds": {"0": _run(0.50, 0.85), "1": _run(0.5, 0.70)}},
            "finetuned_lr2e-4": {"seeds": {"0": _run(0.60, 0.84)}},
        }
    }
    # seed 0 alone is common to all three: 1e-4's 0.85 wins, whatever test says
    assert chinese.chosen_rate(sec) == "finetuned_lr1e-4"
    sec["runs"]["finetuned_lr2e-4"]["seeds"]["1"] = _run(0.6, 0.90)
    sec["runs"]["finetuned_lr5e-5"]["seeds"]["1"] = _run(0.6, 0.60)
    assert chinese.chosen_rate(sec) == "finetuned_lr2e-4"  # (0.84 + 0.90) / 2 > (0.85 + 0.70) / 2
    assert chinese.chosen_rate({"runs": {}}) is None


def test_the_target_holds_only_when_every_seed_clears_it():
    sec = {
        "runs": {
            "tfidf": {"test_accuracy": 0.86},
            "finetuned_lr1e-4": {"seeds": {"0": _run(0.89, 0.9), "1": _run(0.884, 0.9)}},
        }
    }
    t = chinese.targets(sec)
    assert not t["above_tfidf"]["met"]  # seed 1 is 2.4 points above
    assert t["above_tfidf"]["seed_gaps"]["0"] == pytest.approx(0.03)
    sec["runs"]["finetuned_lr1e-4"]["seeds"]["1"] = _run(0.886, 0.9)
    t = chinese.targets(sec)
    assert t["above_tfidf"]["met"] and not t["moonshot"]["met"]


def test_the_chinese_fine_tune_shows_in_the_headline_verdict_and_results_page():
    with open(os.path.join(docs.ROOT, "benchmarks", "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    results.pop("chinese", None)
    before = docs.headline(results)
    assert "fine-tuned (`configs/finetune.py`" not in before
    assert "Not measured yet." in docs.RENDER["chinese"](results)
    tfidf = {
        "test_accuracy": 0.8586,
        "features": "char 1-3-grams",
        "best_C": 10.0,
        "validation_accuracy": {"10.0": 0.84},
        "num_test": 1726,
        "wall_s": 17.0,
    }
    results["chinese"] = {
        "pretrained": "/data/m3e-small/",
        "runs": {
            "tfidf": tfidf,
            "finetuned_lr1e-4": {"seeds": {"0": _run(0.8905, 0.87)}},
            "finetuned_lr2e-4": {"seeds": {"0": _run(0.95, 0.86)}},
        },
    }
    after = docs.headline(results).splitlines()
    new = [i for i, line in enumerate(after) if line not in before.splitlines()]
    # one row, right after the embedded data's TF-IDF, with the rate chosen on validation (1e-4,
    # whose test is the lower) and its one seed
    assert len(new) == 1 and "TF-IDF" in after[new[0] - 1]
    assert (
        "m3e-small fine-tuned (`configs/finetune.py`, learning rate 1e-4) | 89.05% (seed 0) |"
        in (after[new[0]])
    )
    assert "Fine-tuned, m3e-small is 3.19 points above its own run's TF-IDF (85.86%)." in (
        docs.verdict(results)
    )
    results["chinese"]["runs"]["finetuned_lr1e-4"]["seeds"]["1"] = _run(0.8787, 0.86)
    assert (
        "Fine-tuned, m3e-small is 2.60 points above its own run's TF-IDF (85.86%) on average over "
        "2 seeds (2.01-3.19 each)." in docs.verdict(results)
    )
    del results["chinese"]["runs"]["finetuned_lr1e-4"]["seeds"]["1"]
    table = docs.RENDER["chinese"](results)
    assert (
        "| fine-tuned at learning rate 2e-4 | 95.00% (seed 0) | 95.00% | 86.00% | 1 min |" in table
    )
    assert table.endswith("Chosen on validation: fine-tuned at learning rate 1e-4.")


def test_the_label_noise_is_weighted_to_the_test_split_and_said_in_the_verdict():
    sec = {
        "num_test": 1000,
        "test_flagged": 100,
        "audited": {"1": 100, "0": 100},
        "unclear": {"1": 20, "0": 10},
        "given_wrong": {"1": 0.5, "0": 0.1},
    }
    wrong, unclear = audit.noise_shares(sec)
    # flagged: 10% of test, 40% wrong (half of the 80% clear); unflagged: 90%, 9% wrong
    assert wrong == pytest.approx(0.1 * 0.4 + 0.9 * 0.09)
    assert unclear == pytest.approx(0.1 * 0.2 + 0.9 * 0.1)
    with open(os.path.join(docs.ROOT, "benchmarks", "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    results.pop("audit", None)
    assert "wrong" not in docs.verdict(results)
    results["audit"] = sec
    assert "hand, 12.10% of the embedded test labels are wrong and 11.00% of" in docs.verdict(
        results
    )
    assert docs.RENDER["label-noise"](results).startswith("Read by hand, about 12.10%")


def test_the_audited_file_is_the_test_splits_texts_with_their_given_labels():
    rows = audit.read_audit()
    strata = collections.Counter(r["flagged"] for r in rows)
    assert strata == {"1": 149, "0": 100}
    assert {r["audited"] for r in rows} <= {"pos", "neg", "unclear"}
    texts, labels = audit.embedded_splits()["test"]
    given = {t: audit.LABELS[y] for t, y in zip(texts, labels, strict=True)}
    assert all(given[r["text"]] == r["label"] for r in rows)
    assert len({r["text"] for r in rows}) == len(rows)


def test_a_bad_audited_label_is_named_with_its_line(tmp_path):
    path = tmp_path / "audit.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerows([["text", "label", "flagged", "audited"], ["好", "pos", "1", "pos"]])
        w.writerow(["差", "neg", "0", "negative"])
    with pytest.raises(UserError, match=r"line 3: audited label 'negative' is not"):
        audit.read_audit(str(path))


def test_accuracies_by_stratum_and_reweighted_to_the_test_split():
    rows = [
        {"label": "pos", "audited": "neg", "flagged": "1"},
        {"label": "neg", "audited": "neg", "flagged": "1"},
        {"label": "pos", "audited": "unclear", "flagged": "1"},
        {"label": "pos", "audited": "pos", "flagged": "0"},
        {"label": "neg", "audited": "neg", "flagged": "0"},
    ]
    got = audit.accuracies(rows, ["neg", "neg", "pos", "pos", "pos"], n_flagged=10, n_test=100)
    assert got["label"]["flagged"] == pytest.approx(2 / 3)  # unclear texts keep their given label
    assert got["audited"]["flagged"] == 1.0  # the unclear one left out
    assert got["label"]["unflagged"] == got["audited"]["unflagged"] == 0.5
    assert got["audited"]["test_estimate"] == pytest.approx(0.1 * 1.0 + 0.9 * 0.5)


def test_confident_learning_flags_a_confidently_contradicted_label():
    pytest.importorskip("cleanlab")  # a benchmark's dependency (requirements-dev.txt)
    rng = np.random.default_rng(0)
    labels = np.array([0] * 50 + [1] * 50)
    p1 = np.clip(labels * 0.8 + 0.1 + rng.normal(0, 0.05, 100), 0.01, 0.99)
    p1[3] = 0.99  # labelled 0, confidently 1
    probs = np.stack([1 - p1, p1], axis=1)
    found = audit.confident_learning(labels, probs)
    assert found["flags"][3] and found["flags"].sum() == 1
    assert found["noise_rate"] == pytest.approx(0.01)
