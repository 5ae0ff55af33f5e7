"""A run's schedule: how long it trains, its learning rate's peak and warmup, when it evaluates,
saves and logs, and when it stops early or gives up. What `setup.train` and the train loop read,
as one frozen value made once from the config: training's from config.train and config.optim,
pretraining's from config.pretrain, so that no config is rewritten to describe another run.
"""

import dataclasses

import ml_collections

from experiments.data import batching
from experiments.errors import UserError


@dataclasses.dataclass(frozen=True)
class Schedule:
    total_steps: int
    learning_rate: float  # the peak, reached after warmup_steps of linear warmup
    warmup_steps: int
    eval_every_steps: int  # validation (the best checkpoint is kept) every this many steps
    checkpoint_every_steps: int  # the last checkpoint (where a rerun resumes)
    log_every_steps: int  # metrics.jsonl and TensorBoard
    keep_checkpoints: int  # the newest this many last checkpoints are kept
    patience: int  # evaluations in a row without a better one before stopping; 0: never
    max_nonfinite: int  # consecutive skipped (non-finite) steps before the run stops


def training(config: ml_collections.ConfigDict, num_examples: int) -> Schedule:
    """config.train's and config.optim's schedule over a training split of `num_examples`:
    train.max_steps, or train.num_epochs passes over it."""
    t, o = config.train, config.optim
    steps = t.max_steps or t.num_epochs * batching.steps_per_epoch(
        num_examples, config.data.batch_size
    )
    return Schedule(
        total_steps=steps,
        learning_rate=o.learning_rate,
        warmup_steps=o.warmup_steps,
        eval_every_steps=t.eval_every_steps,
        checkpoint_every_steps=t.checkpoint_every_steps,
        log_every_steps=t.log_every_steps,
        keep_checkpoints=t.keep_checkpoints,
        patience=t.patience,
        max_nonfinite=o.max_nonfinite,
    )


def pretraining(config: ml_collections.ConfigDict, num_examples: int) -> Schedule:
    """config.pretrain's schedule over `num_examples` texts: its own length, learning rate, warmup
    and intervals, and no early stop (more pretraining does not hurt); logging, kept checkpoints
    and the non-finite limit as training's."""
    check_pretraining(config)
    p = config.pretrain
    steps = p.max_steps or p.num_epochs * batching.steps_per_epoch(
        num_examples, config.data.batch_size
    )
    return dataclasses.replace(
        training(config, num_examples),
        total_steps=steps,
        learning_rate=p.learning_rate,
        warmup_steps=p.warmup_steps,
        eval_every_steps=p.eval_every_steps,
        checkpoint_every_steps=p.checkpoint_every_steps,
        patience=0,
    )


def check_pretraining(config: ml_collections.ConfigDict) -> None:
    """UserError when config does not say how long to pretrain, before any data is read."""
    p = config.pretrain
    if not (p.num_epochs or p.max_steps):
        raise UserError(
            "config.pretrain.num_epochs and max_steps are 0: set how long to pretrain, e.g. "
            "--config.pretrain.num_epochs=10"
        )
