"""Several devices and processes, one job: data parallelism over every device of every process
(batches split, the state replicated), joining the processes through `jax.distributed`, and which
one writes.

With several processes each one builds only its own rows of a global batch (`DataParallel.rows`),
and `DataParallel.put` joins them into one global array; one process holds every row, so the same
code serves both.

Every process runs the same command. It joins the others when it is told how many there are
(`--num_processes`, or JAX_NUM_PROCESSES) or runs under a SLURM step of several tasks; JAX then
finds the coordinator and its own index by itself on Cloud TPU and under SLURM, and elsewhere
reads them from `--coordinator=HOST:PORT --process_id=I` (or JAX_COORDINATOR_ADDRESS,
JAX_PROCESS_ID). Without any of these it is one process, exactly as before.

A process that dies must not leave the others waiting forever in a collective: each process
beats in the coordination service's key-value store, and a process that sees a peer silent for
`--peer_timeout` seconds stops with one line naming it (`watch_peers`). JAX's own heartbeat check,
set to twice that, is the backstop; when process 0 (which hosts the coordination service) dies,
JAX stops the others at once with its own multi-line message. On CPU the processes create the
communicator of their collectives together as they join (`_join_collectives`), so that one
arriving late at its first train step is waited for.

A job ends with `finish` on every process: process 0 writes its files after the others are done,
and JAX's own shutdown aborts every process when one reaches it more than `--peer_timeout` seconds
after another; after `finish` they reach it together, with the watch stopped first, so that
leaving is not mistaken for a lost coordinator.
"""

import atexit
import dataclasses
import os
import socket
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.errors import UserError

DEFAULT_TIMEOUT = 120
_FOREVER_MS = 7 * 24 * 3600 * 1000  # a barrier whose peers the watch keeps an eye on instead

_watch: tuple[threading.Event, threading.Thread] | None = None  # this process's `watch_peers`


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
    num = fv.num_processes if fv.num_processes is not None else _int_env("JAX_NUM_PROCESSES")
    pid = fv.process_id if fv.process_id is not None else _int_env("JAX_PROCESS_ID")
    # Set by srun for the tasks of one step (not in a batch script that runs python directly).
    srun_tasks = _int_env("SLURM_STEP_NUM_TASKS") or 1
    if coordinator is None and num is None and pid is None and srun_tasks <= 1:
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
        heartbeat_timeout_seconds=2 * timeout,
        shutdown_timeout_seconds=timeout,
    )
    global _watch
    stop = threading.Event()
    watcher = threading.Thread(target=watch_peers, args=(timeout,), kwargs={"stop": stop})
    watcher.daemon = True
    watcher.start()
    _watch = (stop, watcher)
    # atexit runs last-registered first: the watch stops before JAX's own shutdown (registered
    # when jax was imported) disconnects this process, which it would report as a lost
    # coordinator.
    atexit.register(_stop_watching)
    _join_collectives(timeout)


def finish() -> None:
    """Leaves the job once every process has done its work; call it on every process at the end
    of a command that succeeded. The processes wait for each other (the watch still stopping the
    job if one dies meanwhile), then stop their watches and shut down together. Nothing for a
    single process."""
    client = jax_distributed.global_state.client
    if client is None:
        return
    try:
        client.wait_at_barrier("attn/finished", _FOREVER_MS)
    except Exception as e:  # the service saw a peer die before the watch did
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        _stop(f"process {jax.process_index()} of {jax.process_count()}: a peer died ({reason})")
    _stop_watching()
    jax.distributed.shutdown()


def _stop_watching() -> None:
    if _watch is not None:
        stop, watcher = _watch
        stop.set()
        watcher.join(timeout=30)  # a beat in flight; the watch reports nothing once stopped


def _join_collectives(timeout: int) -> None:
    """Creates the communicator of every device's collectives now, while the processes are in
    step, rather than at the first train step.

    On CPU, gloo gives each process 30 s (fixed; JAX has no setting for it) to join a new
    communicator, which XLA creates at the first collective over a set of devices and then
    reuses. Before the first train step each process compiles, and a resumed run restores its
    checkpoint, on its own: on a loaded machine one can arrive a minute after the other, and the
    job ended in gloo's DEADLINE_EXCEEDED (and JAX aborting the other process). Once the
    communicator exists, a process that arrives late at a collective is simply waited for.
    """
    if jax.default_backend() != "cpu":  # GPUs and TPUs have their own links
        return
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    split = NamedSharding(Mesh(np.array(devices), ("all",)), PartitionSpec("all"))
    ones = jax.make_array_from_process_local_data(split, np.ones(jax.local_device_count()))
    total = jax.jit(jnp.sum).lower(ones).compile()  # compiled before the barrier: in step after it
    try:
        jax_distributed.global_state.client.wait_at_barrier("attn/collectives", timeout * 1000)
    except Exception as e:  # a peer that died or hangs before its first collective
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(
            f"process {jax.process_index()}: the other processes did not reach their first "
            f"collective within {timeout} s ({reason})"
        ) from None
    total(ones).block_until_ready()


def watch_peers(
    timeout: float, beat_seconds: float = 1.0, stop: threading.Event | None = None
) -> None:
    """Runs until `stop` is set: beats for this process, and ends the process with a one-line
    error when a peer has not beaten for `timeout` seconds or the coordination service is gone
    while this process is still in the job."""
    # JAX has no public handle on the coordination service's key-value store (orbax reads the
    # same attribute).
    state = jax_distributed.global_state
    client, me, n = state.client, state.process_id, state.num_processes
    seen: dict[int, tuple[str, float]] = {}  # peer -> (its last beat, when it changed)
    stop = stop or threading.Event()
    for beat in range(sys.maxsize):
        now = time.monotonic()
        try:
            client.key_value_set(f"attn/alive/{me}", str(beat), allow_overwrite=True)
            for peer in (p for p in range(n) if p != me):
                try:
                    value = client.key_value_try_get(f"attn/alive/{peer}")
                except Exception as e:  # not beaten yet: its clock starts now
                    if "NOT_FOUND" not in str(e):
                        raise
                    value = ""
                if seen.get(peer, (None,))[0] != value:
                    seen[peer] = (value, now)
                elif now - seen[peer][1] > timeout and not stop.is_set():
                    _stop(
                        f"process {peer} of {n} has been silent for {timeout:.0f} s (it died or "
                        f"lost the network), so process {me} stops too"
                    )
        except Exception as e:  # the service itself is unreachable: process 0 is gone
            if stop.is_set() or state.client is not client:  # this process is leaving the job
                return
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            _stop(f"process {me} of {n} lost the coordinator, process 0 ({reason})")
        if stop.wait(beat_seconds):
            return


def _stop(message: str) -> None:
    """Ends this process at once: its main thread may be blocked in a collective for good."""
    print(  # on a line of its own, even after the progress bar's
        f"\nerror: {message}; rerun the same command on every process to resume from the last "
        "checkpoint",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


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


@dataclasses.dataclass(frozen=True)
class DataParallel:
    batch: NamedSharding  # first axis split over every device
    replicated: NamedSharding

    def rows(self, batch_size: int) -> slice:
        """The rows of a global batch that this process's devices hold (contiguous: the mesh
        lists each process's devices together)."""
        spans = self.batch.addressable_devices_indices_map((batch_size,)).values()
        starts, stops = zip(*(s[0].indices(batch_size)[:2] for s in spans), strict=True)
        return slice(min(starts), max(stops))

    def put(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Where a batch goes: this process's rows of it, joined with the other processes' into
        global arrays split along the first axis."""
        return {
            k: jax.make_array_from_process_local_data(self.batch, v) for k, v in local_batch.items()
        }


def data_parallel(data: Any) -> DataParallel:
    """Batch and replicated shardings over every device for config.data, whose batch sizes must
    divide by the device count."""
    n = jax.device_count()
    for name in ("batch_size", "eval_batch_size"):
        if data[name] % n:
            raise UserError(
                f"config.data.{name}={data[name]} is not divisible by the {n} devices; "
                f"use a multiple of {n}"
            )
    # Sorted by process, so that each process's rows of a batch are one contiguous block.
    ordered = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(ordered), ("data",))
    return DataParallel(
        NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    )


def fetch(x: jax.Array) -> np.ndarray:
    """A global array, whole, on the host of every process."""
    return multihost_utils.process_allgather(x, tiled=True)


def replicate(tree: Any, dp: DataParallel) -> Any:
    """`tree`, which every process computed alike, on every device of every process."""
    return jax.device_put(tree, dp.replicated)
