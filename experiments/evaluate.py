"""Evaluates a trained workdir on a split: accuracy, macro-F1, loss, confusion matrix, examples/s.

  python -m experiments.evaluate --workdir=runs/default [--split=test] [--checkpoint=best]

Prints a table and writes DIR/eval_<split>.json. Several processes run it like experiments.train
(the same flags), each reading its rows of every batch; process 0 prints and writes.
"""

import os

from absl import flags

from experiments import checkpoints, cli, devices, distributed, forward, workdirs
from experiments.cli import UserError
from experiments.data import encoding
from experiments.data.splits import SPLITS


def evaluate_workdir(workdir: str, split: str, which: str = checkpoints.BEST) -> dict:
    """Evaluates the workdir's `which` checkpoint on `split` and writes DIR/eval_<split>.json."""
    trained = workdirs.load(workdir, which)
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
    s = data.splits[split]
    dp = devices.data_parallel(trained.config.data)
    params = devices.replicate(trained.params, dp)
    result = forward.evaluate(
        params, trained.cfg, s.ids, s.labels, data=trained.config.data, dp=dp, bag_ids=s.bag_ids
    )
    result["step"] = trained.step
    result["label_names"] = list(trained.label_names)
    if distributed.is_primary():
        workdirs.write_json(os.path.join(workdir, f"eval_{split}.json"), result)
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
    distributed.define_flags(fv)


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    if not fv.workdir:
        raise UserError("--workdir=DIR is required")
    distributed.initialize_from_flags(fv)
    result = evaluate_workdir(fv.workdir, fv.split, fv.checkpoint)
    if not distributed.is_primary():
        return
    print(f"{fv.split} split, checkpoint step {result['step']}")
    print(format_table(result, tuple(result["label_names"])))
    print(f"written: {os.path.join(fv.workdir, f'eval_{fv.split}.json')}")


if __name__ == "__main__":
    cli.main(define_flags, main)
