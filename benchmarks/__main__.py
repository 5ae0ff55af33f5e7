"""Benchmarks: attention kernels, the train step against Flax, and accuracy against baselines.

  python -m benchmarks [attention|train|accuracy|all] [--out=benchmarks] [--quick] [--seeds=0,1,2]
  python -m benchmarks imdb --imdb_path=DIR/aclImdb [--seeds=0,1,2]
  python -m benchmarks lra
  python -m benchmarks multihost
  python -m benchmarks bert [--bert_dir=DIR/all-MiniLM-L6-v2]
  python -m benchmarks finetune --bert_dir=DIR/all-MiniLM-L6-v2 --data_path=FILE.csv
      [--seeds=0,1,2] [--rows=tfidf,scratch,frozen,finetuned,attention_off,...]
  python -m benchmarks finetune --bert_dir=DIR/all-MiniLM-L6-v2 --rows=imdb --imdb_path=DIR/aclImdb
  python -m benchmarks chinese --pretrained=DIR/m3e-small [--seeds=0,1,2] [--rows=...]
      [--workdirs=DIR]
  python -m benchmarks audit --workdirs=DIR
  python -m benchmarks traditional --workdirs=DIR
  python -m benchmarks distill --teacher=WORKDIR [--data_path=FILE] --workdirs=DIR
      [--seeds=0,1,2] [--rows=tfidf,teacher,soft-T2-w1-a8,...,speed] [--unlabeled=FILE]
  python -m benchmarks peers --bert_dir=DIR/all-MiniLM-L6-v2
  python -m benchmarks device [--quick] [--imdb_path=DIR/aclImdb] [--lra_minutes=1.5]
      [--parts=attention,train,lra,bert,finetune] [--bert_dir=DIR/all-MiniLM-L6-v2]

`all` is the first three; `imdb` (tens of minutes per seed on 2 cores), `lra` (the cost of the
Long Range Arena configs), `multihost` (two processes against one, about 20 minutes), `bert`
(a fine-tuning step of a pretrained-size encoder; with --bert_dir, its numerics against
transformers), `finetune` (a pretrained encoder fine-tuned against its ablations, hours on
2 cores; results.json is written after each run), `distill` (attn's own model taught by a
fine-tuned teacher, against TF-IDF, itself alone and the teacher, and served against it),
`traditional` (the audit's models on the test split made traditional, as it is and with
--convert=t2s) and `peers` (attn's fine-tuning step and
serving against PyTorch, torch.compile, ONNX Runtime and transformers' Flax BERT on one
checkpoint, in a venv with requirements-peers.txt; tens of minutes) run only when named.
`device` is for a GPU or TPU (`benchmarks/device.py`): it writes `<out>/device.json` instead of a
section of results.json.

Writes `<out>/results.json` (sections not run keep their previous results), `<out>/REPORT.md`
with every target stated as met or missed, and PNG plots; prints a table per section.
Timings: compiled ahead of time, `block_until_ready`, methods interleaved within each repeat (so
drift hits all of them), median reported. Memory: XLA's exact `temp_size_in_bytes` from compiling
only, plus the process's peak RSS after each measurement.
`--quick` runs tiny sizes in seconds, a smoke test of the harness.
"""

import json
import os
import time

import jax
from absl import flags

from benchmarks import (
    accuracy,
    attention,
    audit,
    bert,
    chinese,
    device,
    distill,
    families,
    finetune,
    imdb,
    lra,
    multihost,
    peers,
    report,
    traditional,
    train_step,
)
from experiments import cli
from experiments.errors import UserError

# name -> run(flags, previous results of the section) -> results of the section
SECTIONS = {
    "attention": lambda fv, prev: attention.run(fv.quick),
    "train": lambda fv, prev: train_step.run(fv.quick),
    "accuracy": lambda fv, prev: accuracy.run(fv.quick, fv.seeds),
    "imdb": lambda fv, prev: imdb.run(fv.quick, fv.imdb_path, fv.seeds, prev),
    "lra": lambda fv, prev: lra.run(fv.quick),
    "multihost": lambda fv, prev: multihost.run(fv.quick),
    "bert": lambda fv, prev: bert.run(fv.quick, fv.bert_dir),
    "finetune": lambda fv, prev: finetune.run(
        fv.quick,
        fv.data_path,
        fv.bert_dir,
        fv.seeds,
        fv.rows,
        prev,
        save=lambda sec: _save_section(fv.out, "finetune", sec),
        imdb_path=fv.imdb_path,
    ),
    "chinese": lambda fv, prev: chinese.run(
        fv.quick,
        fv.pretrained,
        fv.seeds,
        fv.rows if fv["rows"].present else list(chinese.ROWS),
        prev,
        save=lambda sec: _save_section(fv.out, "chinese", sec),
        workdirs=fv.workdirs,
    ),
    "audit": lambda fv, prev: audit.run(
        fv.quick, audit.models_from(fv.workdirs, fv.quick, _read_out(fv).get("chinese"))
    ),
    "traditional": lambda fv, prev: traditional.run(
        fv.quick, audit.models_from(fv.workdirs, fv.quick, _read_out(fv).get("chinese"))
    ),
    "distill": lambda fv, prev: distill.run(
        fv.quick,
        fv.data_path,
        fv.teacher,
        fv.seeds,
        fv.rows if fv["rows"].present else list(distill.DEFAULT_ROWS),
        prev,
        save=lambda sec: _save_section(fv.out, "distill", sec),
        workdirs=fv.workdirs,
        alone=distill.alone(_read(os.path.join(fv.out, "results.json")), fv.data_path),
        unlabeled=fv.unlabeled,
    ),
    "peers": lambda fv, prev: peers.run(fv.quick, fv.bert_dir),
    "families": lambda fv, prev: families.run(fv.quick),
}
ALL = ("attention", "train", "accuracy")


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string(
        "out", "benchmarks", "Directory for results.json, REPORT.md, plots.", flag_values=fv
    )
    flags.DEFINE_bool(
        "quick", False, "Tiny sizes, one repeat: a smoke test in seconds.", flag_values=fv
    )
    flags.DEFINE_string(
        "imdb_path", "", "aclImdb folder for `imdb`; empty = TFDS imdb_reviews.", flag_values=fv
    )
    flags.DEFINE_list(
        "seeds", ["0", "1", "2"], "Seeds `accuracy` and `imdb` train.", flag_values=fv
    )
    flags.DEFINE_float(
        "lra_minutes", 1.5, "`device`: train steps of the LRA run, in minutes.", flag_values=fv
    )
    flags.DEFINE_list(
        "parts", list(device.PARTS), "`device`: which of its parts to run.", flag_values=fv
    )
    flags.DEFINE_string(
        "bert_dir",
        "",
        "`bert`: a BERT model directory to check numerics on; `finetune`: the one to tune; "
        "`peers`: the one every framework loads.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "data_path",
        "",
        "`finetune`, `distill`: the labelled file (text,label) to train on.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "teacher", "", "`distill`: the teacher, a fine-tuned workdir of the data.", flag_values=fv
    )
    flags.DEFINE_string(
        "unlabeled",
        "",
        "`distill`: unlabeled texts (data.unlabeled) that -u rows add to the transfer set.",
        flag_values=fv,
    )
    flags.DEFINE_list(
        "rows",
        list(finetune.ROWS),
        "`finetune`, `chinese`, `distill`: which rows of its table to run (default: all of that "
        "section's).",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "pretrained", "", "`chinese`: the Chinese model directory to fine-tune.", flag_values=fv
    )
    flags.DEFINE_string(
        "workdirs",
        "",
        "`chinese`: keep each run's workdir under DIR/chinese/<row>/seed<N> (default: deleted); "
        "`audit`, `traditional`: where their models are (DIR/audit/default, trained if missing; "
        "the chinese fine-tune's seed 0); "
        "`distill`: its students' workdirs, under DIR/distill/<data>/<row>/seed<N> (required).",
        flag_values=fv,
    )


def _read(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read previous results {path!r}: {e}") from None


def _read_out(fv: flags.FlagValues) -> dict:
    return _read(os.path.join(fv.out, "results.json"))


def _save_section(out: str, name: str, sec: dict) -> None:
    """One section's results so far into results.json and REPORT.md, the others as they are."""
    results = _read(os.path.join(out, "results.json"))
    results[name] = {**results.get(name, {}), **sec}
    report.write(results, out)


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    which = argv[1:] or ["all"]
    if len(which) != 1 or which[0] not in (*SECTIONS, "all", "device"):
        names = ", ".join((*SECTIONS, "all", "device"))
        raise UserError(f"benchmark must be one of {names}; got {which}")
    if which[0] == "device":
        device.run(fv.quick, fv.out, fv.imdb_path, fv.lra_minutes, fv.parts, fv.bert_dir, fv.seeds)
        return
    sections = list(ALL) if which[0] == "all" else [which[0]]
    if not fv.seeds or not all(s.isdigit() for s in fv.seeds):
        raise UserError(f"--seeds must be non-negative integers, got {','.join(fv.seeds)!r}")
    path = os.path.join(fv.out, "results.json")
    results = _read(path)
    for name in sections:
        start = time.perf_counter()
        results[name] = SECTIONS[name](fv, results.get(name))
        results[name]["wall_s"] = time.perf_counter() - start
        results[name]["quick"] = fv.quick
        report.write(results, fv.out)
    results["machine"] = {"cpu_count": os.cpu_count(), "jax": jax.__version__}
    report.write(results, fv.out)
    print(f"wrote {path} and {os.path.join(fv.out, 'REPORT.md')}")


if __name__ == "__main__":
    cli.main(define_flags, main)
