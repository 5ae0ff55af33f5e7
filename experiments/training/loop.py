"""The train loop that every objective runs: `train` (classification) and `pretrain` (masked
tokens) differ in their state, step, batches and validation, and share all else here.

What the loop does: resume from the newest complete checkpoint (or start fresh), step with each
step's metrics read one step late, evaluate on validation and keep the best checkpoint
(`metrics.improves`; its served weights alone), save the last ones with the optimizer's state,
stop early when validation has stopped improving (the schedule's patience), and show the
progress bar and log (`progress`). A rerun of a run that stopped early finds the stop in its last
checkpoint and does not train on.
"""

import collections
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from experiments import parallel
from experiments.data import batching
from experiments.errors import UserError
from experiments.training import checkpoints, metrics, progress
from experiments.training.checkpoints import BEST, LAST
from experiments.training.schedule import Schedule


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of an objective in `workdir` on its `schedule`."""

    workdir: str
    schedule: Schedule
    dp: parallel.DataParallel
    meta: dict  # `checkpoints.new_meta` of this run: what a checkpoint must match to resume
    init_state: Callable[[bool], Any]  # fresh start? -> the starting state, on the host
    step: Callable[[Any, dict], tuple[Any, dict]]  # (state, batch) -> (state, metrics); donates
    # (state, batch on the devices) -> compiles `step` for their shapes, running nothing
    compile: Callable[[Any, dict], Any]
    batches: Callable[[int], Iterator[dict]]  # start step -> host batches from it on, no end
    evaluate: Callable[[Any], dict]  # state -> validation metrics, "accuracy" and "loss" among them
    # state -> what the best checkpoint keeps of it: the weights that are served and the step, not
    # the optimizer's state, which only resuming (from the last checkpoints) reads
    served: Callable[[Any], Any]
    write_run_files: Callable[[], None]  # config.json and the tokenizer, once every check passed
    label: str = ""  # what the accuracy and loss are of, when not the labels


def run(r: Run) -> Any:
    """Trains `r` to its last step or its early stop; returns the best checkpoint (restored):
    what `r.served` keeps of its state."""
    t = r.schedule
    with (
        checkpoints.writer(r.workdir, LAST, t.keep_checkpoints) as last,
        checkpoints.writer(r.workdir, BEST, 1) as best,
    ):
        state = r.init_state(last.latest_step() is None)
        state, meta = checkpoints.resume(last, parallel.replicate(state, r.dp), r.meta, r.workdir)
        meta = {**meta}
        start = int(state["step"])
        if jax.process_count() > 1:  # all have read the workdir before process 0 writes to it
            multihost_utils.sync_global_devices("workdir read")
        if parallel.is_primary():
            if start:
                # A finished or early-stopped run only evaluates again: say so, not "resuming".
                done = meta.get("stopped_early") or start >= t.total_steps
                why = " (it stopped early there, train.patience)" if start < t.total_steps else ""
                left = f"; nothing left to train{why}" if done else ""
                print(f"resuming from step {start} of {t.total_steps}{left}", file=sys.stderr)
            # Only now, every check passed: a refused run leaves no config or vocabulary behind.
            r.write_run_files()
        if not meta.get("stopped_early"):
            if start < t.total_steps:
                counts, first = _next_shapes(r, start)
                compiled = _compile_ahead(r, state, first)
                expected = _expected_time(r, state, start, counts, first, compiled)
                if expected and parallel.is_primary():
                    print(expected, file=sys.stderr)
            _steps(r, state, meta, start, last, best)
        best_step = best.latest_step()
    if best_step is None:
        raise UserError(
            "no evaluation had a finite validation loss, so there is no best model; "
            "lower config.optim.learning_rate"
        )
    # A reader's manager: the writer's, having saved, restores whole trees only. A best
    # checkpoint written before it kept the served part alone holds the whole state.
    with checkpoints.reader(r.workdir, BEST) as mngr:
        kept, _ = checkpoints.restore(mngr, best_step, r.served(state), partial=True)
    return kept


PROBE_MIN_STEPS = 50  # a shorter run goes without the estimate
PROBE_SHAPES_FROM = 1000  # batches whose padded shapes are compiled ahead and weighed
PROBE_REPEATS = 2  # timed steps per shape, after one that runs it first


def _next_shapes(r: Run, start: int) -> tuple[collections.Counter, dict[tuple, dict]]:
    """The padded shapes of the next batches (host arrays, cheap): how many of the next
    PROBE_SHAPES_FROM come in each, and the first batch of each."""
    counts: collections.Counter = collections.Counter()
    first: dict[tuple, dict] = {}
    left = r.schedule.total_steps - start
    for batch in itertools.islice(r.batches(start), min(left, PROBE_SHAPES_FROM)):
        shape = tuple(sorted((k, v.shape) for k, v in batch.items()))
        counts[shape] += 1
        first.setdefault(shape, batch)
    return counts, first


def _compile_ahead(r: Run, state: Any, first: Mapping[tuple, dict]) -> float:
    """Compiles the step for each batch shape of `first` before the first step, saying so on
    stderr, and returns the seconds it took. Compiled as they came, each new padded length
    stopped the run in silence (up to 104 s of them after a fine-tune's first line); with the
    persistent cache (`compile_cache`) a rerun reads them back instead."""
    n = len(first)
    if parallel.is_primary():
        print(f"compiling {n} batch shape{'s' * (n != 1)} ...", end="", file=sys.stderr, flush=True)
    tic = time.perf_counter()
    for batch in first.values():
        r.compile(state, r.dp.put(batch))
    seconds = time.perf_counter() - tic
    if parallel.is_primary():
        print(f" done in {seconds:.0f} s", file=sys.stderr, flush=True)
    return seconds


def _expected_time(
    r: Run,
    state: Any,
    start: int,
    counts: Mapping[tuple, int],
    first: Mapping[tuple, dict],
    compiled_in: float,
) -> str | None:
    """How long the steps left should take, measured before they start. A step's time depends on
    its batch's padded length, and the few longest buckets cost the most: timing the next few
    batches missed them and promised half the real time. So the mix of shapes comes from the
    next batches (`counts`), and the first batch of each shape (`first`), compiled, is run once
    and then timed on a copy of the state. None for a run with few steps left."""
    left = r.schedule.total_steps - start
    if left < PROBE_MIN_STEPS:
        return None
    seconds = {}
    for shape, batch in first.items():
        batch = r.dp.put(batch)
        seconds[shape] = []
        for timed in [False] + [True] * PROBE_REPEATS:
            copy = jax.tree.map(jnp.copy, state)  # the step donates it
            tic = time.perf_counter()
            jax.block_until_ready(r.step(copy, batch))
            if timed:
                seconds[shape].append(time.perf_counter() - tic)
    evaluations = left // r.schedule.eval_every_steps
    return expected_time(counts, seconds, left, evaluations, compiled_in)


def expected_time(
    counts: Mapping[Hashable, int],
    seconds: Mapping[Hashable, Sequence[float]],
    left: int,
    evaluations: int,
    compiled_in: float | None = None,
) -> str:
    """The line that says what to expect: `left` steps whose batches come in shapes with these
    `counts`, each shape timed `seconds` (a few repeats), as a range: the fastest and the slowest
    repeat of each shape, weighed by how often it comes; and the seconds the shapes took to
    compile ahead, when given. It holds while the machine stays as busy as when it was measured;
    the progress bar's remaining time follows the real pace."""
    total = sum(counts.values())
    low, high = (
        sum(n * pick(seconds[shape]) for shape, n in counts.items()) / total for pick in (min, max)
    )
    compiled = "" if compiled_in is None else f", compiled ahead in {compiled_in:.0f} s"
    return (
        f"expected: {_duration_range(low * left, high * left)} for {left:,} steps at the machine's "
        f"present load ({low:.2f}-{high:.2f} s a step over its {len(counts)} batch shapes"
        f"{compiled}), plus {evaluations} evaluations"
    )


def _duration_range(low: float, high: float) -> str:
    """`low`-`high` seconds in the unit that suits `high`: "40-55 s", "4-6 min", "1.2-1.5 h"."""
    if high < 90:
        unit, scale, digits = "s", 1, 0
    elif high < 90 * 60:
        unit, scale, digits = "min", 60, 0
    else:
        unit, scale, digits = "h", 3600, 1
    lo, hi = (f"{x / scale:.{digits}f}" for x in (low, high))
    return f"about {hi} {unit}" if lo == hi else f"{lo}-{hi} {unit}"


def _steps(r: Run, state: Any, meta: dict, start: int, last, best) -> None:
    t = r.schedule
    with progress.Progress(r.workdir, t, start, last.latest_step, r.label, meta) as prog:
        batches = prog.timed(batching.prefetch(r.batches(start)))
        for step, batch in zip(range(start + 1, t.total_steps + 1), batches, strict=False):
            state, m = r.step(state, r.dp.put(batch))
            prog.push(step, m)  # reads the previous step's metrics, not this one's
            meta["step"] = step
            evaluating = step % t.eval_every_steps == 0 or step == t.total_steps
            saving = step % t.checkpoint_every_steps == 0 or step == t.total_steps
            if evaluating or saving:
                prog.flush_into(meta)
            if evaluating:
                val = r.evaluate(state)
                prog.validation(step, val)
                if metrics.improves(val, meta["best_val_accuracy"], meta.get("best_val_loss")):
                    meta.update(best_val_accuracy=val["accuracy"], best_val_loss=val["loss"])
                    meta["stale_evaluations"] = 0
                    checkpoints.save(best, step, r.served(state), meta)
                else:
                    meta["stale_evaluations"] = meta.get("stale_evaluations", 0) + 1
                if t.patience and meta["stale_evaluations"] >= t.patience:
                    meta["stopped_early"] = True
                    saving = True
                    prog.stop_early(step, t.patience)
            if saving:
                checkpoints.save(last, step, state, meta)
            if meta.get("stopped_early"):
                break


def eval_batches(
    ids: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    data: Any,
    dp: parallel.DataParallel,
    bag_ids: Sequence[np.ndarray] | None = None,
) -> Iterator[tuple[np.ndarray, dict]]:
    """Every example once, in batches on the devices: (example indices [n <= B], global batch),
    as config.data `data` sizes and pads them; each process builds only its rows of a batch.
    What every objective's validation and every evaluation of a split iterate over."""
    for idx, batch in batching.eval_batches(
        ids,
        labels,
        batch_size=data.eval_batch_size,
        buckets=tuple(data.buckets),
        max_len=data.max_len,
        rows=dp.rows(data.eval_batch_size),
        bag_ids=bag_ids,
        bag_len=data.bag_len,
    ):
        yield idx, dp.put(batch)


def resume_hint(workdir: str) -> str:
    """Where a rerun resumes, for the Ctrl-C message: the newest complete checkpoint of the run, or
    of the pretraining it runs first in WORKDIR/pretrain. Orbax renames a step's directory to its
    number only when complete, and listing them is safe at any moment."""
    for where, what in (
        (workdir, "the last complete checkpoint"),
        (os.path.join(workdir, "pretrain"), "pretraining's last complete checkpoint"),
    ):
        path = os.path.join(where, LAST)
        steps = [int(n) for n in os.listdir(path) if n.isdigit()] if os.path.isdir(path) else []
        if steps:
            return (
                f"{what} is step {max(steps)} in {path}; rerun the same command to resume from it"
            )
    return "no checkpoint was complete yet; rerun the same command to start over"
