"""Section 14: attn's own model distilled from a fine-tuned teacher (configs/distill.py), beside
the run's TF-IDF, the same student trained alone (sections 3 and 8), the same student on the
augmented texts without the teacher, and the teacher itself; and the student's serving speed
against the teacher's.

  python -m benchmarks distill --teacher=WORKDIR [--data_path=FILE] --workdirs=DIR
      [--seeds=0,1,2] [--rows=tfidf,teacher,soft-T2-w1-a8,mse-w1-a8,augmented-a8,speed]
      [--unlabeled=FILE]

Without --data_path the data is the embedded Chinese reviews (configs/distill.py, the student of
configs/default.py); with it, the file split 80/10/10 by text hash (configs/distill.py:csv, the
student of configs/csv.py). A row is one of

  tfidf             the TF-IDF baseline (sublinear tf) + logistic regression, C on validation:
                    char 1-3-grams on Chinese, word 1-2-grams otherwise, as sections 3 and 8
  teacher           the teacher's own test accuracy and best validation (its workdir's files)
  soft-T<t>-w<w>-a<k>  distilled: soft targets at temperature t, weight w of the teacher's term
                    on a training text, k augmented copies of each training text
  mse-w<w>-a<k>     distilled on the squared error between centred logits
  ...-u             either, with the texts of --unlabeled=FILE in the transfer set too
  augmented-a<k>    no teacher: the k copies with their texts' labels
  speed             the chosen student (seed 0) against the teacher, each served as predict
                    serves it: predict --path's batched forward over 1,000 test texts, and one
                    forward at batch 64; interleaved repeats, medians

The distilled row kept (`chosen`) is the one with the best mean validation accuracy over the
seeds every distilled row has run; test is read once per row and seed. A row's seeds of an
earlier call are kept while its recipe and teacher are the same; results.json is written after
every run. Each run's workdir is kept under DIR/distill/<data>/<row>/seed<N> (resumed if a call
was interrupted; served afterwards). The teacher's outputs are computed once: a new workdir
starts with a copy of the largest teacher_outputs.npz of the same data, which it reads back for
the texts it shares and completes (`experiments.training.teacher.outputs`).
"""

import json
import os
import re
import shutil
import statistics
import time
from collections.abc import Callable

import jax
import numpy as np

from benchmarks import as_row, config_file, timing
from benchmarks.accuracy import tfidf_baseline, train_variant
from experiments import fields, parallel, serving
from experiments.data import batching, datasets, encoding
from experiments.errors import UserError
from experiments.serving import rows as served_rows
from experiments.training import checkpoints, classify, teacher, workdir_reader

ROW = re.compile(r"(?:soft-T(?P<t>[\d.]+)|(?P<mse>mse))-w(?P<w>[\d.]+)-a(?P<a>\d+)(?P<u>-u)?")
AUGMENTED = re.compile(r"augmented-a(?P<a>\d+)")
FIXED = ("tfidf", "teacher", "speed")
DEFAULT_ROWS = ("tfidf", "teacher", "soft-T2-w1-a8", "mse-w1-a8", "augmented-a8", "speed")
CHINESE = "chinese_reviews"
SPEED_TEXTS, SPEED_BATCH, SPEED_REPEATS = 1000, 64, 5
# (points over TF-IDF on every seed, the moonshot's, whether it must beat the student alone)
TARGETS = {CHINESE: (0.005, 0.015, True), "file": (0.02, None, False)}
SPEEDUP = 10.0


def data_key(data_path: str) -> str:
    return os.path.basename(data_path) if data_path else CHINESE


def alone(results: dict, data_path: str) -> dict[str, float]:
    """The same student trained without a teacher, test accuracy by seed: section 3's
    configs/default.py on the embedded reviews, section 8's configs/csv.py on its file."""
    if not data_path:
        runs = results.get("accuracy", {}).get("seeds", {})
    else:
        ft = results.get("finetune", {})
        same = os.path.basename(ft.get("data_path", "")) == os.path.basename(data_path)
        runs = ft.get("runs", {}).get("scratch", {}).get("seeds", {}) if same else {}
    return {s: r["test_accuracy"] for s, r in runs.items()}


def overrides(row: str, unlabeled: str = "") -> dict:
    """The config fields a distilled or augmented row sets (a row ending in -u also reads the
    texts of `unlabeled`, data.unlabeled); UserError for an unknown row."""
    if m := ROW.fullmatch(row):
        loss = "mse" if m["mse"] else "soft"
        out = {"distill.loss": loss, "distill.weight": float(m["w"])}
        out["distill.temperature"] = 1.0 if m["mse"] else float(m["t"])
        if m["u"] and not unlabeled:
            raise UserError(f"--rows: {row} reads unlabeled texts: give --unlabeled=FILE")
        out |= {"data.unlabeled": (unlabeled,)} if m["u"] else {}
        return out | {"distill.augment": int(m["a"])}
    if m := AUGMENTED.fullmatch(row):
        return {"distill.teacher": "", "distill.augment": int(m["a"])}
    raise UserError(
        f"--rows: unknown row {row!r}; rows are {', '.join(FIXED)}, soft-T<t>-w<w>-a<k>, "
        "mse-w<w>-a<k> (each with -u: and the texts of --unlabeled) and augmented-a<k>"
    )


def label(row: str) -> str:
    """What a row is, in words."""
    if m := ROW.fullmatch(row):
        what = "logit MSE" if m["mse"] else f"soft targets at T={m['t']}"
        weight = "the teacher alone" if float(m["w"]) == 1 else f"weight {m['w']} on the teacher"
        more = ", and unlabeled texts" if m["u"] else ""
        return f"distilled: {what}, {weight}, {m['a']} augmented copies a text{more}"
    if m := AUGMENTED.fullmatch(row):
        return f"the same student on {m['a']} augmented copies a text, no teacher"
    return row


def row_config(row: str, quick: bool, data_path: str, teacher_dir: str, unlabeled: str = ""):
    """configs/distill.py (:csv with a file; :tiny with --quick) with the row's fields."""
    file = "distill.py:tiny" if quick else "distill.py:csv" if data_path else "distill.py"
    config = config_file(file)
    with config.unlocked():
        if data_path:
            config.data.dataset, config.data.path = "file", data_path
        config.distill.teacher = teacher_dir
        as_row(config, overrides(row, unlabeled), quick)
    return config


def run(
    quick: bool,
    data_path: str,
    teacher_dir: str,
    seeds: list[str],
    rows: list[str],
    previous: dict | None,
    save: Callable[[dict], None],
    workdirs: str,
    alone: dict[str, float],
    unlabeled: str = "",
) -> dict:
    """The distill section of results.json, its data's part replaced; `save(section)` after
    every run. `alone`: the same student trained without a teacher, test accuracy by seed (from
    section 3 or 8); `unlabeled`: the file of unlabeled texts the rows ending in -u read."""
    for row in rows:
        if row not in FIXED:
            overrides(row, unlabeled)  # refuses an unknown row before anything runs
    if not teacher_dir:
        raise UserError("distill needs --teacher=DIR (a fine-tuned workdir of the same data)")
    if not workdirs:
        raise UserError("distill needs --workdirs=DIR: the students are served afterwards")
    key = data_key(data_path)
    sec = dict(previous or {})
    old = sec.get("data", {}).get(key, {})
    same = old.get("teacher") == teacher_dir and old.get("quick") == quick
    part = {
        "data_path": data_path,
        "teacher": teacher_dir,
        "quick": quick,
        "alone": alone,
        "runs": dict(old.get("runs", {})) if same else {},
    }
    for name in ("tfidf", "teacher_row", "speed"):
        if same and name in old:
            part[name] = old[name]
    sec["data"] = {**sec.get("data", {}), key: part}

    def saved() -> None:
        part["chosen"] = chosen(part)
        sec["targets"] = targets(sec)
        sec["peak_rss_bytes"] = timing.peak_rss_bytes()
        save(sec)

    data = row_config("augmented-a0", quick, data_path, teacher_dir).data
    if "tfidf" in rows:
        start = time.perf_counter()
        chinese = not data_path
        grid = (1.0, 10.0) if quick else (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
        part["tfidf"] = tfidf_baseline(
            data,
            grid=grid if chinese else grid[1:],
            sublinear=True,
            analyzer="char" if chinese else "word",
            ngrams=(1, 3) if chinese else (1, 2),
        )
        part["tfidf"]["wall_s"] = time.perf_counter() - start
        saved()
    if "teacher" in rows:
        part["teacher_row"] = teacher_row(teacher_dir)
        saved()
    for row in (r for r in rows if r not in FIXED):
        config = row_config(row, quick, data_path, teacher_dir, unlabeled)
        recipe = json.loads(json.dumps(config.to_dict()))
        del recipe["train"]["seed"]
        before = part["runs"].get(row, {})
        kept = (
            before.get("seeds", {}) if fields.complete(before.get("recipe", {})) == recipe else {}
        )
        part["runs"][row] = {"recipe": recipe, "seeds": dict(kept)}
        for seed in seeds:
            with config.unlocked():
                config.train.seed = int(seed)
            workdir = os.path.join(workdirs, "distill", key, row, f"seed{seed}")
            if config.distill.teacher:
                _start_with_outputs(workdir, os.path.join(workdirs, "distill", key))
            r = train_variant(config, keep=workdir)
            del r["model"]  # the recipe has it
            part["runs"][row]["seeds"][seed] = r
            print(
                f"{row}, seed {seed}: test {r['test_accuracy']:.4f}, best validation "
                f"{r['best_validation_accuracy']:.4f} ({r['wall_s']:.0f} s)"
            )
            saved()
    if "speed" in rows:
        row = chosen(part)
        if row is None:
            raise UserError("the speed row needs a distilled row run first (seed 0)")
        workdir = os.path.join(workdirs, "distill", key, row, "seed0")
        test = datasets.load_splits(data, ("test",))["test"][0]
        part["speed"] = {"row": row, **speed(workdir, teacher_dir, test[:SPEED_TEXTS])}
        saved()
    saved()
    return sec


def _start_with_outputs(workdir: str, root: str) -> None:
    """A new workdir starts with the largest teacher outputs file under `root`."""
    mine = os.path.join(workdir, teacher.OUTPUTS)
    if os.path.exists(mine):
        return
    found = [
        os.path.join(d, teacher.OUTPUTS)
        for d, _, files in os.walk(root)
        if teacher.OUTPUTS in files and os.path.abspath(d) != os.path.abspath(workdir)
    ]
    if found:
        os.makedirs(workdir, exist_ok=True)
        shutil.copyfile(max(found, key=os.path.getsize), mine)


def teacher_row(teacher_dir: str) -> dict:
    """The teacher workdir's test accuracy (its eval_test.json) and best validation accuracy."""
    held = workdir_reader.read(teacher_dir)
    with open(os.path.join(teacher_dir, "eval_test.json"), encoding="utf-8") as f:
        test = json.load(f)
    return {
        "test_accuracy": test["accuracy"],
        "best_validation_accuracy": held.meta["best_val_accuracy"],
        "best_step": test["step"],
        "model": held.describe(),
        "family": checkpoints.family_of(held.meta),
        "pretrained": held.config.model.get("pretrained") or "",
    }


def _forward_batch(trained: serving.Trained, texts: list[str]) -> tuple[dict, object]:
    """The first `len(texts)` texts as one batch padded as evaluation pads it, on the devices,
    and the params there: what one served forward reads."""
    tok, data, add_cls = trained.tokenizer, trained.config.data, trained.cfg.pooling == "cls"
    raw = [tok.encode(t) for t in texts]
    frame = tok.specials.frame
    ids = encoding.cut(
        raw, max_len=trained.cfg.max_len, add_cls=add_cls, tail_len=data.tail_len, frame=frame
    )
    dp = parallel.data_parallel(data)
    _, batch = next(
        batching.eval_batches(
            ids,
            np.zeros(len(ids), np.int32),
            batch_size=len(texts),
            buckets=tuple(data.buckets),
            max_len=trained.cfg.max_len,
            bag_ids=encoding.bag_cut(raw, data, add_cls, frame),
            bag_len=data.bag_len,
        )
    )
    return dp.put(batch), parallel.replicate(trained.params, dp)


def speed(student_dir: str, teacher_dir: str, texts: list[str]) -> dict:
    """Texts a second of the student and the teacher, served: predict --path's batched forward
    (`serving.rows.predict`) over `texts`, and one forward of a batch of SPEED_BATCH of them;
    each compiled first, then interleaved repeats, medians."""
    models = {"student": serving.load(student_dir), "teacher": serving.load(teacher_dir)}

    def table() -> served_rows.Table:
        return served_rows.Table(
            ["text"], [served_rows.Row(f"line {i}", {"text": t}, t) for i, t in enumerate(texts)]
        )

    predict = {name: (lambda m=m: served_rows.predict(m, table())) for name, m in models.items()}
    forward = {}
    for name, m in models.items():
        batch, params = _forward_batch(m, texts[:SPEED_BATCH])
        forward[name] = lambda m=m, b=batch, p=params: classify.eval_step(p, b, cfg=m.cfg)
    out = {"texts": len(texts), "batch": SPEED_BATCH, "load_average": list(os.getloadavg())}
    for what, fns, n in (("predict_path", predict, len(texts)), ("forward", forward, SPEED_BATCH)):
        for fn in fns.values():
            jax.block_until_ready(fn())  # compiles
        seconds = timing.time_interleaved(fns, SPEED_REPEATS)
        medians = {name: statistics.median(s) for name, s in seconds.items()}
        out[what] = {
            **{f"{name}_s": s for name, s in medians.items()},
            **{f"{name}_texts_per_s": n / s for name, s in medians.items()},
            "speedup": medians["teacher"] / medians["student"],
        }
    return out


def chosen(part: dict) -> str | None:
    """The distilled row with the best mean best-validation accuracy over the seeds every
    distilled row has run (None before any); test is not looked at."""
    ran = {r: x["seeds"] for r, x in part["runs"].items() if ROW.fullmatch(r) and x["seeds"]}
    common = set.intersection(*(set(s) for s in ran.values())) if ran else set()
    if not common:
        return None

    def val(row: str) -> float:
        return float(np.mean([ran[row][s]["best_validation_accuracy"] for s in common]))

    return max(ran, key=val)


def targets(sec: dict) -> dict:
    """Per data: the chosen student's test accuracy on every seed against TF-IDF (and the student
    trained alone, on the Chinese reviews), and its serving speed against the teacher's."""
    out = {}
    for key, part in sec.get("data", {}).items():
        row, tfidf = part.get("chosen"), part.get("tfidf")
        if row and tfidf:
            need, moon, alone = TARGETS[CHINESE if key == CHINESE else "file"]
            accs = {s: r["test_accuracy"] for s, r in part["runs"][row]["seeds"].items()}
            gaps = {s: a - tfidf["test_accuracy"] for s, a in accs.items()}
            beats_alone = all(a > part["alone"].get(s, 1.0) for s, a in accs.items())
            for name, points in (("above_tfidf", need), ("moonshot", moon)):
                if points is None:
                    continue
                also = " and above the student trained alone" if alone else ""
                out[f"{key}: {name}"] = {
                    "target": f"{key}: the distilled student (chosen on validation) at least "
                    f"{points * 100:g} points above TF-IDF{also} on every seed",
                    "row": row,
                    "bar": tfidf["test_accuracy"],
                    "seed_gaps": gaps,
                    "met": bool(gaps)
                    and min(gaps.values()) >= points - 1e-9
                    and (beats_alone or not alone),
                }
        if "speed" in part:
            s = part["speed"]
            ups = [s["predict_path"]["speedup"], s["forward"]["speedup"]]
            out[f"{key}: speed"] = {
                "target": f"{key}: the student serves at least {SPEEDUP:g}x the teacher's texts a "
                f"second (predict --path over {s['texts']:,} texts; a forward at batch "
                f"{s['batch']})",
                "speedups": ups,
                "met": min(ups) >= SPEEDUP,
            }
    return out
