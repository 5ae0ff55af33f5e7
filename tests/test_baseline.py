"""The TF-IDF + logistic regression baseline that every run fits beside its model."""

import json
import random

import numpy as np

from experiments.training import baseline
from tests.conftest import run_here

POS, NEG, FILLER = ["good", "great", "fine"], ["bad", "awful", "dull"], ["the", "plot", "cast", "a"]


def _texts(n: int, seed: int, classes=(POS, NEG)) -> tuple[list[str], np.ndarray]:
    """Sentences whose one sentiment word gives the label, among filler words."""
    rng = random.Random(seed)
    labels = np.array([i % len(classes) for i in range(n)], np.int32)
    texts = [
        " ".join(rng.sample(FILLER, 3) + [rng.choice(classes[y])] + rng.sample(FILLER, 2))
        for y in labels
    ]
    return texts, labels


def test_word_ngrams_find_the_sentiment_word_and_c_is_chosen_on_validation():
    splits = {s: _texts(n, seed) for s, n, seed in (("train", 60, 0), ("validation", 20, 1))}
    splits["test"] = _texts(30, 2)
    r = baseline.tfidf_logreg(splits, analyzer="word", ngrams=(1, 2))
    assert r["test_accuracy"] == 1.0
    assert r["features"] == "word 1-2-grams"
    val = r["validation_accuracy"]
    assert set(val) == {str(c) for c in baseline.GRID}
    assert val[str(r["best_C"])] == max(val.values())
    assert (r["num_train"], r["num_test"]) == (60, 30)


def test_three_classes_and_chance_labels_stay_near_chance():
    neutral = ["okay", "average", "so-so"]
    splits = {
        s: _texts(n, seed, (POS, NEG, neutral))
        for s, n, seed in (("train", 90, 0), ("validation", 30, 1), ("test", 60, 2))
    }
    r = baseline.tfidf_logreg(splits, analyzer="word", ngrams=(1, 1))
    assert r["test_accuracy"] == 1.0
    shuffled = dict(splits)
    shuffled["test"] = (splits["test"][0], np.random.default_rng(0).permutation(splits["test"][1]))
    assert baseline.tfidf_logreg(shuffled, analyzer="word", ngrams=(1, 1))["test_accuracy"] < 0.7


def test_a_run_prints_and_records_the_baseline_and_a_rerun_reuses_it(tmp_path, capsys, monkeypatch):
    texts, labels = _texts(300, 0)
    csv = tmp_path / "reviews.csv"
    csv.write_text(
        "text,label\n"
        + "".join(f"{t},{['pos', 'neg'][y]}\n" for t, y in zip(texts, labels, strict=True)),
        encoding="utf-8",
    )
    workdir = tmp_path / "run"
    args = (
        "--config=configs/default.py:tiny",
        "--config.data.dataset=file",
        f"--config.data.path={csv}",
        "--config.train.baseline=True",
        f"--workdir={workdir}",
    )
    first = run_here("experiments.train", *args, capsys=capsys)
    assert first.returncode == 0, first.stderr
    fitting = (
        "baseline: fitting char 1-3-gram TF-IDF + logistic regression on 251 training texts for "
        f"{len(baseline.GRID)} values of C"
    )
    assert fitting in first.stderr  # the bar sat at its end with nothing said while it ran
    saved = json.loads((workdir / baseline.FILE).read_text())
    assert saved["features"] == "char 1-3-grams" and saved["test_accuracy"] > 0.9
    model = json.loads((workdir / "eval_test.json").read_text())
    assert model["baseline"] == saved
    line = baseline.summary(model["accuracy"], saved)
    assert line in first.stdout and "TF-IDF + logistic regression" in line

    def refit(*a, **k):
        raise AssertionError("a finished run refit its baseline")

    monkeypatch.setattr(baseline, "tfidf_logreg", refit)
    again = run_here("experiments.train", *args, capsys=capsys)
    assert again.returncode == 0, again.stderr
    assert line in again.stdout and "baseline: fitting" not in again.stderr


def test_data_it_cannot_fit_gives_a_reason_and_no_file(tmp_path):
    texts, labels = _texts(20, 0)
    one_class = {s: (texts, np.zeros(20, np.int32)) for s in ("train", "validation", "test")}
    data = type("Data", (), {"tokenizer": "word", "lowercase": True})
    out = baseline.fit_for_run(data, one_class, str(tmp_path))
    assert "class" in out["error"] and "\n" not in out["error"]
    assert not (tmp_path / baseline.FILE).exists()
    assert baseline.summary(0.9, out).startswith("baseline: not fit: ")


def test_summary_says_above_or_below():
    b = {"features": "word 1-2-grams", "best_C": 10.0, "test_accuracy": 0.9}
    assert "2.50 points above" in baseline.summary(0.925, b)
    assert "1.00 points below" in baseline.summary(0.89, b)
