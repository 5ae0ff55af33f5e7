"""The numbers of README.md and docs/*.md, rendered from results.json.

A page holds a number only between two markers, `<!-- results:NAME -->` and
`<!-- /results:NAME -->`; `render` replaces what lies between them with `RENDER[NAME](results)`.
A block (a table, a list) starts and ends on its own line; an inline fact (`85.88%`) sits inside
a sentence. After `python -m benchmarks` writes results.json, `python -m benchmarks.report`
rewrites every page, and `tests/test_docs.py` fails while a page differs from what results.json
renders: a number is typed nowhere, and new results change the pages in the same commit.
"""

import math
import os
import re
from collections.abc import Callable

import numpy as np

from benchmarks import audit, chinese, distill, finetune, traditional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The pages whose regions are rendered; benchmarks/REPORT.md is written whole by report.py.
PAGES = ("README.md", "docs", os.path.join("benchmarks", "analysis.md"))
# A marker quoted in backticks is documentation, not a region.
MARKER = re.compile(r"(?<!`)<!-- results:([\w.-]+) -->(.*?)<!-- /results:\1 -->", re.S)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _seeds(runs: dict) -> list[float]:
    return [runs[s]["test_accuracy"] for s in sorted(runs, key=int)]


def _seed_list(accs: list[float]) -> str:
    return " / ".join(_pct(a) for a in accs) + "%"


def _mean_std(accs: list[float]) -> str:
    return f"{_pct(np.mean(accs))} ± {_pct(np.std(accs))}%"


def _points(x: float) -> str:
    return f"{100 * abs(x):.2f}"


def _stderr(acc: float, n: int) -> float:
    """One binomial standard error of an accuracy measured on n texts."""
    return math.sqrt(acc * (1 - acc) / n)


def _walls(runs: dict) -> str:
    walls = [r["wall_s"] for r in runs.values()]
    return f"{min(walls):.0f}-{max(walls):.0f} s"


def _baseline(acc: dict) -> dict:
    """The better of the embedded data's two TF-IDF baselines on test: what the targets use."""
    return max(acc["tfidf_logreg"], acc["tfidf_sublinear_logreg"], key=lambda b: b["test_accuracy"])


def _compare(accs: list[float], b: dict) -> str:
    """Tie, above or below TF-IDF, in one clause: under two standard errors apart is a tie."""
    diff = float(np.mean(accs)) - b["test_accuracy"]
    se, n = _stderr(b["test_accuracy"], b["num_test"]), b["num_test"]
    side = "above" if diff > 0 else "below"
    word = "ties" if abs(diff) < 2 * se else "beats" if diff > 0 else "falls below"
    return (
        f"**{word}** {b['features']} TF-IDF + logistic regression: its mean is {_points(diff)} "
        f"points {side} it, and one standard error on {n:,} test texts is {_points(se)} points"
    )


def headline(r: dict) -> str:
    """The README's table: each dataset's model, the same model without attention, TF-IDF."""
    acc, im = r["accuracy"], r["imdb"]
    b, ib = _baseline(acc), im["tfidf_word12_sublinear_logreg"]
    on, off, imdb = _seeds(acc["seeds"]), _seeds(acc["no_attention"]), _seeds(im["seeds"])
    rows = [
        "| data (test texts) | model | test accuracy, seeds 0 / 1 / 2 | mean ± std |",
        "| --- | --- | --- | --- |",
        f"| embedded Chinese reviews ({b['num_test']:,}) | `configs/{acc['config']}` | "
        f"{_seed_list(on)} | {_mean_std(on)} |",
        f"| | the same without attention (`--config.model.num_layers=0`) | {_seed_list(off)} | "
        f"{_mean_std(off)} |",
        f"| | {b['features']} TF-IDF + logistic regression | {_pct(b['test_accuracy'])}% | |",
        *_chinese_rows(r),
        *_distilled_rows(r, distill.CHINESE, "`configs/distill.py`"),
        f"| IMDB, official split ({ib['num_test']:,}) | `configs/{im['config']}` | "
        f"{_seed_list(imdb)} | {_mean_std(imdb)} |",
        f"| | {ib['features']} TF-IDF + logistic regression | {_pct(ib['test_accuracy'])}% | |",
    ]
    ft = r.get("finetune", {}).get("imdb", {})
    if ft.get("seeds"):
        accs = _seeds(ft["seeds"])
        seeds = ", ".join(sorted(ft["seeds"], key=int))
        mean = f" {_mean_std(accs)} " if len(accs) > 1 else " "
        rows.append(
            f"| | all-MiniLM-L6-v2 fine-tuned (`configs/{ft['config']}`) | {_seed_list(accs)} "
            f"(seed{'s' if len(accs) > 1 else ''} {seeds}) |{mean}|"
        )
    return "\n".join(rows)


def _chinese_finetuned(r: dict) -> tuple[str, str, list[float]] | None:
    """(the checkpoint's name, the rate row chosen on validation, its test accuracy by seed),
    once a learning-rate row of the chinese section has run; None before."""
    sec = r.get("chinese")
    row = chinese.chosen_rate(sec) if sec else None
    if row is None:
        return None
    name = os.path.basename(sec["pretrained"].rstrip("/"))
    return name, row, _seeds(chinese.seeds_of(sec, row))


def _chinese_rows(r: dict) -> list[str]:
    """The headline's row of the fine-tuned Chinese encoder, when it has run."""
    found = _chinese_finetuned(r)
    if found is None:
        return []
    name, row, accs = found
    return [
        f"| | {name} fine-tuned (`configs/finetune.py`, learning rate "
        f"{row.removeprefix('finetuned_lr')}) | "
        f"{_headline_cells(accs, chinese.seeds_of(r['chinese'], row))} |"
    ]


def _distilled(r: dict, key: str) -> tuple[dict, str, list[float]] | None:
    """(the data's part of the distill section, its chosen row, that row's test accuracy by
    seed), once the row has run; None before."""
    part = r.get("distill", {}).get("data", {}).get(key, {})
    row = part.get("chosen")
    if not row:
        return None
    return part, row, _seeds(part["runs"][row]["seeds"])


def _teacher_name(part: dict) -> str:
    """The teacher's pretrained checkpoint, by its directory's name."""
    pretrained = part.get("teacher_row", {}).get("pretrained")
    return os.path.basename(pretrained.rstrip("/")) if pretrained else "its teacher"


def _distilled_rows(r: dict, key: str, config: str) -> list[str]:
    """The headline's row of the student distilled on `key`'s data, when it has run."""
    found = _distilled(r, key)
    if found is None:
        return []
    part, row, accs = found
    return [
        f"| | distilled from {_teacher_name(part)} fine-tuned ({config}) | "
        f"{_headline_cells(accs, part['runs'][row]['seeds'])} |"
    ]


def _headline_cells(accs: list[float], seeds: dict) -> str:
    """A headline row's two last cells: each seed's accuracy (naming the seeds unless they are
    0, 1 and 2) and their mean ± std (empty for one seed)."""
    keys = sorted(seeds, key=int)
    which = "" if keys == ["0", "1", "2"] else f" (seed{'s' * (len(keys) > 1)} {', '.join(keys)})"
    return f"{_seed_list(accs)}{which} | {_mean_std(accs) if len(accs) > 1 else ''}"


def verdict(r: dict) -> str:
    """The plain reading of `headline`, worded from the numbers."""
    acc, im = r["accuracy"], r["imdb"]
    b, ib = _baseline(acc), im["tfidf_word12_sublinear_logreg"]
    on, off, imdb = _seeds(acc["seeds"]), _seeds(acc["no_attention"]), _seeds(im["seeds"])
    margin = float(np.mean(on) - np.mean(off))
    above = [a - ib["test_accuracy"] for a in imdb]
    tuned, chinese_run = "", _chinese_finetuned(r)
    if chinese_run:
        name, _, accs = chinese_run
        own = r["chinese"]["runs"]["tfidf"]["test_accuracy"]
        gap = float(np.mean(accs)) - own
        each = ""
        if len(accs) > 1:
            each = f" on average over {len(accs)} seeds"
            if min(accs) > own:
                each += f" ({_points(min(accs) - own)}-{_points(max(accs) - own)} each)"
        tuned = (
            f" Fine-tuned, {name} is {_points(gap)} points {'above' if gap > 0 else 'below'} "
            f"its own run's TF-IDF ({_pct(own)}%){each}."
        )
    found = _distilled(r, distill.CHINESE)
    taught = ""
    if found:
        part, _, accs = found
        gap = float(np.mean(accs)) - b["test_accuracy"]
        taught = (
            f" Distilled from it (`configs/distill.py`), attn's own model is {_points(gap)} points "
            f"{'above' if gap > 0 else 'below'} the better TF-IDF"
            + (" (every seed above)" if min(accs) > b["test_accuracy"] else "")
            + "."
        )
    noise = ""
    if "audit" in r:
        wrong, unclear = audit.noise_shares(r["audit"])
        noise = (
            f" Read by hand, {_pct(wrong)}% of the embedded test labels are wrong and "
            f"{_pct(unclear)}% of its texts unclear."
        )
    return (
        f"On the embedded reviews the model {_compare(on, b)}; "
        f"attention adds {_points(margin)} points of mean test accuracy over the same model "
        f"without it.{tuned}{taught} On IMDB the model {_compare(imdb, ib)}"
        + (
            f" (every seed above, by {_points(min(above))}-{_points(max(above))} points)"
            if min(above) > 0
            else ""
        )
        + "."
        + noise
    )


def accuracy(r: dict) -> str:
    """The embedded data's table with wall times and commands (docs/results.md)."""
    acc = r["accuracy"]
    on, off = _seeds(acc["seeds"]), _seeds(acc["no_attention"])
    st, b, bs = acc["structured"], acc["tfidf_logreg"], acc["tfidf_sublinear_logreg"]
    return "\n".join(
        [
            "| model | test accuracy, seeds 0 / 1 / 2 | mean ± std | wall time | command |",
            "| --- | --- | --- | --- | --- |",
            f"| `configs/{acc['config']}` | {_seed_list(on)} | {_mean_std(on)} | "
            f"{_walls(acc['seeds'])} | `make train` (`--config.train.seed=N` for the others) |",
            f"| the same without attention (`--config.model.num_layers=0`) | {_seed_list(off)} | "
            f"{_mean_std(off)} | {_walls(acc['no_attention'])} | |",
            f"| `configs/{acc['config']}:structured` (Lin et al. 2017 pooling) | "
            f"{_pct(st['test_accuracy'])}% (seed 0) | | {st['wall_s']:.0f} s | "
            f"`python -m experiments.train --config=configs/{acc['config']}:structured "
            "--workdir=runs/structured` |",
            f"| {b['features']} TF-IDF + logistic regression, C chosen on validation | "
            f"{_pct(b['test_accuracy'])}% | | {b['wall_s']:.0f} s | "
            "`python -m benchmarks accuracy` |",
            f"| the same with sublinear tf (1 + log tf) | {_pct(bs['test_accuracy'])}% | | "
            f"{bs['wall_s']:.0f} s | `python -m benchmarks accuracy` |",
        ]
    )


def imdb(r: dict) -> str:
    """IMDB per seed against its TF-IDF baseline (docs/results.md)."""
    im = r["imdb"]
    b = im["tfidf_word12_sublinear_logreg"]
    accs = _seeds(im["seeds"])
    lines = [
        "| model | test accuracy, seeds 0 / 1 / 2 | mean ± std | wall time |",
        "| --- | --- | --- | --- |",
        f"| `configs/{im['config']}` | {_seed_list(accs)} | {_mean_std(accs)} | "
        f"{_walls(im['seeds'])} |",
        f"| {b['features']} TF-IDF (sublinear tf) + logistic regression | "
        f"{_pct(b['test_accuracy'])}% | | {b['wall_s']:.0f} s |",
    ]
    lines += [f"| {name}, published | {_pct(a)}% | | |" for name, a in im["anchors"].items()]
    return "\n".join(lines)


def _minutes(runs: list[dict]) -> str:
    walls = [r["wall_s"] / 60 for r in runs]
    return f"{min(walls):.0f}-{max(walls):.0f} min" if len(walls) > 1 else f"{walls[0]:.0f} min"


def _seed_words(sec: dict, row: str) -> str:
    keys = sorted(sec["runs"][row].get("seeds", {}), key=int)
    return f"seed{'s' if len(keys) > 1 else ''} {', '.join(keys)}" if keys else ""


def finetune_table(sec: dict) -> str:
    """Every row of the finetune section: test per seed, mean, validation, wall time."""
    lines = [
        "| model | test accuracy | mean | best validation (mean) | wall time per run |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row, label in finetune.LABELS.items():
        runs = finetune.runs(sec, row)
        if not runs:
            continue
        accs = [x["test_accuracy"] for x in runs]
        if row == "tfidf":
            b = runs[0]
            val = f"{_pct(b['validation_accuracy'][str(b['best_C'])])}% (C={b['best_C']:g})"
            lines.append(
                f"| {label} | {_pct(b['test_accuracy'])}% | | {val} | {b['wall_s']:.0f} s |"
            )
            continue
        val = np.mean([x["best_validation_accuracy"] for x in runs])
        lines.append(
            f"| {label} | {_seed_list(accs)} ({_seed_words(sec, row)}) | {_pct(np.mean(accs))}% | "
            f"{_pct(val)}% | {_minutes(runs)} |"
        )
    return "\n".join(lines)


def finetune_headline(r: dict) -> str:
    """The README's rows of the finetune section: mean test accuracy and cost."""
    sec = r["finetune"]
    n = sec["runs"]["tfidf"]["num_test"]
    lines = [
        f"| English sentences ({n:,} test) | test accuracy, mean | wall time per run |",
        "| --- | --- | --- |",
    ]
    short = {
        "finetuned": "fine-tuned (`configs/finetune.py`)",
        "attention_off": "its embeddings alone (attention off)",
        "scratch": "attn from scratch (`configs/csv.py`)",
        "tfidf": "TF-IDF + logistic regression",
    }
    for row, label in short.items():
        runs = finetune.runs(sec, row)
        if runs:
            seeds = f" ({_seed_words(sec, row)})" if row != "tfidf" else ""
            mean = np.mean([x["test_accuracy"] for x in runs])
            wall = f"{runs[0]['wall_s']:.0f} s" if row == "tfidf" else _minutes(runs)
            lines.append(f"| {label} | {_pct(mean)}%{seeds} | {wall} |")
        found = _distilled(r, os.path.basename(sec["data_path"]))
        if row == "finetuned" and found:
            part, kept, accs = found
            runs = list(part["runs"][kept]["seeds"].values())
            seeds = ", ".join(sorted(part["runs"][kept]["seeds"], key=int))
            lines.append(
                f"| attn's own model distilled from it (`configs/distill.py:csv`) | "
                f"{_pct(np.mean(accs))}% (seed{'s' * (len(accs) > 1)} {seeds}) | "
                f"{_minutes(runs)} |"
            )
    return "\n".join(lines)


def finetune_verdict(r: dict) -> str:
    """The plain reading of `finetune_headline`, worded from the numbers and its targets."""
    sec = r["finetune"]
    t = sec["targets"]
    off, bar = t["attention_earns"], t["beats_scratch_and_tfidf"]
    ft = off["finetuned_mean"]
    if ft is None or off["bar"] is None or bar["bar"] is None:
        return "The fine-tuned encoder and its ablations are not all measured yet."

    def side(other: float) -> str:
        return f"{_points(ft - other)} points {'above' if ft > other else 'below'}"

    def met(t: dict) -> str:
        said, gaps = f"{'met' if t['met'] else 'missed'} on the mean", t["seed_gaps"]
        seeds = zip(t["finetuned_seeds"], gaps, strict=True)
        short = [(s, g) for s, g in seeds if not finetune.clears(g)]
        if not short:
            return f"{said}, every seed"
        return f"{said}; seed " + ", ".join(f"{s}: {_points(g)}" for s, g in short)

    said = (
        f"Fine-tuned, the pretrained encoder is {side(off['bar'])} the same embeddings without "
        f"attention (target 5: {met(off)}) and {side(bar['bar'])} the better of TF-IDF and attn "
        f"from scratch (target 5: {met(bar)})."
    )
    bag = t.get("bag_beats_scratch_and_tfidf", {})
    if bag.get("finetuned_mean") is not None:
        gap = bag["finetuned_mean"] - bag["bar"]
        said += (
            f" With the bag (`configs/finetune.py:bag`): "
            f"{_pct(bag['finetuned_mean'])}%, {_points(gap)} points "
            f"{'above' if gap > 0 else 'below'} it (target 5: {met(bag)})."
        )
    return said


def chinese_table(sec: dict) -> str:
    """The chinese section's rows: test and best validation per seed, mean, wall time; the run's
    own TF-IDF; the learning rate chosen on validation."""
    lines = [
        "| row | test accuracy by seed | mean | best validation by seed | wall time per run |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in chinese.ROWS:
        runs = chinese.seeds_of(sec, row)
        if row == "tfidf" or not runs:
            continue
        seeds = sorted(runs, key=int)
        accs = [runs[k]["test_accuracy"] for k in seeds]
        val = " / ".join(f"{_pct(runs[k]['best_validation_accuracy'])}%" for k in seeds)
        lines.append(
            f"| {chinese.LABELS[row]} | {_seed_list(accs)} (seed{'s' * (len(seeds) > 1)} "
            f"{', '.join(seeds)}) | {_pct(np.mean(accs))}% | {val} | "
            f"{_minutes([runs[k] for k in seeds])} |"
        )
    tfidf = sec["runs"].get("tfidf")
    if tfidf:
        lines.append(
            f"| {chinese.LABELS['tfidf']} | {_pct(tfidf['test_accuracy'])}% | | "
            f"{_pct(tfidf['validation_accuracy'][str(tfidf['best_C'])])}% "
            f"(C={tfidf['best_C']:g}) | {tfidf['wall_s']:.0f} s |"
        )
    row = chinese.chosen_rate(sec)
    if row:
        lines += ["", f"Chosen on validation: {chinese.LABELS[row]}."]
    return "\n".join(lines)


def audit_summary(sec: dict) -> str:
    """The label audit in one paragraph: the estimated noise, what reading by hand found."""
    w, u = sec["audited"]["1"], sec["audited"]["0"]
    return (
        f"Confident learning (cleanlab) over 5-fold out-of-fold probabilities of char 1-3-gram "
        f"TF-IDF + logistic regression on all {sec['num_texts']:,} texts estimates "
        f"**{sec['noise_rate']:.1%}** of the labels wrong (the confident joint's off-diagonal "
        f"mass: {sec['joint_off_diagonal']:.1%}); it flags {sec['flagged']:,} texts, "
        f"{sec['test_flagged']} of the test split's {sec['num_test']:,}. Read by hand "
        f"(`benchmarks/data/chinese_reviews_audit.csv`): {w} flagged test texts (all of them) "
        f"and {u} unflagged ones drawn at random. The given label is wrong on "
        f"**{sec['given_wrong']['1']:.1%}** of the flagged texts and "
        f"**{sec['given_wrong']['0']:.1%}** of the unflagged ones that state a sentiment; "
        f"{sec['unclear']['1']} flagged and {sec['unclear']['0']} unflagged texts state none, or "
        "both (left out of the audited accuracies)."
    )


def label_noise(r: dict) -> str:
    """What the audit says the embedded labels are worth, in one sentence."""
    if "audit" not in r:
        return "How many of these labels are wrong is not measured yet."
    wrong, unclear = audit.noise_shares(r["audit"])
    return (
        f"Read by hand, about {_pct(wrong)}% of the test split's labels are wrong and "
        f"{_pct(unclear)}% of its texts state no sentiment, or both "
        f"([results.md](results.md#how-noisy-the-embedded-labels-are)): every accuracy on this "
        "data counts a right answer on a wrongly labelled text as an error."
    )


def audit_table(sec: dict) -> str:
    """Each model's accuracy on the audited texts against the given and the audited labels."""
    lines = [
        "Each model's accuracy on the audited texts, against the given labels and the audited "
        "ones, by stratum, and reweighted to the whole test split by the strata's sizes. The "
        "flags come from TF-IDF's own out-of-fold probabilities, so on the flagged texts TF-IDF "
        "disagrees with the given label by construction, and agrees with a corrected one more "
        "often than a model that makes other errors would.",
        "",
        "| model | given labels: flagged / unflagged / test estimate | audited labels: flagged / "
        "unflagged / test estimate |",
        "| --- | --- | --- |",
    ]
    flagged = sec["test_flagged"] / sec["num_test"]
    weights = {"flagged": flagged, "unflagged": 1.0 - flagged}
    read = {  # texts each accuracy is over: all read, or those that state a sentiment
        "label": {"flagged": sec["audited"]["1"], "unflagged": sec["audited"]["0"]},
        "audited": {
            "flagged": sec["audited"]["1"] - sec["unclear"]["1"],
            "unflagged": sec["audited"]["0"] - sec["unclear"]["0"],
        },
    }
    for name, m in sec["models"].items():
        cells = []
        for k in ("label", "audited"):
            se = math.sqrt(
                sum(w**2 * _stderr(m[k][s], read[k][s]) ** 2 for s, w in weights.items())
            )
            cells.append(
                f"{m[k]['flagged']:.1%} / {m[k]['unflagged']:.1%} / "
                f"{m[k]['test_estimate']:.1%} ± {se:.1%}"
            )
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        f"± is one standard error of the test estimate: the {sec['audited']['0']} unflagged texts "
        f"stand for {weights['unflagged']:.0%} of the test split, so models closer than about "
        "two standard errors are not told apart by this sample.",
    ]
    return "\n".join(lines)


def traditional_summary(sec: dict) -> str:
    """What OpenCC's s2t does to the embedded test split, in one sentence."""
    return (
        f"OpenCC's s2t changes {sec['changed_characters']:.1%} of the characters of the embedded "
        f"test split ({sec['changed_texts']:,} of its {sec['num_test']:,} texts), and t2s gives "
        f"back {sec['round_trip_exact']:.1%} of the texts exactly."
    )


def traditional_table(sec: dict) -> str:
    """Each model's test accuracy and unknown tokens on the simplified split, its traditional
    copy as it is and the copy read with --convert=t2s, and predict's answer for one sentence."""
    names = list(traditional.CONDITIONS)
    said = {
        k: sec["models"][next(iter(sec["models"]))]["predict"][k]["text"] for k in names
    }  # the sentence as each condition gives it, the same for every model
    lines = [
        "| model | measure | " + " | ".join(traditional.CONDITIONS.values()) + " |",
        "| --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for name, m in sec["models"].items():
        cells = {
            "test accuracy": [f"{_pct(m[k]['accuracy'])}%" for k in names],
            "tokens unknown": [f"{m[k]['unknown_tokens']:.2%}" for k in names],
            "predict, the sentence below": [
                f"{m['predict'][k]['label']} {m['predict'][k]['probability']:.3f}" for k in names
            ],
        }
        lines += [f"| {name} | {what} | {' | '.join(c)} |" for what, c in cells.items()]
    lines += [
        "",
        f"Each column holds the same {sec['num_test']:,} test texts and labels; tokens unknown: "
        "the share of their tokens outside the model's vocabulary. predict's sentence is "
        f"{said['simplified']} in simplified, {said['traditional']} in traditional (label and "
        "probability).",
    ]
    return "\n".join(lines)


def distill_table(part: dict) -> str:
    """One data's distill rows: test per seed, mean, best validation, wall time; the teacher,
    every distilled row (the chosen one marked), augmentation alone, the student alone, TF-IDF."""
    if not part:
        return "Not measured yet."
    lines = [
        "| model | test accuracy | mean | best validation (mean) | wall time per run |",
        "| --- | --- | --- | --- | --- |",
    ]
    if "teacher_row" in part:
        t = part["teacher_row"]
        lines.append(
            f"| the teacher: {_teacher_name(part)} fine-tuned (`configs/finetune.py`, seed 0) | "
            f"{_pct(t['test_accuracy'])}% | | {_pct(t['best_validation_accuracy'])}% | |"
        )
    taught = sorted(part["runs"], key=lambda row: (not distill.ROW.fullmatch(row), row))
    for row in taught:
        seeds = part["runs"][row]["seeds"]
        if not seeds:
            continue
        accs, runs = _seeds(seeds), [seeds[s] for s in sorted(seeds, key=int)]
        keys = ", ".join(sorted(seeds, key=int))
        name = distill.label(row) + (" **(chosen on validation)**" if row == part["chosen"] else "")
        val = np.mean([x["best_validation_accuracy"] for x in runs])
        lines.append(
            f"| {name} | {_seed_list(accs)} (seed{'s' * (len(accs) > 1)} {keys}) | "
            f"{_pct(np.mean(accs))}% | {_pct(val)}% | {_minutes(runs)} |"
        )
    if part.get("alone"):
        accs = _seeds({s: {"test_accuracy": a} for s, a in part["alone"].items()})
        where = "section 3" if part["data_path"] == "" else "section 8"
        lines.append(
            f"| the same student alone ({where}) | {_seed_list(accs)} | {_pct(np.mean(accs))}% | "
            "| |"
        )
    if "tfidf" in part:
        b = part["tfidf"]
        val = f"{_pct(b['validation_accuracy'][str(b['best_C'])])}% (C={b['best_C']:g})"
        lines.append(
            f"| {b['features']} TF-IDF (sublinear tf) + logistic regression | "
            f"{_pct(b['test_accuracy'])}% | | {val} | {b['wall_s']:.0f} s |"
        )
    return "\n".join(lines)


def distill_speed(part: dict) -> str:
    """The chosen student against its teacher, served: texts a second and the speed-up."""
    s = part.get("speed")
    if not s:
        return "Serving speed not measured yet."
    lines = [
        "| served | student | teacher | student / teacher, texts a second |",
        "| --- | --- | --- | --- |",
    ]
    for what, name in (
        ("predict_path", f"predict --path over {s['texts']:,} texts"),
        ("forward", f"one forward at batch {s['batch']}"),
    ):
        x = s[what]
        lines.append(
            f"| {name} | {x['student_s']:.3f} s ({x['student_texts_per_s']:,.0f} texts/s) | "
            f"{x['teacher_s']:.3f} s ({x['teacher_texts_per_s']:,.0f} texts/s) | "
            f"**{x['speedup']:.1f}x** |"
        )
    return "\n".join(lines)


def _distill_part(r: dict, key: str) -> dict:
    """The distill section's part for `key`'s data; {} before it has run."""
    return r.get("distill", {}).get("data", {}).get(key, {})


def _english_key(r: dict) -> str:
    return os.path.basename(r.get("finetune", {}).get("data_path", ""))


def finetune_imdb(sec: dict) -> str:
    """The finetune section's IMDB row: each seed's test accuracy against IMDB_BARS."""
    imdb = sec.get("imdb", {})
    seeds = imdb.get("seeds", {})
    if not seeds:
        return "The IMDB fine-tune is not measured yet."
    lines = [
        "| IMDB official split | test accuracy | best validation | wall time |",
        "| --- | --- | --- | --- |",
    ]
    for seed in sorted(seeds, key=int):
        x = seeds[seed]
        lines.append(
            f"| `configs/{imdb['config']}`, seed {seed} | {_pct(x['test_accuracy'])}% | "
            f"{_pct(x['best_validation_accuracy'])}% (step {x['best_step']}) | "
            f"{_minutes([x])} |"
        )
    above = imdb["every_seed_above"]
    lines.append("")
    lines.append(
        "Every seed run above "
        + "; ".join(
            f"{name}'s {_pct(finetune.IMDB_BARS[name])}%: {'yes' if ok else 'no'}"
            for name, ok in above.items()
        )
        + "."
    )
    return "\n".join(lines)


def _range(xs: list[float], fmt: str = ".2f") -> str:
    return f"{min(xs):{fmt}}-{max(xs):{fmt}}"


def speed(r: dict) -> str:
    """The timing and memory ratios of the attention, train-step and multihost sections."""
    att, tr, mh = r["attention"], r["train"], r["multihost"]
    d = min(x["D"] for x in att["rows"])
    ran = [x for x in att["rows"] if x["mode"] == "fwd_bwd" and x["D"] == d and "time_s" in x]
    time = {(x["method"], x["L"]): x["time_s"] for x in ran}
    both = sorted(L for (m, L) in time if m == "matrix" and ("jax.nn", L) in time)
    mat = [time[("matrix", L)] / time[("jax.nn", L)] for L in both]
    chk = [time[("chunked", L)] / time[("matrix", L)] for L in both]
    mem = {(x["method"], x["L"]): x["temp_bytes"] for x in att["rows"] if x["mode"] == "fwd_bwd"}
    long = att["targets"]["chunked_long"]
    c8 = att["targets"]["chunked_memory"]["L"]
    one_head = {x["L"]: x["temp_bytes"] for x in att["scaling"] if x["mask"] == "none"}
    ratios = [x["ratio"] for x in tr["rows"]]
    bt = att["batched"]
    return "\n".join(
        [
            f"- **Speed** (float32, batch {att['batch']}, {att['heads']} heads, head dim {d}): "
            f"forward+backward of the matrix form takes {_range(mat)}x the time of "
            f"`jax.nn.dot_product_attention` at L = {both[0]} to {both[-1]}; chunked takes "
            f"{_range(chk)}x the matrix form's time. `attn.dot_product_attention` compiles to "
            f"the same program as `attn.attention` under `jax.vmap` "
            f"({'all' if bt['all_same_program'] else 'not all'} {len(bt['same_program'])} pairs "
            f"compared); their timed ratios, {_range([x['ratio'] for x in bt['ratios']])}x, are "
            "the machine's noise.",
            f"- **Memory**: at L={c8}, chunked forward+backward needs "
            f"{mem[('chunked', c8)] / 2**20:.0f} MiB of XLA temp memory against the matrix "
            f"form's {mem[('matrix', c8)] / 2**30:.0f} GiB; at L={long['L']} it runs in "
            f"{mem[('chunked', long['L'])] / 2**20:.0f} MiB where the matrix form would need "
            f"{mem[('matrix', long['L'])] / 2**30:.0f} GiB. On one head, "
            + " / ".join(f"{one_head[L] / 2**20:.1f}" for L in sorted(one_head))
            + " MiB at L = "
            + " / ".join(f"{L // 1024}k" for L in sorted(one_head))
            + ": linear in L, causal mask included.",
            f"- **Train step**: {_range(ratios)}x the examples/s of a `flax.linen` twin built "
            "from `nn.MultiHeadDotProductAttention` with the same parameter count "
            f"({tr['param_count']['ours']:,}); the input pipeline takes "
            f"{tr['pipeline']['wait_fraction']:.1%} of the step time.",
            f"- **Several processes**: two processes of {mh['devices'] // 2} CPU devices take "
            f"{mh['ratio']:.2f}x the step time of one process of {mh['devices']} at "
            f"`configs/{mh['config']}`.",
        ]
    )


def _peer_names(sec: dict) -> list[str]:
    """The peers that were timed, in the section's order."""
    return [n for n in sec["sides"] if n != "attn"]


def _ratio_cell(x: dict | None, seconds: str = ".3f") -> str:
    """attn / peer in bold, its quartiles over rounds, the peer's median seconds."""
    if x is None or "ratio" not in x:
        return "n/a" if x is None else x.get("skipped", "n/a")
    q = x.get("ratio_quartiles")
    spread = f" [{q[0]:.2f}, {q[1]:.2f}]" if q else ""
    return f"**{x['ratio']:.2f}**{spread}, {x['median_s']:{seconds}} s"


def peers_table(sec: dict) -> str:
    """The peers section's ratios attn / peer per task and shape (< 1: attn faster), with their
    quartiles over rounds and the peer's median seconds."""
    names = _peer_names(sec)
    rows = [["task", "batch × L", "attn", *names], ["---"] * (3 + len(names))]
    for task, r in [("fine-tuning step", x) for x in sec["train"]] + [("serving", sec["serve"])]:
        rows.append(
            [task, f"{r['batch']} × {r['L']}", f"{r['attn']['median_s']:.3f} s"]
            + [_ratio_cell(r.get(n)) for n in names]
        )
    cold = sec["cold_start"]
    if "median_s" in cold.get("attn", {}):
        b, length = cold["shape"]
        rows.append(
            ["cold start (new process)", f"{b} × {length}", f"{cold['attn']['median_s']:.1f} s"]
            + [_ratio_cell(cold.get(n), ".1f") for n in names]
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def peers(r: dict) -> str:
    """One line per peer: attn's time over the peer's, fine-tuning and serving."""
    sec = r["peers"]
    lines = []
    for name in _peer_names(sec):
        train = [x[name]["ratio"] for x in sec["train"] if name in x]
        shapes = " / ".join(f"{x['batch']}×{x['L']}" for x in sec["train"] if name in x)
        parts = []
        if train:
            parts.append(
                "fine-tuning step " + " / ".join(f"{x:.2f}" for x in train) + f" at {shapes}"
            )
        if name in sec["serve"]:
            s = sec["serve"]
            parts.append(f"serving {s[name]['ratio']:.2f} at {s['batch']}×{s['L']}")
        if "ratio" in sec["cold_start"].get(name, {}):
            parts.append(f"cold start {sec['cold_start'][name]['ratio']:.2f}")
        lines.append(f"- attn / {name}: " + "; ".join(parts) + ".")
    return "\n".join(lines)


# Inline facts, for prose that names one number of a table rendered elsewhere.
FACTS: dict[str, Callable[[dict], str]] = {
    "default-seeds": lambda r: _seed_list(_seeds(r["accuracy"]["seeds"])),
    "default-mean": lambda r: _pct(np.mean(_seeds(r["accuracy"]["seeds"]))) + "%",
    "default-mean-std": lambda r: _mean_std(_seeds(r["accuracy"]["seeds"])),
    "no-attention-mean-std": lambda r: _mean_std(_seeds(r["accuracy"]["no_attention"])),
    "imdb-mean-std": lambda r: _mean_std(_seeds(r["imdb"]["seeds"])),
    "default-seed0": lambda r: _pct(r["accuracy"]["seeds"]["0"]["test_accuracy"]) + "%",
    "no-attention-seeds": lambda r: _seed_list(_seeds(r["accuracy"]["no_attention"])),
    "no-attention-mean": lambda r: _pct(np.mean(_seeds(r["accuracy"]["no_attention"]))) + "%",
    "tfidf": lambda r: _pct(r["accuracy"]["tfidf_logreg"]["test_accuracy"]) + "%",
    "tfidf-sublinear": lambda r: (
        _pct(r["accuracy"]["tfidf_sublinear_logreg"]["test_accuracy"]) + "%"
    ),
    "imdb-seeds": lambda r: _seed_list(_seeds(r["imdb"]["seeds"])),
    "imdb-mean": lambda r: _pct(np.mean(_seeds(r["imdb"]["seeds"]))) + "%",
    "imdb-seed0": lambda r: _pct(r["imdb"]["seeds"]["0"]["test_accuracy"]) + "%",
    "imdb-tfidf": lambda r: _pct(r["imdb"]["tfidf_word12_sublinear_logreg"]["test_accuracy"]) + "%",
}


def _finetune_mean(r: dict, row: str) -> str:
    return _pct(np.mean([x["test_accuracy"] for x in finetune.runs(r["finetune"], row)])) + "%"


FACTS |= {
    "finetune-seeds": lambda r: _seed_list(
        [x["test_accuracy"] for x in finetune.runs(r["finetune"], "finetuned")]
    ),
    "finetune-mean": lambda r: _finetune_mean(r, "finetuned"),
    "finetune-off-mean": lambda r: _finetune_mean(r, "attention_off"),
    "finetune-scratch-mean": lambda r: _finetune_mean(r, "scratch"),
    "finetune-tfidf": lambda r: _finetune_mean(r, "tfidf"),
    "finetune-frozen": lambda r: _finetune_mean(r, "frozen"),
    "finetune-random": lambda r: _finetune_mean(r, "random_init"),
    "finetune-bag": lambda r: _finetune_mean(r, "finetuned_bag"),
    "finetune-all-epochs": lambda r: _finetune_mean(r, "finetuned_all_epochs"),
    "finetune-bag-layer-decay": lambda r: _finetune_mean(r, "finetuned_bag_layer_decay"),
    "finetune-bag-no-ema": lambda r: _finetune_mean(r, "finetuned_bag_no_ema"),
    "finetune-no-ema": lambda r: _finetune_mean(r, "finetuned_no_ema"),
    "finetune-bag-no-ema-seeds": lambda r: _seed_list(
        [x["test_accuracy"] for x in finetune.runs(r["finetune"], "finetuned_bag_no_ema")]
    ),
    "finetune-bag-seeds": lambda r: _seed_list(
        [x["test_accuracy"] for x in finetune.runs(r["finetune"], "finetuned_bag")]
    ),
}
RENDER: dict[str, Callable[[dict], str]] = {
    "headline": headline,
    "verdict": verdict,
    "accuracy": accuracy,
    "imdb": imdb,
    "speed": speed,
    "finetune": lambda r: finetune_table(r["finetune"]),
    "finetune-headline": finetune_headline,
    "finetune-verdict": finetune_verdict,
    "finetune-imdb": lambda r: finetune_imdb(r["finetune"]),
    "peers": peers,
    "chinese": lambda r: chinese_table(r["chinese"]) if "chinese" in r else "Not measured yet.",
    "label-noise": label_noise,
    "audit": lambda r: (
        f"{audit_summary(r['audit'])}\n\n{audit_table(r['audit'])}"
        if "audit" in r
        else "Not measured yet."
    ),
    "traditional": lambda r: (
        f"{traditional_summary(r['traditional'])}\n\n{traditional_table(r['traditional'])}"
        if "traditional" in r
        else "Not measured yet."
    ),
    "distill-chinese": lambda r: distill_table(_distill_part(r, distill.CHINESE)),
    "distill-english": lambda r: distill_table(_distill_part(r, _english_key(r))),
    "distill-chinese-speed": lambda r: distill_speed(_distill_part(r, distill.CHINESE)),
    "distill-english-speed": lambda r: distill_speed(_distill_part(r, _english_key(r))),
    **FACTS,
}


def render(text: str, results: dict) -> str:
    """`text` with every marked region rendered from `results`; unknown names are an error."""

    def one(m: re.Match) -> str:
        name, old = m.group(1), m.group(2)
        if name not in RENDER:
            raise KeyError(f"unknown results region {name!r}; known: {', '.join(RENDER)}")
        new = RENDER[name](results)
        if old.startswith("\n"):  # a block keeps its own lines
            new = f"\n{new}\n"
        return f"<!-- results:{name} -->{new}<!-- /results:{name} -->"

    return MARKER.sub(one, text)


def pages(root: str = ROOT) -> list[str]:
    """Every page with regions, relative to root: README.md, docs/*.md, analysis.md."""
    out = []
    for p in PAGES:
        full = os.path.join(root, p)
        if os.path.isdir(full):
            out += sorted(os.path.join(p, f) for f in os.listdir(full) if f.endswith(".md"))
        elif os.path.exists(full):
            out.append(p)
    return out


def write(results: dict, root: str = ROOT) -> list[str]:
    """Render every page in place; returns the pages that changed."""
    changed = []
    for p in pages(root):
        path = os.path.join(root, p)
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = render(old, results)
        if new != old:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            changed.append(p)
    return changed
