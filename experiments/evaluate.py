"""Evaluates a trained workdir on a split, or on a labelled file: accuracy, macro-F1, loss, the
confusion matrix, examples/s.

  python -m experiments.evaluate --workdir=runs/default [--split=test] [--checkpoint=best]
  python -m experiments.evaluate --workdir=runs/mine --path=new_reviews.csv

Prints a table and writes DIR/evaluate_<split>.json, or DIR/evaluate_file_<name>.json for --path:
every row of a CSV/TSV/JSONL file or folder that configs/csv.py could train on, whatever split its
hash would give, read with the training run's text and label fields unless --text_field and
--label_field say otherwise. Its labels must be ones the model was trained on; rows with another
label count as malformed. With --checkpoint=checkpoints (the last one) the name ends in `_last`.
With --convert=t2s texts are converted by that OpenCC conversion before the model reads them (by
default as the run converted its own, data.convert; '' converts none): the result records it,
stderr says how many texts it changed, and a conversion other than the run's ends the name in
`_t2s` (`_unconverted` for ''), so an evaluation as the run reads is kept beside it. The names
are evaluate's own: the eval_test.json training wrote (with its baseline, and the sign that
training finished) is never overwritten. Several processes run it like experiments.train (the
same flags), each reading its rows of every batch; process 0 prints and writes.
"""

import os
from pathlib import Path

import numpy as np
from absl import flags

from experiments import cli, parallel, serving, workdirs
from experiments.data import conversion, datasets, encoding, user_files
from experiments.data.splits import SPLITS
from experiments.errors import UserError
from experiments.training import checkpoints, classify

_FLAGS = user_files.Flags("--path", "--text_field", "--label_field")  # named in file errors


def evaluate_workdir(
    workdir: str, split: str, which: str = checkpoints.BEST, convert: str | None = None
) -> dict:
    """Evaluates the workdir's `which` checkpoint on `split` and writes `result_file`; texts are
    converted by `convert` (an OpenCC conversion), by default as the run converted its own."""
    run = serving.load(workdir, which)
    trained = serving.converting(run, convert)
    out = result_file(workdir, which, split=split, convert=_other(run.config.data.convert, convert))
    data = encoding.load(
        trained.config.data,
        (split,),
        add_cls=trained.cfg.pooling == "cls",
        tokenizer=trained.tokenizer,
    )
    if data.label_names != trained.label_names:
        raise UserError(
            f"labels of the {split} data {list(data.label_names)} differ from the checkpoint's "
            f"{list(trained.label_names)}"
        )
    return _evaluate(trained, data.splits[split], out)


def evaluate_file(
    workdir: str,
    path: str,
    which: str = checkpoints.BEST,
    text_field: str | None = None,
    label_field: str | None = None,
    convert: str | None = None,
) -> dict:
    """Evaluates the workdir's `which` checkpoint on every row of the labelled file or folder at
    `path` and writes `result_file` (see the module docstring); `convert` as in
    `evaluate_workdir`."""
    run = serving.load(workdir, which)
    trained = serving.converting(run, convert)
    out = result_file(workdir, which, path=path, convert=_other(run.config.data.convert, convert))
    d = trained.config.data
    options = datasets.file_options(d) | {"label_names": trained.label_names}
    options["text_field"] = text_field or options["text_field"]
    options["label_field"] = label_field or options["label_field"]
    parts = user_files.load(path, **options, flags=_FLAGS)
    texts, changed = serving.converted(trained, [t for s in SPLITS for t in parts[s][0]])
    conversion.report(d.convert, changed, len(texts))
    labels = np.concatenate([parts[s][1] for s in SPLITS])
    add_cls = trained.cfg.pooling == "cls"
    split = encoding.encode_split(trained.tokenizer, texts, labels, d, add_cls=add_cls)
    return _evaluate(trained, split, out, path=path)


def _other(own: str, convert: str | None) -> str | None:
    """`convert` where it differs from `own`, the run's data.convert, else None."""
    return None if convert is None or convert == own else convert


def result_file(
    workdir: str,
    which: str = checkpoints.BEST,
    split: str | None = None,
    path: str | None = None,
    convert: str | None = None,
) -> str:
    """Where the result goes: DIR/evaluate_<split>.json, or DIR/evaluate_file_<name>.json for a
    file; `_last` for the last checkpoint and `_<convert>` (`_unconverted` for '') for a
    conversion other than the run's, before .json."""
    name = f"file_{Path(path).stem}" if path else split
    name += "" if which == checkpoints.BEST else "_last"
    name += "" if convert is None else f"_{convert or 'unconverted'}"
    return os.path.join(workdir, f"evaluate_{name}.json")


def _evaluate(trained: serving.Trained, s: encoding.Split, out: str, **about: str) -> dict:
    dp = parallel.data_parallel(trained.config.data)
    params = parallel.replicate(trained.params, dp)
    result = classify.evaluate(
        params,
        trained.cfg,
        s.ids,
        s.labels,
        data=trained.config.data,
        dp=dp,
        bag_ids=s.bag_ids,
        desc="evaluate",
    )
    result["step"] = trained.step
    result["label_names"] = list(trained.label_names)
    if trained.config.data.convert:
        result["convert"] = trained.config.data.convert
    result.update(about)
    if parallel.is_primary():
        workdirs.write_json(out, result)
    return result


def format_table(result: dict, label_names: tuple[str, ...]) -> str:
    lines = [
        f"{'examples':<18}{result['num_examples']}",
        f"{'accuracy':<18}{result['accuracy']:.4f}",
        f"{'macro-F1':<18}{result['macro_f1']:.4f}",
        f"{'loss':<18}{result['loss']:.4f}",
        f"{'examples/s':<18}{result['examples_per_sec']:.0f}",
        "confusion (rows true, columns predicted):",
        " " * 12 + "".join(f"{n[:10]:>11}" for n in label_names),
    ]
    for name, row in zip(label_names, result["confusion"], strict=True):
        lines.append(f"{name[:10]:>12}" + "".join(f"{c:>11}" for c in row))
    return "\n".join(lines)


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "A workdir written by experiments.train.", flag_values=fv)
    flags.DEFINE_enum("split", "test", list(SPLITS), "Split to evaluate.", flag_values=fv)
    flags.DEFINE_enum(
        "checkpoint",
        checkpoints.BEST,
        [checkpoints.BEST, checkpoints.LAST],
        "Which checkpoint.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "path",
        None,
        "A labelled file or folder to evaluate on, instead of a split.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "text_field", None, "--path's text column; default: the training run's.", flag_values=fv
    )
    flags.DEFINE_string(
        "label_field", None, "--path's label column; default: the training run's.", flag_values=fv
    )
    cli.define_convert_flag(fv)
    parallel.define_flags(fv)


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    if not fv.workdir:
        raise UserError("--workdir=DIR is required")
    parallel.initialize_from_flags(fv)
    if fv.path is not None:
        result = evaluate_file(
            fv.workdir, fv.path, fv.checkpoint, fv.text_field, fv.label_field, fv.convert
        )
        what = f"{fv.path} (every row)"
    else:
        result = evaluate_workdir(fv.workdir, fv.split, fv.checkpoint, fv.convert)
        what = f"{fv.split} split"
    if not parallel.is_primary():
        parallel.finish()  # process 0 writes on; the job ends when it is done
        return
    print(f"{what}, checkpoint step {result['step']}")
    print(format_table(result, tuple(result["label_names"])))
    own = workdirs.read_config(os.path.join(fv.workdir, "config.json")).data.convert
    convert = _other(own, fv.convert)
    print(f"written: {result_file(fv.workdir, fv.checkpoint, fv.split, fv.path, convert)}")
    parallel.finish()


if __name__ == "__main__":
    cli.main(define_flags, main)
