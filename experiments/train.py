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
    loop,
    optimization,
    plots,
    pretraining,
    warm_start,
    workdirs,
)
from experiments.cli import UserError
from experiments.data import batching, encoding
from experiments.data.splits import SPLITS


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains, keeps the best-on-validation checkpoint, and returns its test metrics.

    With config.pretrain.num_epochs (or max_steps) > 0 and no model.init_from, it first pretrains
    the encoder into WORKDIR/pretrain (`pretrain.pretrain`) and starts from there.
    """
    check_config(config)
    workdirs.check_writable(workdir)
    start_from = config.model.init_from
    if not start_from and pretraining.requested(config):
        start_from = os.path.join(workdir, "pretrain")
        pretraining.pretrain(config, start_from)
    src = warm_start.source(start_from) if start_from else None
    if src:
        config = warm_start.adopt(config, src)
    config, chosen = defaults.choose(config)
    d, t, o = config.data, config.train, config.optim
    dp = devices.data_parallel(d)
    primary = distributed.is_primary()
    data = encoding.load(
        d,
        add_cls=config.model.pooling == "cls",
        workdir=workdir,
        tokenizer=src.tokenizer if src else None,
    )
    train, validation, test = (data.splits[s] for s in SPLITS)
    cfg = optimization.model_config(config, data.tokenizer.vocab_size, len(data.label_names))
    if src:
        warm_start.check_encoder(cfg, src)
    per_epoch = batching.steps_per_epoch(len(train.ids), d.batch_size)
    total_steps = t.max_steps or t.num_epochs * per_epoch
    tx = optimization.make_optimizer(o, total_steps, warm_start.warm(config, src))
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
    if chosen and primary:
        print(chosen, file=sys.stderr)

    def init_state(fresh: bool) -> dict:
        # A resumed run overwrites the starting values: count, read or restore them only for a
        # fresh start.
        bag_VxC = (
            bag_prior.naive_bayes(cfg, train, d) if o.bag_init == "naive_bayes" and fresh else None
        )
        tokens_VxD = warm_start.word_vectors(config, data.tokenizer, train.ids) if fresh else None
        init_key, rng = jax.random.split(jax.random.PRNGKey(t.seed))
        params = optimization.init_params(init_key, cfg, bag_VxC=bag_VxC, tokens_VxD=tokens_VxD)
        if src and fresh:
            params = warm_start.encoder_params(src, params)
        return optimization.state_of(params, tx, rng, ema=o.ema_decay > 0)

    def accept() -> None:
        workdirs.write_json(os.path.join(workdir, "config.json"), config.to_dict())
        if not os.path.exists(os.path.join(workdir, "tokenizer.json")):
            data.tokenizer.save(workdir)
        scripts = os.path.join(workdir, workdirs.SCRIPTS_FILE)
        if not os.path.exists(scripts):  # for predict: the scripts the model has read
            workdirs.write_json(scripts, workdirs.script_shares(train.texts))

    best_state = loop.run(
        loop.Run(
            workdir=workdir,
            config=config,
            dp=dp,
            total_steps=total_steps,
            meta=checkpoints.new_meta(cfg, data.label_names, ema=o.ema_decay > 0),
            init_state=init_state,
            step=train_step,
            batches=lambda start: batching.train_stream(
                train.ids,
                train.labels,
                seed=t.seed,
                start_step=start,
                rows=dp.rows(d.batch_size),
                bag_ids=train.bag_ids,
                **batching.options(d),
            ),
            evaluate=lambda state: evaluate(optimization.eval_params(state), validation),
            accept=accept,
        )
    )
    result = evaluate(optimization.eval_params(best_state), test)
    result["step"] = int(best_state["step"])
    result["label_names"] = list(data.label_names)  # as evaluate's files have them
    if primary and t.baseline:
        texts = {s: (data.splits[s].texts, data.splits[s].labels) for s in SPLITS}
        result["baseline"] = baseline.fit_for_run(d, texts, workdir)
    if primary:
        workdirs.write_json(os.path.join(workdir, "eval_test.json"), result)
    return result


def check_config(config: ml_collections.ConfigDict) -> None:
    """The config's own mistakes, before any data is read or anything is printed about it."""
    optimization.check_optim(config.optim)
    optimization.check_model(config)
    if config.optim.bag_init == "naive_bayes" and not config.model.bag_buckets:
        raise UserError("optim.bag_init=naive_bayes needs a bag: set model.bag_buckets > 0")
    if config.data.bag_len and not config.model.bag_buckets:
        raise UserError("data.bag_len > 0 needs a bag: set model.bag_buckets > 0")
    patience = config.train.get("patience", 0)
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
        raise UserError(f"config.train.patience must be an integer >= 0; got {patience!r}")
    if pretraining.requested(config):
        pretraining.view(config)


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
    with cli.interrupt_detail(lambda: loop.resume_hint(workdir)):
        try:
            test = train_and_evaluate(config, workdir)
        except UserError:
            if fresh and distributed.is_primary():  # a refused run leaves no empty workdir
                workdirs.remove_if_unused(workdir)
            raise
    if not distributed.is_primary():
        distributed.finish()  # process 0 writes on; the job ends when it is done
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
    distributed.finish()


if __name__ == "__main__":
    cli.main(define_flags, main)
