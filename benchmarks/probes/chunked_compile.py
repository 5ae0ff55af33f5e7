"""Does another loop form compile chunked attention faster? Compile time of chunked fwd and
fwd+bwd with its key loop as today's lax.scan, as lax.fori_loop, and as lax.scan unrolled by 2,
beside the matrix form and jax.nn.

  PYTHONPATH=. python benchmarks/probes/chunked_compile.py [L=1024] [repeats=5]

Each repeat traces, lowers and compiles a fresh function of every form in turn (interleaved, so
machine load hits all alike); medians. Batch 8, 4 heads, head dim 32, float32, 128x128 chunks.
"""

import statistics
import sys
import time
import types
from unittest import mock

import jax
import jax.numpy as jnp
from jax import lax

from attn import chunked
from attn.attention import attention


def _fori_scan(f, init, xs):
    """lax.scan(f, init, xs) for an f that returns no outputs, as a fori_loop over the xs."""
    n = jax.tree.leaves(xs)[0].shape[0]
    body = lambda i, carry: f(carry, jax.tree.map(lambda x: x[i], xs))[0]
    return lax.fori_loop(0, n, body, init), None


LOOPS = {
    "scan": lax.scan,
    "fori_loop": _fori_scan,
    "scan unroll=2": lambda f, init, xs: lax.scan(f, init, xs, unroll=2),
}


def form(name: str, mode: str, spec: jax.ShapeDtypeStruct) -> float:
    """Seconds to trace, lower and compile one fresh program of the form."""
    implementation = "chunked" if name in LOOPS else name

    def one(q, k, v):
        return attention(q, k, v, implementation=implementation)[0]

    fn = jax.vmap(jax.vmap(one, in_axes=1, out_axes=1))
    if name == "jax.nn":
        fn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla")
    if mode == "fwd_bwd":
        fn = jax.grad(lambda q, k, v, fn=fn: fn(q, k, v).sum(), argnums=(0, 1, 2))
    lax_with_loop = types.SimpleNamespace(**{**vars(lax), "scan": LOOPS.get(name, lax.scan)})
    start = time.perf_counter()
    with mock.patch.object(chunked, "lax", lax_with_loop):  # only the key loop's scan changes
        jax.jit(fn).lower(spec, spec, spec).compile()
    return time.perf_counter() - start


def main(length: int, repeats: int) -> None:
    spec = jax.ShapeDtypeStruct((8, length, 4, 32), jnp.float32)
    names = [*LOOPS, "matrix", "jax.nn"]
    for mode in ("fwd", "fwd_bwd"):
        seconds = {n: [] for n in names}
        for _ in range(repeats):
            for n in names:
                seconds[n].append(form(n, mode, spec))
        for n in names:
            print(f"L={length} {mode:8s} {n:14s} compile {statistics.median(seconds[n]):.2f} s")


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 1024,
        int(sys.argv[2]) if len(sys.argv) > 2 else 5,
    )
