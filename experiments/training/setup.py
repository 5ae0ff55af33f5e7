"""One run setup for every objective: what the runs of `classify` and `masked_tokens` (`pipeline`)
share before and around the train loop.

`start` checks the workdir, reads what the run starts from (`model.init_from`) and fills what the
config leaves to the data; the objective then reads its data and describes itself as a `Task`;
`train` builds the optimizer and the jitted step for the run's `schedule.Schedule`, checks that a
resumed run is the same run, and runs the loop, whose state starts the same way for every
objective (fresh parameters, the source's encoder over them, then the optimizer's state).
"""

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from attn import models
from experiments import parallel, workdirs
from experiments.data import chosen, tokenizers
from experiments.training import loop, optim, schedule, warm_start, workdir_reader


@dataclasses.dataclass(frozen=True)
class Start:
    """What a run starts from, known before its data is read."""

    config: ml_collections.ConfigDict  # the source's tokenizer adopted, data-chosen fields filled
    said: str  # what was chosen from the data, for the user ("" = nothing)
    src: workdir_reader.Workdir | None  # whose encoder and tokenizer the run starts from
    dp: parallel.DataParallel


def start(config: ml_collections.ConfigDict, workdir: str, start_from: str | None = None) -> Start:
    """Checks that `workdir` can hold the run, reads the source (`start_from`, by default
    `model.init_from`) and fills the fields the config leaves to the data."""
    workdirs.check_writable(workdir)
    start_from = config.model.init_from if start_from is None else start_from
    src = warm_start.source(start_from) if start_from else None
    if src:
        config = warm_start.adopt(config, src)
    config, said = chosen.choose(config)
    return Start(config, said, src, parallel.data_parallel(config.data))


@dataclasses.dataclass(frozen=True)
class Task:
    """An objective's part of a run: its model, data, step and validation."""

    cfg: models.AnyConfig
    tokenizer: tokenizers.Tokenizer
    train_ids: Sequence[np.ndarray]  # the training texts' ids: the epoch's length, vector counts
    meta: dict  # `checkpoints.new_meta` of the run
    # (state, batch, *, cfg, tx, frozen) -> (state, metrics): the pure train step; frozen(params)
    # -> bools marks params not to differentiate, or None
    step: Callable[..., tuple[Any, dict]]
    # (key, fresh) -> params before the source's encoder is put in; fresh: count and read what
    # only a new run needs (a resumed run overwrites them)
    init_params: Callable[[jax.Array, bool], dict]
    batches: Callable[[int], Iterator[dict]]  # start step -> host batches from it on, no end
    evaluate: Callable[[Any], dict]  # state -> validation metrics, "accuracy" and "loss" among them
    ema: bool = False  # the state keeps a running average of the params
    label: str = ""  # what the accuracy and loss are of, when not the labels
    summary: str = ""  # a line about the data, printed with what was chosen from it
    # params -> bools: what the run starts from other than at random (optim.warm_lr_scale's);
    # None: `warm_start.warm_mask`'s
    warm: Callable[[Any], Any] | None = None
    lr_scales: Callable[[Any], Any] | None = None  # params -> floats: per-parameter rate factors


def train(s: Start, task: Task, workdir: str, sched: schedule.Schedule) -> Any:
    """Runs `task` in `workdir` to its end (resuming what is there) on schedule `sched`
    (`schedule.training`'s, or pretraining's own); returns the best checkpoint's served weights
    and step (`optim.served`). The run's config is what config.json records."""
    config = s.config
    warm = task.warm or warm_start.warm_mask(config, s.src)
    tx = optim.make_optimizer(
        config.optim,
        sched.total_steps,
        warm,
        task.lr_scales,
        learning_rate=sched.learning_rate,
        warmup_steps=sched.warmup_steps,
    )
    # Frozen (warm_lr_scale 0): not differentiated at all, which skips their backward pass.
    frozen = optim.frozen_mask(config.optim, warm)
    # The old state is dead once the step returns: donating it lets XLA update the params and
    # both Adam moments in place instead of allocating and copying three tables a step.
    step = jax.jit(
        functools.partial(task.step, cfg=task.cfg, tx=tx, frozen=frozen), donate_argnums=0
    )
    if s.src:
        warm_start.check_encoder(task.cfg, s.src)
    # Before the checkpoint's model check: other labels (data.label_names) also mean another
    # num_classes, and the data field is the cause to name.
    workdirs.check_same_run(config, workdir)
    if parallel.is_primary():
        for line in (s.said, task.summary):
            if line:
                print(line, file=sys.stderr)

    def init_state(fresh: bool) -> dict:
        def params_from(key: jax.Array) -> dict:
            params = task.init_params(key, fresh)
            # Adam's moments start at zero whatever the params: only these change.
            return warm_start.encoder_params(s.src, params) if s.src and fresh else params

        key = jax.random.PRNGKey(config.train.seed)
        return optim.init_state(key, task.cfg, tx, ema=task.ema, params_from=params_from)

    def write_run_files() -> None:
        workdirs.write_json(os.path.join(workdir, "config.json"), config.to_dict())
        if not tokenizers.saved(workdir):
            task.tokenizer.save(workdir)

    return loop.run(
        loop.Run(
            workdir=workdir,
            schedule=sched,
            dp=s.dp,
            meta=task.meta,
            init_state=init_state,
            step=step,
            compile=lambda state, batch: step.lower(state, batch).compile(),
            batches=task.batches,
            evaluate=task.evaluate,
            served=optim.served,
            write_run_files=write_run_files,
            label=task.label,
        )
    )
