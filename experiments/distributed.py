"""Several processes, one job: joining them through `jax.distributed`, and which one writes.

Every process runs the same command. It joins the others when it is told how many there are
(`--num_processes`, or JAX_NUM_PROCESSES) or runs under a SLURM step of several tasks; JAX then
finds the coordinator and its own index by itself on Cloud TPU and under SLURM, and elsewhere
reads them from `--coordinator=HOST:PORT --process_id=I` (or JAX_COORDINATOR_ADDRESS,
JAX_PROCESS_ID). Without any of these it is one process, exactly as before.
"""

import os
import socket
import time

import jax
from absl import flags

from experiments.cli import UserError

DEFAULT_TIMEOUT = 120


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string(
        "coordinator",
        None,
        "HOST:PORT of process 0, where the processes of a job meet (default: "
        "$JAX_COORDINATOR_ADDRESS; found by JAX on Cloud TPU and under SLURM).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "num_processes",
        None,
        "Processes in the job (default: $JAX_NUM_PROCESSES, SLURM's task count, or 1).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "process_id",
        None,
        "This process's index, 0 .. num_processes - 1 (default: $JAX_PROCESS_ID).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "peer_timeout",
        DEFAULT_TIMEOUT,
        "Seconds to wait for the coordinator at start, and for a silent process before the "
        "job stops.",
        flag_values=fv,
    )


def initialize_from_flags(fv: flags.FlagValues) -> None:
    """Joins the job the flags and the environment describe; nothing when they describe none."""
    env = os.environ
    coordinator = fv.coordinator or env.get("JAX_COORDINATOR_ADDRESS")
    num = fv.num_processes or _int_env("JAX_NUM_PROCESSES")
    pid = fv.process_id if fv.process_id is not None else _int_env("JAX_PROCESS_ID")
    slurm_tasks = _int_env("SLURM_STEP_NUM_TASKS") or _int_env("SLURM_NTASKS")
    if coordinator is None and num is None and pid is None and (slurm_tasks or 1) <= 1:
        return
    initialize(coordinator, num, pid, timeout=fv.peer_timeout)


def initialize(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    *,
    timeout: int = DEFAULT_TIMEOUT,
) -> None:
    """`jax.distributed.initialize`, with the cases it would end in a crash dump (an address
    nobody answers at, a bad index) turned into one-line errors first. None = JAX finds it."""
    if timeout < 1:
        raise UserError(f"--peer_timeout must be >= 1 second, got {timeout}")
    if num_processes is not None and num_processes < 1:
        raise UserError(f"--num_processes must be >= 1, got {num_processes}")
    if process_id is not None and not 0 <= process_id < (num_processes or process_id + 1):
        raise UserError(f"--process_id={process_id} is not in 0 .. {num_processes - 1}")
    me = f"process {process_id if process_id is not None else '?'}"
    if coordinator is not None:
        host, sep, port = coordinator.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UserError(f"--coordinator={coordinator!r} is not HOST:PORT")
        if process_id != 0:  # process 0 starts the coordinator; the others must reach it
            _wait_for(host.strip("[]"), int(port), timeout, me)
    # CPU processes exchange arrays through gloo; GPU and TPU use their own links.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator,
        num_processes,
        process_id,
        initialization_timeout=timeout,
        heartbeat_timeout_seconds=timeout,
    )


def is_primary() -> bool:
    """Whether this process writes the files every process would write alike (logs, JSON, plots):
    process 0; a single process always."""
    return jax.process_index() == 0


def describe() -> str:
    return f"process {jax.process_index()} of {jax.process_count()}"


def _wait_for(host: str, port: int, timeout: float, me: str) -> None:
    """Returns once `host:port` accepts a connection; UserError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout)):
                return
        except OSError as e:
            reason = e.strerror or type(e).__name__
        if time.monotonic() >= deadline:
            raise UserError(
                f"{me} cannot reach the coordinator {host}:{port} ({reason}) after {timeout:.0f} "
                "s; start process 0 there, or fix --coordinator"
            )
        time.sleep(0.5)


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise UserError(f"${name}={value!r} is not an integer") from None
