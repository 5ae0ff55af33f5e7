"""XLA's matmul against PyTorch's on this CPU, at the shapes of the encoder's feed-forward
layer: why serving (section 9) can favour PyTorch when training does not.

  PYTHONPATH=. python benchmarks/probes/peers_matmul.py

in a venv with requirements-peers.txt. float32 [M, 384] x [384, 1536], M = batch x length tokens
(8192 = the serving batch of 64 x 128; 2048 = the 16 x 128 training batch); a jitted jnp.matmul
with XLA's defaults (YNNPACK's kernels, where jaxlib has them) and without YNNPACK (XLA's own dot
emitter and Eigen: what serving compiles with, `xla_options.forward()`), and torch.mm on as many
threads as cores, interleaved, 15 rounds after 2.
"""

import functools
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks import timing
from experiments.training import xla_options


def main() -> None:
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    for m in (8192, 4096, 2048):
        a = np.random.default_rng(0).normal(size=(m, 384)).astype(np.float32)
        b = np.random.default_rng(1).normal(size=(384, 1536)).astype(np.float32)
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        lowered = jax.jit(jnp.matmul).lower(ja, jb)
        mm, served = lowered.compile(), lowered.compile(compiler_options=xla_options.forward())
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        calls = {
            "xla": functools.partial(mm, ja, jb),
            "xla without ynn": functools.partial(served, ja, jb),
            "torch": functools.partial(torch.mm, ta, tb),
        }
        timing.time_interleaved(calls, 2)
        t = timing.time_interleaved(calls, 15)
        gflop = 2 * m * 384 * 1536 / 1e9
        rates = ", ".join(f"{k} {gflop / statistics.median(v):.0f} GFLOP/s" for k, v in t.items())
        ratio = {
            k: statistics.median(x / y for x, y in zip(t[k], t["torch"], strict=True))
            for k in ("xla", "xla without ynn")
        }
        ratios = ", ".join(f"{k} / torch time {r:.2f}" for k, r in ratio.items())
        print(f"M={m}: {rates}; {ratios}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
