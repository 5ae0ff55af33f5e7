"""Issue 6: exact resume after SIGKILL, safe checkpoints, non-finite guard, bad input, devices."""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
from conftest import (
    ROOT,
    assert_one_line_error,
    assert_trees_equal,
    metric_rows,
    run,
    saved_state,
    tiny_flags,
)

from experiments import checkpoints

# Runs the real `experiments.train` command line, but stops dead at one point so that the test can
# SIGKILL it there. PAUSE=step:N stops before step N is computed (N-1 steps done and logged);
# PAUSE=save:<which>/<N> stops inside orbax's atomic save of that checkpoint, after its temporary
# directory is written and before the rename that would publish it.
_DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from orbax.checkpoint._src.path import atomicity
    from experiments import cli, steps, train

    kind, _, where = os.environ["PAUSE"].partition(":")

    def pause():
        open(os.environ["PAUSED_FILE"], "w").close()
        time.sleep(600)

    if kind == "step":
        real_step = steps.train_step

        def train_step(state, batch, **kw):
            if int(state["step"]) + 1 == int(where):
                pause()
            return real_step(state, batch, **kw)

        steps.train_step = train_step
    else:
        real_finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def finalize(self, *args, **kw):
            if str(self.get_final()).endswith(where):
                pause()
            return await real_finalize(self, *args, **kw)

        atomicity.AtomicRenameTemporaryPath.finalize = finalize
    sys.argv = ["experiments.train", *sys.argv[1:]]
    train.define_flags()
    cli.main(train.main)
    """
)


def _train_killed_at(pause: str, argv: list[str], tmp_path) -> str:
    """Starts training, waits until it reaches `pause`, SIGKILLs it; returns its stderr."""
    paused = tmp_path / f"paused-{pause.replace('/', '-').replace(':', '-')}"
    log = tmp_path / f"{paused.name}.log"
    env = {**os.environ, "PAUSE": pause, "PAUSED_FILE": str(paused)}
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 300
            while not paused.exists():
                assert proc.poll() is None, log.read_text("utf-8", "replace")[-3000:]
                assert time.monotonic() < deadline, "training never reached " + pause
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return log.read_text("utf-8", "replace")


def _tmp_dirs(workdir: str, which: str) -> list[str]:
    return [n for n in os.listdir(os.path.join(workdir, which)) if "tmp" in n]


def test_sigkill_anywhere_then_restart_is_bitwise_identical(trained, tfds_dir, tmp_path):
    """Killed while saving the first checkpoint, between checkpoints, while saving the best one."""
    workdir = str(tmp_path / "run")
    argv = [*tiny_flags(tfds_dir), f"--workdir={workdir}"]

    _train_killed_at("save:checkpoints/3", argv, tmp_path)
    # The half-written checkpoint is there, and is not a checkpoint.
    assert _tmp_dirs(workdir, "checkpoints") and not os.path.exists(f"{workdir}/checkpoints/3")
    assert checkpoints.manager(workdir, checkpoints.LAST, 2).latest_step() is None

    err = _train_killed_at("step:5", argv, tmp_path)
    assert "resuming" not in err  # nothing to resume from: started over
    assert max(r["step"] for r in metric_rows(workdir)) == 4

    err = _train_killed_at("save:best/6", argv, tmp_path)
    assert "resuming from step 3 of 6" in err
    assert _tmp_dirs(workdir, "best")

    proc = run("experiments.train", *argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from step 3 of 6" in proc.stderr and "test accuracy" in proc.stdout

    assert not _tmp_dirs(workdir, "checkpoints") and not _tmp_dirs(workdir, "best")
    assert metric_rows(workdir) == metric_rows(trained)
    for step in (3, 6):
        assert_trees_equal(saved_state(workdir, step), saved_state(trained, step))
    (best,) = os.listdir(os.path.join(trained, "best"))
    assert os.listdir(os.path.join(workdir, "best")) == [best]
    assert_trees_equal(
        saved_state(workdir, int(best), "best"), saved_state(trained, int(best), "best")
    )
    results = []
    for w in (workdir, trained):
        with open(os.path.join(w, "eval_test.json"), encoding="utf-8") as f:
            results.append({k: v for k, v in json.load(f).items() if k != "examples_per_sec"})
    assert results[0] == results[1]


def test_nonfinite_steps_are_skipped_then_training_stops(tfds_dir, tmp_path):
    workdir = str(tmp_path / "run")
    proc = run(
        "experiments.train",
        *tiny_flags(tfds_dir),
        f"--workdir={workdir}",
        "--config.optim.learning_rate=1e30",
        "--config.optim.max_nonfinite=3",
        "--config.train.max_steps=12",
    )
    assert_one_line_error(
        proc,
        "3 consecutive steps had non-finite",
        "learning_rate",
        "last good checkpoint is step 3",
    )
    assert "skipped=1" in proc.stderr and "skipped=2" in proc.stderr  # the progress bar
    rows = [r for r in metric_rows(workdir) if r["split"] == "train"]
    # Warmup starts at 0, so step 1 is sane; step 2's huge update makes every later loss NaN.
    assert [r["skipped_steps"] for r in rows] == [0, 0, 1, 2]
    assert all(math.isnan(r["loss"]) and math.isnan(r["grad_norm"]) for r in rows[2:])
    assert all(np.isfinite(r["loss"]) for r in rows[:2])
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3"]
    state = saved_state(workdir, 3)
    assert int(state["step"]) == 3
    # The skipped steps left the parameters as step 2 made them: finite.
    assert all(np.isfinite(np.asarray(x)).all() for x in __import__("jax").tree.leaves(state))
