"""Section 4: several processes. The default config's train step on 8 CPU devices, in one process
and in two processes of 4 devices each (jax.distributed, gloo collectives over local TCP): the
same global batches and the same program, so the ratio of step times is the price of crossing
processes. Each process is a fresh `python -c` worker; the one-process and two-process jobs
alternate, and each step is timed to `block_until_ready` after a warm-up that compiles."""

import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap

DEVICES = 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKER = textwrap.dedent(
    """
    import functools, json, sys, time
    from experiments import parallel
    num, pid, steps = (int(a) for a in sys.argv[1:4])
    port, spec = sys.argv[4:6]
    if num > 1:
        parallel.initialize(f"127.0.0.1:{port}", num, pid, timeout=120)
    import jax
    from benchmarks import config_file
    from benchmarks.train_step import train_data
    from experiments.data import batching
    from experiments.training import classify, optim

    config = config_file(spec)
    cfg, train = train_data(config)
    dp = parallel.data_parallel(config.data)
    tx = optim.make_optimizer(config.optim, 1000)
    state = parallel.replicate(optim.init_state(jax.random.PRNGKey(0), cfg, tx), dp)
    step = jax.jit(functools.partial(classify.train_step, cfg=cfg, tx=tx,
                                     **classify.loss_options(config.optim)))
    batches = batching.train_stream(train.ids, train.labels, seed=0,
                                    rows=dp.rows(config.data.batch_size),
                                    **batching.options(config.data))
    # Warm-up: the first steps of the stream compile one program per bucket they meet.
    warm = [dp.put(next(batches)) for _ in range(steps)]
    for b in warm:
        state, m = step(state, b)
    jax.block_until_ready(state)
    times = []
    for b in warm:  # the same batches again, now compiled
        start = time.perf_counter()
        state, m = step(state, b)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - start)
    if pid == 0:
        print(json.dumps(times))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(num_processes: int, steps: int, spec: str) -> list[float]:
    """Per-step seconds of one job of `num_processes` processes sharing DEVICES devices."""
    flags = f"--xla_force_host_platform_device_count={DEVICES // num_processes}"
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}"}
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(num_processes), str(pid), str(steps), port, spec],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(num_processes)
    ]
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode:
            raise RuntimeError(f"worker failed: {err[-2000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def run(quick: bool) -> dict:
    """The multihost section of results.json."""
    spec = "default.py:tiny" if quick else "default.py"
    steps, repeats = (4, 1) if quick else (30, 2)
    times: dict[str, list[float]] = {"one_process": [], "two_processes": []}
    # Alternate, so that drift in the machine's load hits both; one process first, which
    # prepares the dataset before two processes would race to.
    for _ in range(repeats):
        times["one_process"] += _job(1, steps, spec)
        times["two_processes"] += _job(2, steps, spec)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "config": spec,
        "devices": DEVICES,
        "steps_timed": len(times["one_process"]),
        "median_step_s": median,
        "ratio": median["two_processes"] / median["one_process"],
    }
