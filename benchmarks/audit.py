"""Section 13: the label noise of the embedded Chinese reviews, and the accuracy its labels allow.

Confident learning (cleanlab's `find_label_issues`, Northcutt et al. 2021) over out-of-fold
predicted probabilities of char 1-3-gram TF-IDF + logistic regression (5 folds over all 17,360
texts, C of the run's own baseline) flags the texts whose given label the other texts' model
confidently contradicts, and estimates how many labels are wrong. A sample of the test split's
flagged texts and of its unflagged ones was then read and labelled by hand
(`benchmarks/data/chinese_reviews_audit.csv`: the text, its given label, whether it was flagged,
the label a reader gives it: pos, neg, or unclear for a text that states no sentiment or both);
`candidates` drew the sample and `python benchmarks/probes/audit_candidates.py` writes it.

The section reads that file and reports: the estimated noise rate of the whole dataset and of
the test split; the share of the audited texts whose given label is wrong (flagged and not); and
the accuracy of TF-IDF, attn from scratch (configs/default.py) and the fine-tuned encoder against
the given and the audited labels, on the audited texts and, reweighted by each stratum's size,
on the whole test split.
"""

import csv
import os

import numpy as np

from benchmarks import config_file, timing
from experiments.data import datasets
from experiments.errors import UserError

AUDIT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "chinese_reviews_audit.csv"
)
LABELS = ("neg", "pos")  # the embedded dataset's label ids 0 and 1
FOLDS = 5
FLAGGED, UNFLAGGED = 200, 100  # texts of the test split read by hand


def embedded_splits() -> dict:
    """The embedded reviews' train/validation/test as (texts, labels [N])."""
    split = datasets.load_splits(config_file("default.py").data)
    return {s: (list(x), np.asarray(y)) for s, (x, y, _) in split.items()}


def out_of_fold(texts: list[str], labels: np.ndarray, c: float, seed: int = 0) -> np.ndarray:
    """[N, 2] probabilities of char 1-3-gram TF-IDF + logistic regression, each text's from a
    model fitted on the other folds."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(
        TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True),
        LogisticRegression(C=c, solver="newton-cg", max_iter=2000),
    )
    folds = StratifiedKFold(FOLDS, shuffle=True, random_state=seed)
    return cross_val_predict(model, texts, labels, cv=folds, method="predict_proba")


def confident_learning(labels: np.ndarray, probs: np.ndarray) -> dict:
    """cleanlab's flags [N] bool (prune by noise rate) and its estimates of the noise: the count
    of label issues over N, and the confident joint's off-diagonal mass."""
    from cleanlab.count import estimate_joint, num_label_issues
    from cleanlab.filter import find_label_issues

    flags = find_label_issues(labels, probs, filter_by="prune_by_noise_rate")
    joint = estimate_joint(labels, probs)
    return {
        "flags": flags,
        "noise_rate": num_label_issues(labels, probs) / len(labels),
        "joint_off_diagonal": float(joint.sum() - np.trace(joint)),
    }


def candidates(c: float, seed: int = 0) -> list[dict]:
    """The texts to read by hand: FLAGGED of the test split's flagged texts and UNFLAGGED of the
    others (all of a stratum when it is smaller), drawn with `seed`, in a shuffled order that
    does not show which stratum a text is in."""
    splits = embedded_splits()
    texts = [t for s in ("train", "validation", "test") for t in splits[s][0]]
    labels = np.concatenate([splits[s][1] for s in ("train", "validation", "test")])
    probs = out_of_fold(texts, labels, c, seed)
    flags = confident_learning(labels, probs)["flags"]
    n_test = len(splits["test"][0])
    test_flags = flags[-n_test:]
    rng = np.random.default_rng(seed)
    picked = []
    for flagged, n in ((True, FLAGGED), (False, UNFLAGGED)):
        pool = np.flatnonzero(test_flags == flagged)
        picked += [(int(i), flagged) for i in rng.permutation(pool)[:n]]
    rows = [
        {
            "text": splits["test"][0][i],
            "label": LABELS[splits["test"][1][i]],
            "flagged": int(flagged),
            "audited": "",
        }
        for i, flagged in picked
    ]
    return [rows[i] for i in rng.permutation(len(rows))]


def read_audit(path: str = AUDIT) -> list[dict]:
    """The audited texts; UserError naming a row whose audited label is not pos, neg or
    unclear."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows, start=2):
        if r["audited"] not in (*LABELS, "unclear"):
            raise UserError(
                f"{path}, line {i}: audited label {r['audited']!r} is not pos/neg/unclear"
            )
    return rows


def accuracies(rows: list[dict], predicted: list[str], n_flagged: int, n_test: int) -> dict:
    """A model's accuracy on the audited texts against the given and the audited labels (texts
    audited unclear left out of the latter), per stratum and reweighted to the test split."""
    out = {}
    for against in ("label", "audited"):
        per = {}
        for flagged in ("1", "0"):
            hits = [
                p == r[against]
                for r, p in zip(rows, predicted, strict=True)
                if r["flagged"] == flagged and r[against] != "unclear"
            ]
            per[flagged] = float(np.mean(hits)) if hits else None
        weights = {"1": n_flagged / n_test, "0": 1 - n_flagged / n_test}
        out[against] = {
            "flagged": per["1"],
            "unflagged": per["0"],
            "test_estimate": sum(weights[k] * per[k] for k in per if per[k] is not None),
        }
    return out


def tfidf_predictions(splits: dict, texts: list[str], c: float) -> list[str]:
    """Char 1-3-gram TF-IDF + logistic regression (C=c) fitted on the train split: its labels
    for `texts`."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True)
    model = LogisticRegression(C=c, solver="newton-cg", max_iter=2000)
    model.fit(vec.fit_transform(splits["train"][0]), splits["train"][1])
    return [LABELS[i] for i in model.predict(vec.transform(texts))]


def served_predictions(workdir: str, texts: list[str]) -> list[str]:
    """A trained workdir's labels for `texts`, as predict serves them."""
    from experiments import predict, serving

    trained = serving.load(workdir)
    return [predict.predict_one(trained, t, top=1)["label"] for t in texts]


def models_from(workdirs: str, quick: bool, chinese: dict | None) -> dict[str, str]:
    """The workdirs scored on the audited texts: attn from scratch (configs/default.py, seed 0,
    trained into WORKDIRS/audit/default unless a run is there), and the fine-tune of the
    chinese section's chosen learning rate, seed 0, where its workdir was kept."""
    from benchmarks import chinese as chinese_section
    from benchmarks.accuracy import train_variant

    if not workdirs:
        raise UserError("audit needs --workdirs=DIR: where its models are trained or kept")
    scratch = os.path.join(workdirs, "audit", "default-tiny" if quick else "default")
    if not os.path.isdir(os.path.join(scratch, "best")):
        config = config_file("default.py:tiny" if quick else "default.py")
        with config.unlocked():
            config.train.seed = 0
        train_variant(config, keep=scratch)
    out = {"attn from scratch (configs/default.py)": scratch}
    row = chinese_section.chosen_rate(chinese or {"runs": {}})
    tuned = os.path.join(workdirs, "chinese", row or "", "seed0")
    if row and os.path.isdir(os.path.join(tuned, "best")):
        out[f"fine-tuned ({row})"] = tuned
    return out


def noise_shares(sec: dict) -> tuple[float, float]:
    """(labels wrong, texts that state no sentiment or both) as shares of the whole test split:
    each stratum's rates among the texts read by hand, weighted by the stratum's size."""
    flagged = sec["test_flagged"] / sec["num_test"]
    wrong = unclear = 0.0
    for f, weight in (("1", flagged), ("0", 1.0 - flagged)):
        vague = sec["unclear"][f] / sec["audited"][f]
        wrong += weight * sec["given_wrong"][f] * (1.0 - vague)
        unclear += weight * vague
    return wrong, unclear


def run(quick: bool, models: dict[str, str], c: float = 100.0) -> dict:
    """The audit section: the noise estimates over the embedded reviews (a tenth of them with
    `quick`) and each model's accuracies on the audited texts: TF-IDF (C=c, the run's own
    baseline's) and each workdir of `models` (name -> workdir)."""
    rows = read_audit()
    splits = embedded_splits()
    order = ("train", "validation", "test")
    texts = [t for s in order for t in splits[s][0]]
    labels = np.concatenate([splits[s][1] for s in order])
    n_test = len(splits["test"][0])
    if quick:  # every tenth text: the harness in seconds
        is_test = np.arange(len(texts)) >= len(texts) - n_test
        texts, labels, n_test = texts[::10], labels[::10], int(is_test[::10].sum())
    found = confident_learning(labels, out_of_fold(texts, labels, c))
    test_flags = found["flags"][-n_test:]
    clear = [r for r in rows if r["audited"] != "unclear"]
    sec = {
        "num_texts": len(texts),
        "noise_rate": found["noise_rate"],
        "joint_off_diagonal": found["joint_off_diagonal"],
        "flagged": int(found["flags"].sum()),
        "num_test": n_test,
        "test_flagged": int(test_flags.sum()),
        "audited": {f: sum(r["flagged"] == f for r in rows) for f in ("1", "0")},
        "unclear": {
            f: sum(r["flagged"] == f and r["audited"] == "unclear" for r in rows)
            for f in ("1", "0")
        },
        "given_wrong": {
            f: float(np.mean([r["label"] != r["audited"] for r in clear if r["flagged"] == f]))
            for f in ("1", "0")
        },
        "models": {},
    }
    texts_audited = [r["text"] for r in rows]
    predicted = {"tfidf": tfidf_predictions(splits, texts_audited, c)}
    for name, workdir in models.items():
        predicted[name] = served_predictions(workdir, texts_audited)
    for name, labels_of in predicted.items():
        sec["models"][name] = accuracies(rows, labels_of, sec["test_flagged"], n_test)
    sec["peak_rss_bytes"] = timing.peak_rss_bytes()
    return sec
