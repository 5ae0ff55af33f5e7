"""Measuring honestly in one process: interleaved timing, the machine's matmul rate, peak RSS."""

import resource
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each fn; each repeat runs every fn once, in turn."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return times


def matmul_flops(n: int, repeats: int, dtype=jnp.float32) -> float:
    """Measured FLOP/s of an n x n matmul in `dtype` (2 n^3 FLOPs), median of `repeats`."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    mm = jax.jit(jnp.matmul).lower(a, a).compile()
    jax.block_until_ready(mm(a, a))
    seconds = time_interleaved({"mm": lambda: mm(a, a)}, repeats)["mm"]
    return 2 * n**3 / statistics.median(seconds)
