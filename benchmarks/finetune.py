"""Section 8: what attention earns once pretrained. One labelled file of short English texts
(`--data_path`, e.g. sentence-level movie reviews), its 80/10/10 split by text hash, and each row
trained once per seed through `python -m experiments.train`'s own code:

  tfidf          word 1-2-gram TF-IDF (sublinear tf) + logistic regression, C chosen on validation
  scratch        configs/csv.py: attn's own encoder from random weights, with its bag
  frozen         configs/finetune.py with the checkpoint frozen (optim.warm_lr_scale=0): a probe
  finetuned      configs/finetune.py: the checkpoint (`--bert_dir`) fine-tuned, evaluated and
                 served as a running average of its weights (optim.ema_decay=0.99)
  finetuned_no_ema  finetuned without the running average (optim.ema_decay=0)
  attention_off  finetuned with model.pretrained_layers=0: its embeddings alone, mean-pooled
  random_init    finetuned with model.pretrained_init=random: the architecture, no pretraining
  finetuned_bag  configs/finetune.py:bag: finetuned with the bag of n-grams beside it
  finetuned_bag_no_ema  finetuned_bag without the running average (optim.ema_decay=0)
  finetuned_bag_layer_decay  finetuned_bag_no_ema with optim.layer_decay=0.9: each lower
                 layer's learning rate 0.9 times the one above (the embeddings 0.9**7 of the
                 head's)
  finetuned_all_epochs  finetuned with train.patience=0: every epoch, the best validated kept
  finetuned_lr5e-5, finetuned_lr2e-4  finetuned at learning rate 5e-5 or 2e-4 instead of 1e-4
  finetuned_cls, finetuned_cls_lr5e-5, finetuned_cls_lr2e-4  the same three rates with [CLS]
                 pooling (model.pooling=cls: the checkpoint's pooler on [CLS], the head that
                 BertForSequenceClassification has) instead of the mean over real tokens

The two rows that train a linear layer over fixed or shallow features get learning rate 1e-3,
chosen on validation (the checkpoint's rows keep configs/finetune.py's 1e-4). `--rows` picks
rows and `--seeds` seeds; seeds of an earlier call are kept per row while its recipe, data and
checkpoint are the same, and results.json is written after every run, so the hours this takes
on a CPU can be spread over several calls.
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

# row -> (config file, overrides); None: not trained (the TF-IDF baseline).
ROWS: dict[str, tuple[str, dict] | None] = {
    "tfidf": None,
    "scratch": ("csv.py", {}),
    "frozen": ("finetune.py", {"optim.warm_lr_scale": 0.0, "optim.learning_rate": 1e-3}),
    "finetuned": ("finetune.py", {}),
    "finetuned_no_ema": ("finetune.py", {"optim.ema_decay": 0.0}),
    "attention_off": (
        "finetune.py",
        {"model.pretrained_layers": 0, "optim.learning_rate": 1e-3},
    ),
    "random_init": ("finetune.py", {"model.pretrained_init": "random"}),
    "finetuned_bag": ("finetune.py:bag", {}),
    "finetuned_bag_no_ema": ("finetune.py:bag", {"optim.ema_decay": 0.0}),
    "finetuned_bag_layer_decay": (
        "finetune.py:bag",
        {"optim.ema_decay": 0.0, "optim.layer_decay": 0.9},
    ),
    "finetuned_all_epochs": ("finetune.py", {"train.patience": 0}),
    "finetuned_lr5e-5": ("finetune.py", {"optim.learning_rate": 5e-5}),
    "finetuned_lr2e-4": ("finetune.py", {"optim.learning_rate": 2e-4}),
    "finetuned_cls": ("finetune.py", {"model.pooling": "cls"}),
    "finetuned_cls_lr5e-5": ("finetune.py", {"model.pooling": "cls", "optim.learning_rate": 5e-5}),
    "finetuned_cls_lr2e-4": ("finetune.py", {"model.pooling": "cls", "optim.learning_rate": 2e-4}),
}
LABELS = {  # in the order the table shows them: the fine-tune, its variants and ablations, others
    "finetuned": "pretrained encoder fine-tuned, weights averaged (`configs/finetune.py`)",
    "finetuned_no_ema": "the same without the weight average (EMA 0.99)",
    "finetuned_all_epochs": "fine-tuned for all its epochs (no early stopping)",
    "finetuned_lr5e-5": "fine-tuned at learning rate 5e-5 (1e-4 above)",
    "finetuned_lr2e-4": "fine-tuned at learning rate 2e-4",
    "finetuned_cls": "fine-tuned with [CLS] pooling (the checkpoint's pooler) instead of the mean",
    "finetuned_cls_lr5e-5": "[CLS] pooling at learning rate 5e-5",
    "finetuned_cls_lr2e-4": "[CLS] pooling at learning rate 2e-4",
    "finetuned_bag": "fine-tuned with the bag of n-grams beside it, weights averaged "
    "(`configs/finetune.py:bag`)",
    "finetuned_bag_no_ema": "the same without the weight average (EMA 0.99)",
    "finetuned_bag_layer_decay": "the same without the average, with layer-wise learning-rate "
    "decay 0.9",
    "frozen": "pretrained encoder frozen, linear probe",
    "attention_off": "its embeddings alone, pooled and fine-tuned (attention off)",
    "random_init": "its architecture from random weights",
    "scratch": "attn from scratch (`configs/csv.py`)",
    "tfidf": "word 1-2-gram TF-IDF + logistic regression",
}
# Published IMDB test accuracies the IMDB fine-tune is read against.
IMDB_TARGET = "imdb_above_nbsvm"  # in targets() once the imdb row has a seed
IMDB_BARS = {"NBSVM (Wang and Manning 2012)": 0.9122, "DistilBERT (Sanh et al. 2019)": 0.928}
# The IMDB row's recipe on these cores: configs/finetune.py:imdb cut to fit (the device's is whole).
IMDB_CPU = "finetune.py:imdb_cpu"
# Published accuracies on these sentences (Pang and Lee's sentence polarity v1.0), for reading
# the table; not measured here and not on this split (they are 10-fold cross-validation).
ANCHORS = {
    "NBSVM, word 1-2-grams (Wang and Manning 2012)": 0.794,
    "CNN, static word2vec (Kim 2014)": 0.810,
    "CNN, fine-tuned word2vec (Kim 2014)": 0.815,
}


def row_config(row: str, quick: bool, data_path: str, bert_dir: str):
    """The config a row trains: its file (the tiny variant with --quick) and overrides."""
    file, overrides = ROWS[row]
    if quick:
        file = file.split(":")[0] + ":tiny"
    config = config_file(file)
    with config.unlocked():
        config.data.dataset = "file"
        config.data.path = data_path
        if file.startswith("finetune.py"):
            config.model.pretrained = bert_dir
        as_row(config, overrides, quick)
        if quick and row.startswith("finetuned_bag"):
            config.model.bag_buckets = 1 << 10
            config.optim.bag_init = "naive_bayes"
    return config


def run(
    quick: bool,
    data_path: str,
    bert_dir: str,
    seeds: list[str],
    rows: list[str],
    previous: dict | None,
    save: Callable[[dict], None],
    imdb_path: str = "",
) -> dict:
    """The finetune section of results.json; `save(section)` after every run. The `imdb` row
    trains IMDB_CPU on `imdb_path`'s official split instead of `data_path`'s texts."""
    unknown = [r for r in rows if r not in ROWS and r != "imdb"]
    if unknown:
        known = ", ".join((*ROWS, "imdb"))
        raise UserError(f"--rows: unknown {', '.join(unknown)}; known: {known}")
    split_rows = [r for r in rows if r in ROWS]
    if split_rows and not data_path:
        raise UserError("finetune needs --data_path=FILE (a CSV of text,label)")
    if "imdb" in rows and not (imdb_path and os.path.isdir(imdb_path)):
        raise UserError("the imdb row needs --imdb_path=DIR (an unpacked aclImdb folder)")
    bert_dir = bert_dir or (TINY_BERT if quick else "")
    if not bert_dir:
        raise UserError("finetune needs --bert_dir=DIR (a BERT-layout model directory)")
    previous, imdb_bert = previous or {}, bert_dir
    if not split_rows:  # the text file's rows stay as they were
        data_path, bert_dir = previous.get("data_path", ""), previous.get("bert_dir", bert_dir)
    same_source = (
        previous.get("data_path") == data_path
        and previous.get("bert_dir") == bert_dir
        and previous.get("quick") == quick
    )
    sec = {
        "data_path": data_path,
        "bert_dir": bert_dir,
        "quick": quick,
        "anchors": ANCHORS,
        "runs": dict(previous.get("runs", {})) if same_source else {},
    }
    if "imdb" in previous:
        sec["imdb"] = previous["imdb"]
    if "tfidf" in rows:
        start = time.perf_counter()
        data = row_config("finetuned", quick, data_path, bert_dir).data
        b = tfidf_baseline(
            data,
            grid=(1.0, 10.0) if quick else (1.0, 3.0, 10.0, 30.0, 100.0),
            sublinear=True,
            analyzer="word",
            ngrams=(1, 2),
        )
        b["wall_s"] = time.perf_counter() - start
        sec["runs"]["tfidf"] = b
        print(f"tfidf: test {b['test_accuracy']:.4f} (C={b['best_C']}, {b['wall_s']:.0f} s)")
        _save(sec, save)
    for row in (r for r in ROWS if r in rows and ROWS[r] is not None):
        config = row_config(row, quick, data_path, bert_dir)
        recipe = json.loads(json.dumps(config.to_dict()))
        del recipe["train"]["seed"]
        old = sec["runs"].get(row, {})
        kept = old.get("seeds", {}) if fields.complete(old.get("recipe", {})) == recipe else {}
        sec["runs"][row] = {"config": ROWS[row][0], "recipe": recipe, "seeds": dict(kept)}
        for seed in seeds:
            with config.unlocked():
                config.train.seed = int(seed)
            r = train_variant(config)
            del r["model"]  # the recipe has it
            sec["runs"][row]["seeds"][seed] = r
            print(
                f"{row}, seed {seed}: test {r['test_accuracy']:.4f}, best validation "
                f"{r['best_validation_accuracy']:.4f} ({r['wall_s']:.0f} s)"
            )
            _save(sec, save)
    if "imdb" in rows:

        def save_imdb(r: dict) -> None:
            sec["imdb"] = r
            _save(sec, save)

        imdb_runs(quick, imdb_path, imdb_bert, seeds, IMDB_CPU, sec.get("imdb"), save_imdb)
    sec["targets"] = targets(sec)
    sec["peak_rss_bytes"] = timing.peak_rss_bytes()
    return sec


def imdb_runs(
    quick: bool,
    imdb_path: str,
    bert_dir: str,
    seeds: list[str],
    variant: str,
    previous: dict | None = None,
    save: Callable[[dict], None] = lambda r: None,
) -> dict:
    """configs/<variant> (an IMDB variant of finetune.py) trained on a local aclImdb folder's
    official split once per seed, against IMDB_BARS; `--quick`: the tiny checkpoint, 32 tokens,
    2 steps. Seeds in `previous` are kept while the recipe, folder and checkpoint are the same;
    `save(result)` after every seed."""
    bert_dir = bert_dir or (TINY_BERT if quick else "")
    if not imdb_path or not bert_dir:
        return {
            "config": variant,
            "skipped": "needs --imdb_path (an aclImdb folder) and --bert_dir",
        }
    config = config_file(variant)
    with config.unlocked():
        config.data.path = imdb_path
        config.model.pretrained = bert_dir
        config.train.baseline = False
        if quick:  # tiny_bert has 40 positions
            config.data.max_len, config.data.tail_len, config.data.buckets = 32, 24, (32,)
            config.data.bag_len = 0
            config.model.bag_buckets = min(config.model.bag_buckets, 1 << 10)
            config.train.max_steps = config.train.eval_every_steps = 2
            config.train.checkpoint_every_steps = 2
    recipe = json.loads(json.dumps(config.to_dict()))
    del recipe["train"]["seed"]
    previous = previous or {}
    same = previous.get("recipe") == recipe and previous.get("quick") == quick
    out = {"config": variant, "recipe": recipe, "quick": quick, "bert_dir": bert_dir}
    out["seeds"] = dict(previous.get("seeds", {})) if same else {}
    for seed in seeds:
        with config.unlocked():
            config.train.seed = int(seed)
        r = train_variant(config)
        out["seeds"][seed] = {
            k: r[k] for k in ("test_accuracy", "best_validation_accuracy", "best_step", "wall_s")
        }
        accs = [x["test_accuracy"] for x in out["seeds"].values()]
        out["every_seed_above"] = {name: min(accs) > bar for name, bar in IMDB_BARS.items()}
        print(
            f"IMDB fine-tuned ({variant}), seed {seed}: test {r['test_accuracy']:.4f}, best "
            f"validation {r['best_validation_accuracy']:.4f} ({r['wall_s']:.0f} s)"
        )
        save(out)
    return out


def _save(sec: dict, save: Callable[[dict], None]) -> None:
    save({**sec, "targets": targets(sec), "peak_rss_bytes": timing.peak_rss_bytes()})


def runs(sec: dict, row: str) -> list[dict]:
    """A row's runs, by seed ([] before any); the tfidf row is its one fit."""
    r = sec["runs"].get(row)
    if r is None:
        return []
    return [r["seeds"][k] for k in sorted(r["seeds"], key=int)] if "seeds" in r else [r]


def mean_test(sec: dict, row: str) -> tuple[float | None, list[str]]:
    """A row's mean test accuracy and the seeds it is over (None before any run)."""
    accs = [x["test_accuracy"] for x in runs(sec, row)]
    seeds = sorted(sec["runs"].get(row, {}).get("seeds", {}), key=int)
    return (float(np.mean(accs)) if accs else None), seeds


def clears(gap: float) -> bool:
    """Whether a test-accuracy margin over a bar is the targets' 5 points (rounding aside)."""
    return gap >= 0.05 - 1e-9


def targets(sec: dict) -> dict:
    """Fine-tuned against attention off, and against the better of TF-IDF and the from-scratch
    recipe: at least 5 points of mean test accuracy each, with each seed's margin beside it; the
    second also for the bag recipe (configs/finetune.py:bag), since the from-scratch recipe has
    the bag too."""
    out = {}
    for key, row, others, what in (
        (
            "attention_earns",
            "finetuned",
            ("attention_off",),
            "the fine-tuned encoder beats the same embeddings without attention",
        ),
        (
            "beats_scratch_and_tfidf",
            "finetuned",
            ("tfidf", "scratch"),
            "the fine-tuned encoder beats TF-IDF and attn from scratch",
        ),
        (
            "bag_beats_scratch_and_tfidf",
            "finetuned_bag",
            ("tfidf", "scratch"),
            "fine-tuned with the bag (configs/finetune.py:bag), it beats TF-IDF and attn from "
            "scratch",
        ),
    ):
        ft, ft_seeds = mean_test(sec, row)
        means = {o: mean_test(sec, o)[0] for o in others}
        bar = max((m for m in means.values() if m is not None), default=None)
        out[key] = {
            "target": f"{what} by >= 5 points of mean test accuracy",
            "finetuned_mean": ft,
            "finetuned_seeds": ft_seeds,
            "bar": bar,
            "met": ft is not None and bar is not None and clears(ft - bar),
            # each seed's test accuracy less the bar: whether the margin holds on every seed
            "seed_gaps": [x["test_accuracy"] - bar for x in runs(sec, row)] if bar else [],
        }
    imdb = [x["test_accuracy"] for x in sec.get("imdb", {}).get("seeds", {}).values()]
    if imdb:
        nbsvm = IMDB_BARS["NBSVM (Wang and Manning 2012)"]
        out[IMDB_TARGET] = {
            "target": f"on IMDB's official split (configs/{IMDB_CPU}), every seed run above "
            f"NBSVM's {nbsvm:.2%}",
            "finetuned_mean": float(np.mean(imdb)),
            "finetuned_seeds": len(imdb),
            "bar": nbsvm,
            "met": min(imdb) > nbsvm,
        }
    return out
