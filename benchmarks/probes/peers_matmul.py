"""XLA's matmul against PyTorch's on this CPU, at the shapes of the encoder's feed-forward
layer: why serving (section 9) can favour PyTorch when training does not.

  PYTHONPATH=. python benchmarks/probes/peers_matmul.py

in a venv with requirements-peers.txt. float32 [M, 384] x [384, 1536], M = batch x length tokens
(8192 = the serving batch of 64 x 128; 2048 = the 16 x 128 training batch); a jitted jnp.matmul
and torch.mm on as many threads as cores, interleaved, 15 rounds after 2.
"""

import functools
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks import timing


def main() -> None:
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    for m in (8192, 4096, 2048):
        a = np.random.default_rng(0).normal(size=(m, 384)).astype(np.float32)
        b = np.random.default_rng(1).normal(size=(384, 1536)).astype(np.float32)
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        mm = jax.jit(jnp.matmul).lower(ja, jb).compile()
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        calls = {"xla": functools.partial(mm, ja, jb), "torch": functools.partial(torch.mm, ta, tb)}
        timing.time_interleaved(calls, 2)
        t = timing.time_interleaved(calls, 15)
        ratio = statistics.median(x / y for x, y in zip(t["xla"], t["torch"], strict=True))
        gflop = 2 * m * 384 * 1536 / 1e9
        rates = ", ".join(f"{k} {gflop / statistics.median(v):.0f} GFLOP/s" for k, v in t.items())
        print(f"M={m}: {rates}; xla / torch time {ratio:.2f}")


if __name__ == "__main__":
    main()
