"""Section 15: traditional Chinese given to models trained on the simplified embedded reviews, as
it is and converted back by `--convert=t2s` (OpenCC, `experiments.data.conversion`).

The embedded test split is made traditional with OpenCC's s2t. Each workdir (those the audit
section scores: attn from scratch and the chosen Chinese fine-tune) is evaluated on the simplified
original, the traditional copy as it is, and the traditional copy read with --convert=t2s, each
with the share of its tokens outside the model's vocabulary; beside them the share of the test
split's characters that s2t changes, the texts the round trip s2t then t2s gives back exactly,
and predict's answer for one sentence in both scripts. With `--quick` every 20th test text, and
attn's tiny model.
"""

import dataclasses

import numpy as np

from benchmarks import config_file, timing
from experiments import parallel, predict, serving
from experiments.data import conversion, datasets, encoding
from experiments.training import classify

TO_TRADITIONAL, TO_SIMPLIFIED = "s2t", "t2s"
SENTENCE = "这本书非常好看"  # "this book is a very good read"
CONDITIONS = {
    "simplified": "the simplified original",
    "traditional": "the traditional copy (s2t) as it is",
    "converted": "the traditional copy with `--convert=t2s`",
}


@dataclasses.dataclass(frozen=True)
class Copies:
    """The test split in both scripts."""

    simplified: list[str]
    traditional: list[str]  # s2t of each simplified text
    labels: np.ndarray  # int32 [N]


def test_copies(quick: bool) -> Copies:
    """The embedded test split (every 20th text with `quick`) and its traditional copy."""
    texts, labels, _ = datasets.load_splits(config_file("default.py").data, ("test",))["test"]
    if quick:
        texts, labels = texts[::20], labels[::20]
    return Copies(texts, conversion.convert_all(TO_TRADITIONAL, texts)[0], np.asarray(labels))


def changed_characters(before: list[str], after: list[str]) -> float:
    """The share of the characters of `before` that differ in `after`, text by text (OpenCC's
    character conversions keep a text's length; a text whose length changed counts whole)."""
    changed = sum(
        sum(x != y for x, y in zip(a, b, strict=True)) if len(a) == len(b) else len(a)
        for a, b in zip(before, after, strict=True)
    )
    return changed / max(sum(map(len, before)), 1)


def scored(trained: serving.Trained, texts: list[str], labels: np.ndarray) -> dict:
    """The workdir's accuracy over `texts` read as evaluate reads them (its data.convert
    applied), the share of their tokens outside its vocabulary, and how many texts the
    conversion changed."""
    seen, changed = serving.converted(trained, texts)
    tok, data = trained.tokenizer, trained.config.data
    raw = [tok.encode(t) for t in seen]
    unknown = sum(int(np.sum(ids == tok.specials.unk)) for ids in raw)
    split = encoding.encode_split(tok, seen, labels, data, add_cls=trained.cfg.pooling == "cls")
    dp = parallel.data_parallel(data)
    params = parallel.replicate(trained.params, dp)
    result = classify.evaluate(
        params, trained.cfg, split.ids, split.labels, data=data, dp=dp, bag_ids=split.bag_ids
    )
    return {
        "accuracy": result["accuracy"],
        "num_examples": result["num_examples"],
        "unknown_tokens": unknown / max(sum(map(len, raw)), 1),
        "converted_texts": changed,
    }


def sentence(trained: serving.Trained) -> dict:
    """predict's label and probability for SENTENCE in simplified, in traditional, and in
    traditional with --convert=t2s."""
    traditional = conversion.converter(TO_TRADITIONAL)(SENTENCE)
    converting = serving.converting(trained, TO_SIMPLIFIED)
    out = {}
    for name, t, text in (
        ("simplified", trained, SENTENCE),
        ("traditional", trained, traditional),
        ("converted", converting, traditional),
    ):
        p = predict.predict_one(t, text, top=1)
        out[name] = {"text": text, "label": p["label"], "probability": p["probability"]}
    return out


def run(quick: bool, models: dict[str, str]) -> dict:
    """The traditional section: `models` (name -> workdir) on the test split in both scripts."""
    copies = test_copies(quick)
    back = conversion.convert_all(TO_SIMPLIFIED, copies.traditional)[0]
    sec = {
        "num_test": len(copies.labels),
        "changed_characters": changed_characters(copies.simplified, copies.traditional),
        "changed_texts": sum(
            a != b for a, b in zip(copies.simplified, copies.traditional, strict=True)
        ),
        "round_trip_exact": float(
            np.mean([a == b for a, b in zip(copies.simplified, back, strict=True)])
        ),
        "sentence": SENTENCE,
        "models": {},
    }
    for name, workdir in models.items():
        trained = serving.load(workdir)
        as_is = serving.converting(trained, "")  # the simplified runs convert nothing
        rows = {
            "simplified": scored(as_is, copies.simplified, copies.labels),
            "traditional": scored(as_is, copies.traditional, copies.labels),
            "converted": scored(
                serving.converting(trained, TO_SIMPLIFIED), copies.traditional, copies.labels
            ),
        }
        sec["models"][name] = {**rows, "predict": sentence(as_is)}
        print(name + ": " + ", ".join(f"{k} {r['accuracy']:.4f}" for k, r in rows.items()))
    sec["peak_rss_bytes"] = timing.peak_rss_bytes()
    return sec
