"""Trains a self-attention classifier from an ml_collections config; resumes from the workdir.

  python -m experiments.train --config=configs/default.py --workdir=runs/default \
      [--config.model.num_layers=2 ...]
  python -m experiments.train --config=configs/default.py --print_config   # fields, no training

`main` is a thin wrapper over `train_and_evaluate(config, workdir)`, which a notebook can call.
Several processes (one per host of a TPU slice or GPU cluster) run the same command with
`--num_processes=N` and, where JAX cannot find them itself, `--coordinator=HOST:PORT
--process_id=I` (see `parallel`); every process trains on its rows of each batch and saves
the checkpoints, and process 0 alone writes the logs, JSON files and plots.
"""

import os
import sys
import time

import ml_collections
from absl import flags

from experiments import cli, fields, parallel
from experiments.data import chosen
from experiments.errors import UserError
from experiments.explain import plots
from experiments.training import baseline
from experiments.training.pipeline import train_and_evaluate

__all__ = ["train_and_evaluate"]


def define_flags(fv: flags.FlagValues) -> None:
    cli.define_run_flags(fv)
    flags.DEFINE_boolean(
        "print_config",
        False,
        "Print every config field with the value a run would use and its meaning, then exit.",
        flag_values=fv,
    )


def _resolved_if_readable(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The values a run would use; fields left to the data stay marked when it cannot be read
    (e.g. csv.py before --config.data.path is given), since listing fields needs no data."""
    try:
        return chosen.resolve(config)
    except UserError as e:
        print(f"fields chosen from the data stay marked; cannot read it: {e}", file=sys.stderr)
        return config


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    if fv.config is not None and fv.print_config:
        print(fields.describe(_resolved_if_readable(fv.config)))
        return
    start = time.perf_counter()
    test = cli.run_in_workdir(fv, train_and_evaluate)
    if test is None:  # not process 0
        parallel.finish()  # process 0 writes on; the job ends when it is done
        return
    curves = plots.plot_curves(fv.workdir)
    print(
        f"test accuracy {test['accuracy']:.4f}  macro-F1 {test['macro_f1']:.4f}  "
        f"({test['num_examples']} examples, best step {test['step']}, "
        f"{time.perf_counter() - start:.0f} s)"
    )
    if "baseline" in test:
        print(baseline.summary(test["accuracy"], test["baseline"]))
    print(f"curves: {curves}\nresults: {os.path.join(fv.workdir, 'eval_test.json')}")
    parallel.finish()


if __name__ == "__main__":
    cli.main(define_flags, main)
