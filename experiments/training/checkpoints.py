"""Orbax checkpoints of the train state, plus the JSON metadata that says which run they hold.

Layout of a workdir:
  checkpoints/<step>/{state,meta}   the last `keep` train states (params, optimizer, step, rng)
  best/<step>/{state,meta}          of the state with the best validation accuracy so far, the
                                    weights served and the step (`optim.served`; a workdir
                                    written before it kept those alone holds the whole state)
  vocab.txt, tokenizer.json         the tokenizer the checkpoints were trained with
Orbax writes each step into a temporary directory and renames it when complete, so a killed
save leaves nothing that `latest_step` would pick.

Each step's meta (`new_meta`) says which run it belongs to and where that run stood.

Several processes share one directory (shared storage, as on a TPU slice): every process takes
part in each save and restore, and orbax writes each replicated array once.
"""

import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from attn import models
from experiments import parallel
from experiments.errors import UserError
from experiments.training import metrics

LAST, BEST = "checkpoints", "best"
CLASSIFIER, MASKED_LM = "classifier", "masked_lm"  # what a run trains: meta["objective"]


def new_meta(
    cfg: models.AnyConfig,
    label_names: Sequence[str],
    *,
    ema: bool,
    objective: str = CLASSIFIER,
) -> dict:
    """The meta of a new run: its objective, model family and config, whether its state holds a
    weight average ("ema"), its label names; the train loop keeps "step", "best_val_accuracy",
    "best_val_loss" (None before any), its early-stopping count and the sums of its unlogged
    train steps (`progress.WINDOW`) up to date."""
    return {
        "objective": objective,
        "family": models.family(cfg),
        "model": dataclasses.asdict(cfg),
        "ema": ema,
        "label_names": list(label_names),
        "step": 0,
        "best_val_accuracy": metrics.NO_BEST,
        "best_val_loss": None,
        "stale_evaluations": 0,
    }


def family_of(meta: dict) -> str:
    """The model family a checkpoint's meta records: "attn" when it predates the field."""
    return meta.get("family", models.OWN)


def writer(workdir: str, which: str, keep: int) -> ocp.CheckpointManager:
    """The training run's manager of `workdir/which`, keeping the newest `keep` steps.

    First it deletes the saves a killed run left half-written. Only the training run may: a reader
    (evaluate during training) would delete the trainer's save in progress. Orbax could do it
    itself, in a thread that a run refused before its first save would exit under; this is the
    same deletion through its public API, finished before the manager exists.
    """
    path = os.path.join(os.path.abspath(workdir), which)
    if os.path.isdir(path) and parallel.is_primary():
        for tmp in ocp.path.step.all_temporary_paths(path):
            shutil.rmtree(tmp.get())
    if jax.process_count() > 1:  # no process may start a save before the deletion is done
        multihost_utils.sync_global_devices(f"{which}: leftovers deleted")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(path, item_names=("state", "meta"), options=options)


def reader(workdir: str, which: str) -> ocp.CheckpointManager:
    """A manager of `workdir/which` for reading: it creates and deletes nothing."""
    path = os.path.join(os.path.abspath(workdir), which)
    options = ocp.CheckpointManagerOptions(create=False, enable_async_checkpointing=False)
    return ocp.CheckpointManager(path, item_names=("state", "meta"), options=options)


def latest_step(workdir: str, which: str) -> int | None:
    """The newest complete step in `workdir/which`; None when there is none."""
    if not os.path.isdir(os.path.join(workdir, which)):
        return None
    with reader(workdir, which) as mngr:
        return mngr.latest_step()


def kept(workdir: str, which: str = BEST) -> tuple[str, int | None]:
    """(which, step) of the checkpoint a trained workdir offers: `which`'s newest, or for BEST in
    a run stopped before its first evaluation, the last one; step None when there is none."""
    step = latest_step(workdir, which)
    if step is None and which == BEST:
        which, step = LAST, latest_step(workdir, LAST)
    return which, step


def save(mngr: ocp.CheckpointManager, step: int, state: Any, meta: dict) -> None:
    """Saves `step`, replacing one that exists: a run killed after its best-checkpoint save but
    before the next `checkpoints/` save resumes from an earlier step and redoes it identically."""
    if step in mngr.all_steps():
        mngr.delete(step)
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
    mngr.save(step, args=args, force=True)


def read_meta(mngr: ocp.CheckpointManager, step: int) -> dict:
    return mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def restore(
    mngr: ocp.CheckpointManager, step: int, target: Any, *, partial: bool = False
) -> tuple[Any, dict]:
    """Restores `step` into the structure, dtypes and shardings of `target`; with `partial`,
    only the entries `target` names (e.g. the params without the optimizer state)."""
    if partial:
        item = ocp.args.PyTreeRestore(
            item=target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True,
        )
    else:
        item = ocp.args.StandardRestore(target)
    args = ocp.args.Composite(state=item, meta=ocp.args.JsonRestore())
    try:
        out = mngr.restore(step, args=args)
    except Exception as e:  # a truncated or foreign checkpoint
        # Orbax's messages can run to pages of tree dumps; the first line names the problem.
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot restore checkpoint {mngr.directory}/{step}: {reason}") from None
    return out["state"], out["meta"]


def resume(mngr: ocp.CheckpointManager, state: Any, meta: dict, workdir: str) -> tuple[Any, dict]:
    """The newest checkpoint restored into `state`'s structure, and its meta; `state` and `meta`
    unchanged when there is none. A checkpoint of a different run (any field of the model config
    or the weight-average flag) is refused, naming every differing field."""
    step = mngr.latest_step()
    if step is None:
        return state, meta
    saved, current = _run_fields(read_meta(mngr, step)), _run_fields(meta)
    diff = [
        f"{k}: checkpoint {saved.get(k)!r} vs config {v!r}"
        for k, v in current.items()
        if saved.get(k) != v
    ]
    if diff:
        raise UserError(
            f"workdir {workdir!r} holds a checkpoint of a different model ({'; '.join(diff)}); "
            "use a new --workdir or the original config"
        )
    return restore(mngr, step, state)


def _run_fields(meta: dict) -> dict:
    """What must match to continue a run, as JSON has it (tuples are lists at every depth: a
    pretrained encoder's config nests them, e.g. DeBERTa's pos_att_type). A field the checkpoint
    predates takes its default, so adding a model field keeps old runs resumable."""
    family = family_of(meta)
    model = json.loads(json.dumps({**models.defaults(family), **meta["model"]}))
    return {
        **model,
        "family": family,
        "ema": meta.get("ema", False),
        "objective": meta.get("objective", CLASSIFIER),
    }
