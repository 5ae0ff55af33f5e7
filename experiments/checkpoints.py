"""Orbax checkpoints of the train state, plus the JSON metadata that says which model they hold.

Layout of a workdir:
  checkpoints/<step>/{state,meta}   the last `keep` train states (params, optimizer, step, rng)
  best/<step>/{state,meta}          the train state with the best validation accuracy so far
  vocab.txt, tokenizer.json         the tokenizer the checkpoints were trained with
Orbax writes each step into a temporary directory and renames it when complete, so a killed
save leaves nothing that `latest_step` would pick.
"""

import dataclasses
import os
from typing import Any

import orbax.checkpoint as ocp

from experiments.errors import UserError

LAST, BEST = "checkpoints", "best"


def manager(
    workdir: str, which: str, keep: int, *, cleanup_tmp: bool = False
) -> ocp.CheckpointManager:
    """`cleanup_tmp` deletes saves a killed run left half-written: only for the training run,
    since a reader (evaluate during training) would delete the trainer's save in progress."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=True,
        enable_async_checkpointing=False,
        cleanup_tmp_directories=cleanup_tmp,
    )
    path = os.path.join(os.path.abspath(workdir), which)
    mngr = ocp.CheckpointManager(path, item_names=("state", "meta"), options=options)
    if cleanup_tmp:
        # Orbax deletes half-written saves in a background thread and waits for it only before
        # the next save. A run that stops before saving (a refused resume) would exit under that
        # thread, which then prints its own traceback; so wait now. Private in orbax 0.12.8.
        mngr._maybe_await_cleanup_tmp_directory()
    return mngr


def save(mngr: ocp.CheckpointManager, step: int, state: Any, meta: dict) -> None:
    """Saves `step`, replacing one that exists: a run killed after its best-checkpoint save but
    before the next `checkpoints/` save resumes from an earlier step and redoes it identically."""
    if step in mngr.all_steps():
        mngr.delete(step)
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
    mngr.save(step, args=args, force=True)


def read_meta(mngr: ocp.CheckpointManager, step: int) -> dict:
    return mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def restore(mngr: ocp.CheckpointManager, step: int, target: Any) -> tuple[Any, dict]:
    """Restores `step` into the structure, dtypes and shardings of `target`."""
    args = ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
    try:
        out = mngr.restore(step, args=args)
    except Exception as e:  # a truncated or foreign checkpoint
        # Orbax's messages can run to pages of tree dumps; the first line names the problem.
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot restore checkpoint {mngr.directory}/{step}: {reason}") from None
    return out["state"], out["meta"]


def check_same_model(saved: dict, model_cfg: Any, where: str) -> None:
    """Refuses a checkpoint whose model config differs, naming every differing field."""
    current = dataclasses.asdict(model_cfg)
    diff = [
        f"{k}: checkpoint {saved.get(k)!r} vs config {v!r}"
        for k, v in current.items()
        if _jsonable(saved.get(k)) != _jsonable(v)
    ]
    if diff:
        raise UserError(
            f"{where} holds a checkpoint of a different model ({'; '.join(diff)}); "
            "use a new --workdir or the original config"
        )


def _jsonable(x: Any) -> Any:
    return list(x) if isinstance(x, tuple) else x
