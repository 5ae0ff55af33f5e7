"""What donating the train state to the jitted step (`experiments/train.py`) saves.

  PYTHONPATH=. python benchmarks/probes/donation.py

The default config's full train step (adversarial loss included) on random tokens, batch 32, at
L=64 and L=256, jitted with and without `donate_argnums=0`, interleaved in blocks of 10 steps;
prints the median step time of each and their ratio. Without donation every step allocates and
writes new copies of the params and both Adam moments, dominated by the 131072x64 n-gram table.
"""

import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import default
from experiments import optimization


def main() -> None:
    config = default.get_config()
    cfg = optimization.model_config(config, vocab_size=3726, num_classes=2)
    tx = optimization.make_optimizer(config.optim, total_steps=1302)
    step = functools.partial(
        optimization.train_step, cfg=cfg, tx=tx, **optimization.loss_options(config.optim)
    )
    steps = {"plain": jax.jit(step), "donated": jax.jit(step, donate_argnums=0)}
    states = {k: optimization.init_state(jax.random.PRNGKey(0), cfg, tx) for k in steps}
    rng = np.random.default_rng(0)
    for length in (64, 256):
        batch = {
            "tokens": jnp.asarray(rng.integers(3, 3000, (32, length)), jnp.int32),
            "label": jnp.asarray(rng.integers(0, 2, 32)),
            "weight": jnp.ones(32),
        }
        times = {k: [] for k in steps}
        for k in steps:  # compile
            states[k], m = steps[k](states[k], batch)
            jax.block_until_ready(m)
        for _ in range(6):
            for k in steps:
                start = time.perf_counter()
                for _ in range(10):
                    states[k], m = steps[k](states[k], batch)
                jax.block_until_ready((states[k], m))
                times[k].append((time.perf_counter() - start) / 10)
        ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
        print(
            f"L={length}: plain {ms['plain']:.1f} ms, donated {ms['donated']:.1f} ms, "
            f"ratio {ms['donated'] / ms['plain']:.3f}"
        )


if __name__ == "__main__":
    main()
