"""Peak RSS of one attention program in a fresh process, next to XLA's temp_size_in_bytes.

PYTHONPATH=. python benchmarks/probes/rss.py METHOD MODE L   (e.g. matrix fwd 4096)
"""

import resource
import sys

import jax

from benchmarks.attention import METHODS, program


def main(method: str, mode: str, length: int) -> None:
    shape = (8, length, 4, 32)
    q, k, v = (jax.random.normal(key, shape) for key in jax.random.split(jax.random.key(0), 3))
    compiled = jax.jit(program(METHODS[method], mode)).lower(q, k, v).compile()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    jax.block_until_ready(compiled(q, k, v))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**30
    print(
        f"{method} {mode} L={length}: XLA temp {temp:.2f} GiB; peak RSS {before:.2f} GiB "
        f"before the run, {after:.2f} GiB after (+{after - before:.2f})"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
