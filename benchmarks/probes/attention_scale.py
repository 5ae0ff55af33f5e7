"""Why the matrix form holds one more [B, H, L, L] float32 buffer than jax.nn in fwd+bwd.

  PYTHONPATH=. python benchmarks/probes/attention_scale.py [L=1024] [repeats=5]

Variants of softmax(s) v that differ only in where the 1/sqrt(d) scale is applied; prints XLA temp
memory, the number of [B, H, L, L] broadcasts XLA materialises, and interleaved median time.
"""

import math
import statistics
import sys

import jax

from attn.attention import attention as attend
from benchmarks.timing import time_interleaved


def variant(where: str):
    def one(q_LxD, k_LxD, v_LxD):
        if where == "attn.attention":
            return attend(q_LxD, k_LxD, v_LxD)[0]
        d = q_LxD.shape[-1]
        if where == "(q k^T) / sqrt(d)":  # what attn.scores.scaled_dot does
            s_LxL = (q_LxD @ k_LxD.T) / math.sqrt(d)
        else:  # "(q / sqrt(d)) k^T": scale the [L, D] operand instead of the [L, L] product
            s_LxL = (q_LxD * (1 / math.sqrt(d))) @ k_LxD.T
        return jax.nn.softmax(s_LxL, axis=-1) @ v_LxD

    return jax.vmap(jax.vmap(one, in_axes=1, out_axes=1))


def main(length: int, repeats: int) -> None:
    shape = (8, length, 4, 32)
    q, k, v = (jax.random.normal(key, shape) for key in jax.random.split(jax.random.key(0), 3))
    fns = {w: variant(w) for w in ("attn.attention", "(q k^T) / sqrt(d)", "(q / sqrt(d)) k^T")}
    fns["jax.nn"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla")
    compiled = {}
    for name, fn in fns.items():
        grad = jax.grad(lambda q, k, v, fn=fn: fn(q, k, v).sum(), argnums=(0, 1, 2))
        c = jax.jit(grad).lower(q, k, v).compile()
        entry = c.as_text().split("ENTRY", 1)[1].splitlines()
        big = f"f32[8,4,{length},{length}]"
        n = sum(1 for line in entry if "wrapped_broadcast" in line.split("=")[0] and big in line)
        mib = c.memory_analysis().temp_size_in_bytes / 2**20
        print(f"{name:20s} temp {mib:8.1f} MiB, [B,H,L,L] broadcasts materialised: {n}")
        compiled[name] = c
    times = time_interleaved({n: lambda c=c: c(q, k, v) for n, c in compiled.items()}, repeats)
    ref = statistics.median(times["jax.nn"])
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name:20s} fwd+bwd {t * 1e3:8.1f} ms, x jax.nn {t / ref:.2f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (1024, 5))
