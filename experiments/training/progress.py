"""The train loop's host side: each step's metrics read one step late, summed over a window,
logged every few steps, shown in the progress bar (by process 0 of several); and the stop when
training diverges (by every process, which all see the same metrics)."""

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from experiments import parallel
from experiments.errors import UserError
from experiments.training import metrics
from experiments.training.schedule import Schedule

_END = object()
SUMS = ("loss_sum", "correct", "count")
WINDOW = "train_window"  # the checkpoint meta's copy of `Window.sums()`


class Window:
    """Sums over the train steps since the last log line; a step with a non-finite loss (skipped
    by the optimizer) adds nothing. `sums()` goes into each checkpoint's meta, and a resumed run
    starts from them: its first log line then averages the steps the uninterrupted run's does,
    those before the checkpoint included, added in the same order to the same floats."""

    def __init__(self, sums: dict | None = None) -> None:
        self.reset()
        if sums:
            self.loss_sum, self.correct, self.count = (sums[k] for k in SUMS)

    def reset(self) -> None:
        self.loss_sum = self.correct = self.count = 0.0
        self.wait = 0.0  # seconds spent waiting for the input pipeline
        self.start = time.perf_counter()

    def sums(self) -> dict:
        return {"loss_sum": self.loss_sum, "correct": self.correct, "count": self.count}

    def add(self, m: dict) -> None:
        if np.isfinite(m["loss"]):
            self.loss_sum += float(m["loss_sum"])
            self.correct += float(m["correct"])
            self.count += float(m["count"])

    def row(self, m: dict) -> dict:
        """The log line for the window, with the optimizer's counters of its last step `m`."""
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        seen = self.count or float("nan")  # only skipped steps: no loss, not a misleading 0
        return {
            "loss": self.loss_sum / seen,
            "accuracy": self.correct / seen,
            "examples_per_sec": self.count / elapsed,
            "input_wait_fraction": self.wait / elapsed,
            "skipped_steps": int(m["nonfinite_total"]),
            "grad_norm": float(m["grad_norm"]),
        }


class Progress(contextlib.AbstractContextManager):
    """Logs train steps `start + 1 ... schedule.total_steps` of a run in `workdir` (see
    `metrics.Log`); `label` says what its accuracy and loss are of, when not labels (e.g.
    "masked-token").

    `push` hands over a step's metrics while they are still being computed; they are read when
    the next step has been dispatched, so the device never waits for the host. A log line every
    schedule.log_every_steps; after schedule.max_nonfinite consecutive skipped steps it stops the
    run, naming the last good checkpoint, `last_good()`. `meta` is the checkpoint's the run starts
    from: its window's sums carry the log line that a checkpoint cut in two.
    """

    def __init__(
        self,
        workdir: str,
        schedule: Schedule,
        start: int,
        last_good: Callable[[], int | None],
        label: str = "",
        meta: dict | None = None,
    ):
        self.total_steps, self.last_good = schedule.total_steps, last_good
        self.label = f"{label} " if label else ""  # what the validation line's figures are of
        self.log_every = schedule.log_every_steps
        self.max_nonfinite = schedule.max_nonfinite
        primary = parallel.is_primary()
        self.log = metrics.Log(workdir, start) if primary else None
        self.bar = tqdm(
            total=self.total_steps,
            initial=start,
            desc="train",
            unit="step",
            mininterval=1,
            # The remaining time from the average pace since the first step, not tqdm's recent
            # one: batches of random padded lengths and the evaluations between them made that
            # swing by a factor of several from one second to the next.
            smoothing=0,
            disable=not primary,
        )
        self.window = Window((meta or {}).get(WINDOW))
        self.pending: tuple[int, Any] | None = None
        self.timed_steps = 0  # steps recorded in the bar's rate

    def timed(self, batches: Iterator) -> Iterator:
        """`batches`, counting the time spent in each next() as waiting for input."""
        while True:
            start = time.perf_counter()
            batch = next(batches, _END)
            self.window.wait += time.perf_counter() - start
            if batch is _END:
                return
            yield batch

    def push(self, step: int, m: Any) -> None:
        """Records the step before `step`, and keeps this one's metrics for later."""
        self.flush()
        self.pending = (step, m)

    def flush(self) -> None:
        """Records the step pushed last (before an evaluation or a checkpoint)."""
        if self.pending is not None:
            self._record(*self.pending)
            self.pending = None

    def flush_into(self, meta: dict) -> None:
        """`flush`, then the window's sums into `meta`, for a checkpoint saved at this step."""
        self.flush()
        meta[WINDOW] = self.window.sums()

    def validation(self, step: int, val: dict) -> None:
        if self.log:
            self.log.write(step, "validation", val)
            self.bar.write(
                f"step {step}: validation {self.label}accuracy {val['accuracy']:.4f} "
                f"loss {val['loss']:.4f}"
            )

    def stop_early(self, step: int, patience: int) -> None:
        if self.log:
            self.bar.write(
                f"step {step}: validation has not improved for {patience} evaluations "
                f"(train.patience); stopping early, {self.total_steps - step} steps before the end"
            )

    def _record(self, step: int, m: Any) -> None:
        m = jax.device_get(m)
        if int(m["nonfinite_run"]) >= self.max_nonfinite:
            raise UserError(
                f"{self.max_nonfinite} consecutive steps had non-finite loss or gradients "
                f"(last at step {step}); lower config.optim.learning_rate. The last good "
                f"checkpoint is step {self.last_good()}"
            )
        self.window.add(m)
        if self.timed_steps or self.bar.disable:  # a disabled bar (process 1 of 2) has no clock
            self.bar.update(1)
        else:
            # A run's first step is mostly compiling: in the bar's rate it made the first ETA
            # hours long. The bar's clock and rate start after it instead.
            self.bar.n += 1
            self.bar.initial = self.bar.last_print_n = self.bar.n
            self.bar.start_t = self.bar.last_print_t = self.bar._time()
            self.bar.refresh()
        self.timed_steps += 1
        if step % self.log_every == 0 or step == self.total_steps:
            row = self.window.row(m)
            if self.log:
                self.log.write(step, "train", row)
            # In this order, not tqdm's alphabetical one: a narrow terminal cuts the line's end,
            # and skipped steps matter more than the speed.
            self.bar.set_postfix(
                {
                    "loss": f"{row['loss']:.3f}",
                    "acc": f"{row['accuracy']:.3f}",
                    "skipped": row["skipped_steps"],
                    "ex_s": f"{row['examples_per_sec']:.0f}",
                }
            )
            self.window.reset()

    def __exit__(self, *exc) -> None:
        self.bar.close()
        if self.log:
            self.log.close()
