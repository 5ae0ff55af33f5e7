"""The cost of dropout's masks alone, as the encoder's training step draws them: per example and
layer under `jax.vmap` (one key each, as `attn.encoders.bert.model.blocks` does) or in one draw
for the whole batch, with `attn.layers.keep_mask` (16-bit draws) or `jax.random.bernoulli`.

  PYTHONPATH=. python benchmarks/probes/dropout_masks.py [--batch=32] [--length=128] [--rounds=15]

A layer's masks at all-MiniLM-L6-v2's shape: two hidden [L, 384] and the attention weights'
[12, L, L] per example. Each variant is jitted and compiled first, then `rounds` interleaved
rounds (the order rotated each round); per variant the median milliseconds and the median of its
per-round ratios to "keep_mask per example". The load average is printed before and after.
"""

import argparse
import os
import statistics
import time

import jax

from attn import layers

RATE = 0.1
D, H = 384, 12


def _bernoulli(rng, rate, shape):
    return jax.random.bernoulli(rng, 1.0 - rate, shape), 1.0 / (1.0 - rate)


def _masks(draw, rng, length):
    """One example's masks of one layer: attention weights, attention output, feed-forward."""
    r_w, r_att, r_ff = jax.random.split(rng, 3)
    shapes = ((H, length, length), (length, D), (length, D))
    return [draw(r, RATE, s)[0] for r, s in zip((r_w, r_att, r_ff), shapes, strict=True)]


def per_example(draw, batch, length):
    def fn(rng):
        keys = jax.random.split(rng, batch)
        return jax.vmap(lambda k: _masks(draw, k, length))(keys)

    return fn


def whole_batch(draw, batch, length):
    def fn(rng):
        r_w, r_att, r_ff = jax.random.split(rng, 3)
        shapes = ((batch, H, length, length), (batch, length, D), (batch, length, D))
        return [draw(r, RATE, s)[0] for r, s in zip((r_w, r_att, r_ff), shapes, strict=True)]

    return fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    a = parser.parse_args()
    variants = {
        "keep_mask per example": per_example(layers.keep_mask, a.batch, a.length),
        "keep_mask whole batch": whole_batch(layers.keep_mask, a.batch, a.length),
        "bernoulli per example": per_example(_bernoulli, a.batch, a.length),
        "bernoulli whole batch": whole_batch(_bernoulli, a.batch, a.length),
    }
    rng = jax.random.key(0)
    calls = {name: jax.jit(fn).lower(rng).compile() for name, fn in variants.items()}
    for call in calls.values():
        jax.block_until_ready(call(rng))
    load_before = os.getloadavg()
    names = list(calls)
    times = {name: [] for name in names}
    for r in range(a.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            jax.block_until_ready(calls[name](jax.random.fold_in(rng, r)))
            times[name].append(time.perf_counter() - start)
    load_after = os.getloadavg()
    print(
        f"one layer's dropout masks at {a.batch}x{a.length}, {a.rounds} interleaved rounds; load "
        f"average {' '.join(f'{x:.1f}' for x in load_before)} before, "
        f"{' '.join(f'{x:.1f}' for x in load_after)} after"
    )
    base = times[names[0]]
    for name, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, base, strict=True))
        print(f"  {name:24s} {1e3 * statistics.median(ts):8.2f} ms  /{names[0]} {ratio:.3f}")


if __name__ == "__main__":
    main()
