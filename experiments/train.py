"""Trains a self-attention classifier from an ml_collections config; resumes from the workdir.

  python -m experiments.train --config=configs/default.py --workdir=runs/default \
      [--config.model.num_layers=2 ...]
  python -m experiments.train --config=configs/default.py --print_config   # fields, no training

`main` is a thin wrapper over `train_and_evaluate(config, workdir)`, which a notebook can call.
Several processes (one per host of a TPU slice or GPU cluster) run the same command with
`--num_processes=N` and, where JAX cannot find them itself, `--coordinator=HOST:PORT
--process_id=I` (see `distributed`); every process trains on its rows of each batch and saves
the checkpoints, and process 0 alone writes the logs, JSON files and plots.
"""

import functools
import os
import sys
import time

import jax
import ml_collections
from absl import flags
from jax.experimental import multihost_utils
from ml_collections import config_flags

from experiments import (
    bag_prior,
    baseline,
    checkpoints,
    cli,
    defaults,
    devices,
    distributed,
    forward,
    metrics,
    optimization,
    plots,
    progress,
    workdirs,
)
from experiments.checkpoints import BEST, LAST
from experiments.cli import UserError
from experiments.data import batching, encoding
from experiments.data.splits import SPLITS


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains, keeps the best-on-validation checkpoint, and returns its test metrics."""
    config = defaults.resolve(config)
    d, t, o = config.data, config.train, config.optim
    optimization.check_optim(o)
    if o.bag_init == "naive_bayes" and not config.model.bag_buckets:
        raise UserError("optim.bag_init=naive_bayes needs a bag: set model.bag_buckets > 0")
    if d.bag_len and not config.model.bag_buckets:
        raise UserError("data.bag_len > 0 needs a bag: set model.bag_buckets > 0")
    workdirs.check_writable(workdir)
    dp = devices.data_parallel(d)
    primary = distributed.is_primary()
    data = encoding.load(d, add_cls=config.model.pooling == "cls", workdir=workdir)
    train, validation, test = (data.splits[s] for s in SPLITS)
    cfg = optimization.model_config(config, data.tokenizer.vocab_size, len(data.label_names))
    per_epoch = batching.steps_per_epoch(len(train.ids), d.batch_size)
    total_steps = t.max_steps or t.num_epochs * per_epoch
    tx = optimization.make_optimizer(o, total_steps)
    meta = checkpoints.new_meta(cfg, data.label_names, ema=o.ema_decay > 0)
    # The old state is dead once the step returns: donating it lets XLA update the params and
    # both Adam moments in place instead of allocating and copying three tables a step.
    train_step = jax.jit(
        functools.partial(optimization.train_step, cfg=cfg, tx=tx, **optimization.loss_options(o)),
        donate_argnums=0,
    )
    evaluate = lambda params, split: forward.evaluate(
        params, cfg, split.ids, split.labels, data=d, dp=dp, bag_ids=split.bag_ids
    )
    # Before the checkpoint's model check: other labels (data.label_names) also mean another
    # num_classes, and the data field is the cause to name.
    workdirs.check_same_run(config, workdir)
    with (
        checkpoints.writer(workdir, LAST, t.keep_checkpoints) as last,
        checkpoints.writer(workdir, BEST, 1) as best,
    ):
        # A resumed run overwrites the starting table: count it only for a fresh start.
        fresh = last.latest_step() is None
        bag_VxC = (
            bag_prior.naive_bayes(cfg, train, d) if o.bag_init == "naive_bayes" and fresh else None
        )
        state = optimization.init_state(
            jax.random.PRNGKey(t.seed), cfg, tx, ema=o.ema_decay > 0, bag_VxC=bag_VxC
        )
        state, meta = checkpoints.resume(last, devices.replicate(state, dp), meta, workdir)
        start = int(state["step"])
        if jax.process_count() > 1:  # all have read the workdir before process 0 writes to it
            multihost_utils.sync_global_devices("workdir read")
        if primary:
            if start:
                print(f"resuming from step {start} of {total_steps}", file=sys.stderr)
            # Only now, every check passed: a refused run leaves no config or vocabulary behind.
            workdirs.write_json(os.path.join(workdir, "config.json"), config.to_dict())
            if not os.path.exists(os.path.join(workdir, "tokenizer.json")):
                data.tokenizer.save(workdir)
        stream = batching.train_stream(
            train.ids,
            train.labels,
            seed=t.seed,
            start_step=start,
            rows=dp.rows(d.batch_size),
            bag_ids=train.bag_ids,
            **batching.options(d),
        )
        with progress.Progress(workdir, config, start, total_steps, last.latest_step) as prog:
            batches = prog.timed(batching.prefetch(stream))
            for step, batch in zip(range(start + 1, total_steps + 1), batches, strict=False):
                state, m = train_step(state, dp.put(batch))
                prog.push(step, m)  # reads the previous step's metrics, not this one's
                meta["step"] = step
                evaluating = step % t.eval_every_steps == 0 or step == total_steps
                saving = step % t.checkpoint_every_steps == 0 or step == total_steps
                if evaluating or saving:
                    prog.flush()
                if evaluating:
                    val = evaluate(optimization.eval_params(state), validation)
                    prog.validation(step, val)
                    if metrics.improves(val, meta["best_val_accuracy"]):
                        meta["best_val_accuracy"] = val["accuracy"]
                        checkpoints.save(best, step, state, meta)
                if saving:
                    checkpoints.save(last, step, state, meta)
        if best.latest_step() is None:
            raise UserError(
                "no evaluation had a finite validation loss, so there is no best model; "
                "lower config.optim.learning_rate"
            )
        best_state, _ = checkpoints.restore(best, best.latest_step(), state)
    result = evaluate(optimization.eval_params(best_state), test)
    result["step"] = int(best_state["step"])
    result["label_names"] = list(data.label_names)  # as evaluate's files have them
    if primary and t.baseline:
        texts = {s: (data.splits[s].texts, data.splits[s].labels) for s in SPLITS}
        result["baseline"] = baseline.fit_for_run(d, texts, workdir)
    if primary:
        workdirs.write_json(os.path.join(workdir, "eval_test.json"), result)
    return result


def _resume_hint(workdir: str) -> str:
    """Where a rerun resumes. Orbax renames a step's directory to its number only when complete,
    and listing them is safe at any moment (this runs when Ctrl-C arrives)."""
    path = os.path.join(workdir, LAST)
    steps = [int(n) for n in os.listdir(path) if n.isdigit()] if os.path.isdir(path) else []
    if not steps:
        return "no checkpoint was complete yet; rerun the same command to start over"
    return (
        f"the last complete checkpoint is step {max(steps)} in {path}; "
        "rerun the same command to resume from it"
    )


def define_flags(fv: flags.FlagValues) -> None:
    config_flags.DEFINE_config_file(
        "config", None, "Path to a config file[:variant].", flag_values=fv
    )
    flags.DEFINE_string(
        "workdir", None, "Directory for checkpoints, vocabulary and metrics.", flag_values=fv
    )
    distributed.define_flags(fv)
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
        return defaults.resolve(config)
    except UserError as e:
        print(f"fields chosen from the data stay marked; cannot read it: {e}", file=sys.stderr)
        return config


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    config, workdir = fv.config, fv.workdir
    if config is not None and fv.print_config:
        print(cli.describe_config(_resolved_if_readable(config)))
        return
    if config is None or not workdir:
        raise UserError("both --config=configs/<name>.py and --workdir=DIR are required")
    start = time.perf_counter()
    distributed.initialize_from_flags(fv)
    fresh = not os.path.exists(workdir)
    with cli.interrupt_detail(lambda: _resume_hint(workdir)):
        try:
            test = train_and_evaluate(config, workdir)
        except UserError:
            if fresh and distributed.is_primary():  # a refused run leaves no empty workdir
                workdirs.remove_if_unused(workdir)
            raise
    if not distributed.is_primary():
        return
    curves = plots.plot_curves(workdir)
    print(
        f"test accuracy {test['accuracy']:.4f}  macro-F1 {test['macro_f1']:.4f}  "
        f"({test['num_examples']} examples, best step {test['step']}, "
        f"{time.perf_counter() - start:.0f} s)"
    )
    if "baseline" in test:
        print(baseline.summary(test["accuracy"], test["baseline"]))
    print(f"curves: {curves}\nresults: {os.path.join(workdir, 'eval_test.json')}")


if __name__ == "__main__":
    cli.main(define_flags, main)
