"""Section 5: what the Long Range Arena text configs cost. `configs/lra_text.py` (1,000 bytes)
and its `:4k` variant (4,000 bytes, chunked attention): the measured train step here, and from its
FLOPs what a full run costs here and on one accelerator.

A full-length batch is timed (the longest bucket); IMDB reviews average about 1,300 bytes, so at
4K most batches fall in shorter buckets and the estimate is an upper bound.
"""

import functools
import time

import jax
import jax.numpy as jnp

from benchmarks import config_file, timing
from experiments import fields
from experiments.data import tokenizers
from experiments.training import classify, optim

TRAIN_EXAMPLES = 22_500  # IMDB train less the 10% held out for validation
# Dense bf16 peak of one accelerator; a well-fed transformer step reaches about 30-40% of it.
ACCELERATORS = {"TPU v2 (one chip, 2 cores)": 45e12, "NVIDIA T4": 65e12, "NVIDIA A100": 312e12}
UTILISATION = 0.35


def step_flops(cfg, batch: int, length: int) -> float:
    """Matmul FLOPs of one train step (forward + backward = 3x forward)."""
    d, layers = cfg.d_model, cfg.num_layers
    dense = 2 * batch * length * layers * (4 * d * d + 2 * d * cfg.d_ff)  # qkvo + feed-forward
    attention = 2 * batch * layers * 2 * length * length * d  # QKᵀ and PV over all heads
    return 3.0 * (dense + attention)


def run(quick: bool) -> dict:
    rows = []
    for variant in ("tiny",) if quick else (None, "4k"):
        config = config_file(f"lra_text.py:{variant}" if variant else "lra_text.py")
        d, o = config.data, config.optim
        vocab = tokenizers.ByteTokenizer().vocab_size
        cfg = fields.model_config(config, vocab, 2)
        tx = optim.make_optimizer(o, 1000)
        state = optim.init_state(jax.random.key(0), cfg, tx)
        step = jax.jit(
            functools.partial(classify.train_step, cfg=cfg, tx=tx, **classify.loss_options(o))
        )
        tokens = jax.random.randint(jax.random.key(1), (d.batch_size, d.max_len), 3, vocab)
        batch = {
            "tokens": tokens,
            "mask": tokens != 0,
            "label": jnp.arange(d.batch_size, dtype=jnp.int32) % 2,
            "weight": jnp.ones((d.batch_size,), jnp.float32),
        }
        start = time.perf_counter()
        state, _ = jax.block_until_ready(step(state, batch))
        compile_s = time.perf_counter() - start
        # One timed step: at 4K bytes a step takes minutes on a CPU, far above timer noise.
        start = time.perf_counter()
        state, _ = jax.block_until_ready(step(state, batch))
        t = time.perf_counter() - start
        flops = step_flops(cfg, d.batch_size, d.max_len)
        steps = config.train.num_epochs * -(-TRAIN_EXAMPLES // d.batch_size)
        row = {
            "variant": variant or "1k",
            "max_len": d.max_len,
            "batch": d.batch_size,
            "implementation": cfg.implementation,
            "step_s": t,
            "steps_per_s": 1 / t,
            "compile_s": compile_s,
            "step_gflop": flops / 1e9,
            "cpu_gflops": flops / t / 1e9,
            "total_steps": steps,
            "hours_here": steps * t / 3600,
            "hours_on": {
                name: steps * flops / (peak * UTILISATION) / 3600
                for name, peak in ACCELERATORS.items()
            },
        }
        rows.append(row)
        print(
            f"lra_text {row['variant']}: {t:.2f} s/step ({flops / t / 1e9:.1f} GFLOP/s), "
            f"{steps} steps = {row['hours_here']:.1f} h here"
        )
    return {
        "rows": rows,
        "utilisation": UTILISATION,
        "peak_rss_bytes": timing.peak_rss_bytes(),
    }
