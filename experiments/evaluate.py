"""Evaluates a trained workdir on a split: accuracy, macro-F1, loss, confusion matrix, examples/s.

  python -m experiments.evaluate --workdir=runs/default [--split=test] [--checkpoint=best]

Prints a table and writes DIR/eval_<split>.json.
"""

import os

from absl import flags

from experiments import batching, checkpoints, cli, datasets, evaluation, inference, train
from experiments.errors import UserError


def evaluate_workdir(workdir: str, split: str, which: str = checkpoints.BEST) -> dict:
    trained = inference.load(workdir, which)
    texts, labels, names = datasets.load_split(trained.config.data, split)
    if tuple(names) != trained.label_names:
        raise UserError(
            f"labels of the {split} data {list(names)} differ from the checkpoint's "
            f"{list(trained.label_names)}"
        )
    encoded = batching.encode_all(
        trained.tokenizer,
        texts,
        max_len=trained.config.data.max_len,
        add_cls=trained.cfg.pooling == "cls",
    )
    result = evaluation.evaluate(
        trained.params, trained.cfg, encoded, labels, data=trained.config.data
    )
    result["step"] = trained.step
    result["label_names"] = list(trained.label_names)
    out = os.path.join(workdir, f"eval_{split}.json")
    train.write_json(out, result)
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


def define_flags() -> None:
    """Flags are defined only when run as a script, so notebooks can import every entry point."""
    flags.DEFINE_string("workdir", None, "A workdir written by experiments.train.")
    flags.DEFINE_enum("split", "test", ["train", "validation", "test"], "Split to evaluate.")
    flags.DEFINE_enum(
        "checkpoint", checkpoints.BEST, [checkpoints.BEST, checkpoints.LAST], "Which checkpoint."
    )


def main(argv: list[str]) -> None:
    FLAGS = flags.FLAGS
    if not FLAGS.workdir:
        raise UserError("--workdir=DIR is required")
    result = evaluate_workdir(FLAGS.workdir, FLAGS.split, FLAGS.checkpoint)
    print(f"{FLAGS.split} split, checkpoint step {result['step']}")
    print(format_table(result, tuple(result["label_names"])))
    print(f"written: {os.path.join(FLAGS.workdir, f'eval_{FLAGS.split}.json')}")


if __name__ == "__main__":
    define_flags()
    cli.main(main)
