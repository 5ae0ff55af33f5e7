"""Several processes on one machine through jax.distributed: two processes of 4 CPU devices each
(gloo collectives) train like one process, resume exactly after SIGKILL, and a process that
cannot reach the coordinator stops with one line."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import (
    ROOT,
    TRAIN_DRIVER,
    _built_once,
    assert_one_line_error,
    assert_same_training,
    assert_trees_equal,
    metric_rows,
    run,
    run_here,
    saved_state,
    tiny_flags,
)

PEER_TIMEOUT = 15  # seconds: how long a process waits for a silent peer before the job stops


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_job(workdir: str, data_dir: str, log_dir, pauses=(None, None)) -> list:
    """Starts the two processes of one training job; `pauses` as PAUSE in conftest's driver."""
    port = _free_port()
    procs = []
    for pid, pause in enumerate(pauses):
        env = {
            **os.environ,
            "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count=4",
            "PAUSED_FILE": str(log_dir / f"paused{pid}"),
        }
        env.pop("PAUSE", None)
        if pause:
            env["PAUSE"] = pause
        argv = [
            *tiny_flags(data_dir),
            f"--workdir={workdir}",
            f"--coordinator=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={pid}",
            f"--peer_timeout={PEER_TIMEOUT}",
        ]
        with open(log_dir / f"out{pid}", "wb") as out, open(log_dir / f"err{pid}", "wb") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", TRAIN_DRIVER, *argv],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=err,
                )
            )
    return procs


def _finish(procs: list, log_dir, timeout: float = 300) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of each process, once all have exited."""
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    read = lambda name: (log_dir / name).read_text("utf-8", "replace")
    return [(p.returncode, read(f"out{i}"), read(f"err{i}")) for i, p in enumerate(procs)]


def _wait_paused(procs: list, log_dir, which: list[int]) -> None:
    deadline = time.monotonic() + 300
    while not all((log_dir / f"paused{i}").exists() for i in which):
        for i, p in enumerate(procs):
            assert p.poll() is None, (log_dir / f"err{i}").read_text("utf-8", "replace")[-3000:]
        assert time.monotonic() < deadline, "the job never reached its pause"
        time.sleep(0.05)


def _train_two_processes(data_dir: str, workdir: str, log_dir) -> list[tuple[int, str, str]]:
    log_dir.mkdir(parents=True, exist_ok=True)
    return _finish(_start_job(workdir, data_dir, log_dir), log_dir)


@pytest.fixture(scope="session")
def two_process_run(tmp_path_factory, tfds_dir) -> str:
    """A workdir of configs/default.py:tiny trained by two processes of 4 devices each."""

    def build(path: str) -> None:
        logs = tmp_path_factory.mktemp("two-process-logs")
        results = _train_two_processes(tfds_dir, os.path.join(path, "run"), logs)
        for status, _, err in results:
            assert status == 0, err[-3000:]
        (out0, out1) = (r[1] for r in results)
        # Process 0 alone reports (gloo's own "[Gloo] Rank ... connected" lines aside).
        assert "test accuracy" in out0 and "test accuracy" not in out1

    return os.path.join(_built_once(tmp_path_factory, "two_processes", build), "run")


@pytest.mark.slow
def test_two_processes_train_like_one(request, two_process_run):
    """Two processes of 4 devices = one process of 8 devices = one process of 1 device."""
    assert_same_training(two_process_run, request.getfixturevalue("eight_devices"))
    assert_same_training(two_process_run, request.getfixturevalue("trained"))


@pytest.mark.slow
def test_sigkill_of_one_process_then_both_then_restart_is_identical(request, tfds_dir, tmp_path):
    workdir = str(tmp_path / "run")
    data_dir = tfds_dir

    # One process dies after the step-3 checkpoint: the other stops within the peer timeout,
    # with one line naming it.
    logs = tmp_path / "a"
    logs.mkdir()
    procs = _start_job(workdir, data_dir, logs, pauses=(None, "step:5"))
    _wait_paused(procs, logs, [1])
    os.kill(procs[1].pid, signal.SIGKILL)
    (status0, out0, err0), (status1, _, _) = _finish(procs, logs, timeout=PEER_TIMEOUT + 60)
    assert status1 == -signal.SIGKILL
    survivor = subprocess.CompletedProcess([], status0, out0, err0)
    assert_one_line_error(survivor, "process 1 of 2 has been silent", "process 0 stops too")

    # Both die at once, later in the resumed run.
    logs = tmp_path / "b"
    logs.mkdir()
    procs = _start_job(workdir, data_dir, logs, pauses=("step:6", "step:6"))
    _wait_paused(procs, logs, [0, 1])
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    _finish(procs, logs)
    assert "resuming from step 3 of 6" in (logs / "err0").read_text("utf-8", "replace")

    logs = tmp_path / "c"
    logs.mkdir()
    results = _finish(_start_job(workdir, data_dir, logs), logs)
    for status, _, err in results:
        assert status == 0, err[-3000:]
    assert "resuming from step 3 of 6" in results[0][2]

    two_process_run = request.getfixturevalue("two_process_run")  # may be being built meanwhile
    assert metric_rows(workdir) == metric_rows(two_process_run)
    for step in (3, 6):
        assert_trees_equal(saved_state(workdir, step), saved_state(two_process_run, step))
    with open(os.path.join(workdir, "eval_test.json"), encoding="utf-8") as f:
        resumed = {k: v for k, v in json.load(f).items() if k != "examples_per_sec"}
    with open(os.path.join(two_process_run, "eval_test.json"), encoding="utf-8") as f:
        assert resumed == {k: v for k, v in json.load(f).items() if k != "examples_per_sec"}


# Process 1 reaches its first collective 40 s after process 0, as after a slow compile or
# checkpoint restore on a loaded machine: longer than the 30 s gloo gives a process to join a new
# communicator. (Creating JAX's CPU backend makes the processes meet: train does it at once, so
# here it comes before the delay.) Each process prints the sum over the global batch of its rows
# (1s and 2s).
_LATE_FIRST_COLLECTIVE = """
import sys, time
import jax, numpy as np
from experiments import parallel
port, pid = sys.argv[1], int(sys.argv[2])
parallel.initialize(f"127.0.0.1:{port}", 2, pid, timeout=120)
dp = parallel.data_parallel({"batch_size": 8, "eval_batch_size": 8})  # the processes meet here
if pid == 1:
    time.sleep(40)
x = dp.put({"x": np.full(4, pid + 1.0, np.float32)})["x"]
print(float(jax.jit(lambda x: x.sum())(x)))
"""


@pytest.mark.slow
def test_a_process_late_at_its_first_collective_is_waited_for(tmp_path):
    port = _free_port()
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count=2",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LATE_FIRST_COLLECTIVE, str(port), str(pid)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in (0, 1)
    ]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        assert out.split()[-1] == "12.0"  # after gloo's own "[Gloo] Rank ..." lines


# Process 0 writes its files (plots, baseline, results) after the others are done, here 3 times
# longer than the peer timeout: JAX's shutdown then timed out on the early process and aborted both.
# After `finish` each process lingers as a notebook would: its watch, still beating, read the
# shutdown as a lost coordinator and exited 1.
_LATE_PROCESS_0 = """
import sys, time
from experiments import parallel
port, pid = sys.argv[1], int(sys.argv[2])
parallel.initialize(f"127.0.0.1:{port}", 2, pid, timeout=3)
if pid == 0:
    time.sleep(9)
parallel.finish()
time.sleep(3)
print("finished", pid)
"""


@pytest.mark.slow
def test_a_job_whose_process_0_finishes_late_exits_0_on_every_process():
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LATE_PROCESS_0, str(port), str(pid)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in (0, 1)
    ]
    for pid, p in enumerate(procs):
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        assert out.split()[-2:] == ["finished", str(pid)]
        assert "error" not in err.lower(), err[-3000:]


def test_unreachable_coordinator_is_one_line_error_within_the_timeout(tfds_dir, tmp_path):
    port = _free_port()  # nobody listens there
    timeout = 3
    proc = run(
        "experiments.train",
        *tiny_flags(tfds_dir),
        f"--workdir={tmp_path / 'run'}",
        f"--coordinator=127.0.0.1:{port}",
        "--num_processes=2",
        "--process_id=1",
        f"--peer_timeout={timeout}",
        timeout=timeout + 60,  # start-up included; a hang fails here
    )
    error = assert_one_line_error(proc, "process 1", f"127.0.0.1:{port}", f"after {timeout} s")
    assert "cannot reach the coordinator" in error
    assert not os.path.exists(tmp_path / "run")  # refused before touching the workdir


@pytest.mark.parametrize(
    "flags, env, fragment",
    [
        (["--num_processes=2", "--process_id=2"], {}, "--process_id=2 is not in 0 .. 1"),
        (["--num_processes=0"], {}, "--num_processes must be >= 1"),
        (["--coordinator=10.0.0.1"], {}, "--coordinator='10.0.0.1' is not HOST:PORT"),
        (["--num_processes=2", "--peer_timeout=0"], {}, "--peer_timeout must be >= 1"),
        ([], {"JAX_NUM_PROCESSES": "two"}, "$JAX_NUM_PROCESSES='two' is not an integer"),
    ],
)
def test_bad_process_settings_are_one_line_errors(
    flags, env, fragment, tfds_dir, tmp_path, capsys, monkeypatch
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    workdir = tmp_path / "run"
    argv = [*tiny_flags(tfds_dir), f"--workdir={workdir}", *flags]
    assert_one_line_error(run_here("experiments.train", *argv, capsys=capsys), fragment)
    assert not workdir.exists()
