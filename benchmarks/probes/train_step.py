"""Where our train step loses time to the Flax twin at short lengths.

  PYTHONPATH=. python benchmarks/probes/train_step.py [L=32] [repeats=40]

1. The model alone: grad of logits.sum(), dropout 0.1 vs 0, ours vs Flax (no optimizer).
2. The step: our plain train step (`benchmarks.train_step.plain_step`) vs the same step without
   its `grad_norm` metric (a second global norm next to clip_by_global_norm's) vs the Flax step.
3. XLA's cost analysis (FLOPs, bytes) and the number of fusions of both compiled steps.
"""

import dataclasses
import functools
import statistics
import sys

import jax
import jax.numpy as jnp
import optax

from attn import classifier
from benchmarks import config_file, flax_twin
from benchmarks import train_step as bench
from benchmarks.timing import time_interleaved
from experiments.training import classify, optim


@functools.partial(jax.jit, static_argnames=("cfg", "tx"))
def step_without_grad_norm(state, batch, *, cfg, tx):
    rng = jax.random.fold_in(state["rng"], state["step"])

    def loss_fn(p):
        loss, m, _ = classify.loss_and_metrics(
            p, batch, cfg, label_smoothing=0.0, penalty_weight=0.1, train=True, rng=rng
        )
        return loss, m

    (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {**state, "params": params, "opt_state": opt_state}, {**m, "loss": loss}


def medians(runs: dict, repeats: int) -> dict:
    time_interleaved(runs, 2)
    return {n: statistics.median(ts) for n, ts in time_interleaved(runs, repeats).items()}


def main(length: int, repeats: int) -> None:
    config = config_file("default.py")
    cfg0, train = bench.train_data(config)
    batch = next(b for b in bench.stream(config, train) if b["tokens"].shape[1] == length)
    tokens = jnp.asarray(batch["tokens"])
    key = jax.random.key(0)

    runs = {}
    for tag, kw in (("dropout 0.1", {}), ("dropout 0", dict(dropout=0.0, embed_dropout=0.0))):
        cfg = dataclasses.replace(cfg0, **kw)
        po, flax_model = classifier.init(key, cfg), flax_twin.Classifier(cfg)
        pf = flax_model.init(key, tokens)["params"]
        go = jax.jit(
            jax.grad(
                lambda p, cfg=cfg: classifier.apply(p, tokens, cfg, train=True, rng=key)[0].sum()
            )
        )
        gf = jax.jit(
            jax.grad(
                lambda p, m=flax_model: m.apply(
                    {"params": p}, tokens, train=True, rngs={"dropout": key}
                )[0].sum()
            )
        )
        runs[f"model ours, {tag}"] = functools.partial(go, po)
        runs[f"model flax, {tag}"] = functools.partial(gf, pf)
    for name, t in medians(runs, repeats).items():
        print(f"L={length} grad of logits.sum(), {name:22s} {t * 1e3:7.2f} ms")

    tx = optim.make_optimizer(config.optim, 1000)
    so, sf = optim.init_state(key, cfg0, tx), flax_twin.init_state(key, cfg0, tx, length)
    ours_step = bench.plain_step(cfg0, tx, config.optim)
    flax_step = jax.jit(
        functools.partial(flax_twin.train_step, cfg=cfg0, tx=tx, penalty_weight=0.1)
    )
    kw = dict(cfg=cfg0, tx=tx)
    runs = {
        "plain train step": lambda: ours_step(so, batch),
        "minus grad_norm metric": lambda: step_without_grad_norm(so, batch, **kw),
        "flax": lambda: flax_step(sf, batch),
    }
    t = medians(runs, repeats)
    for name, s in t.items():
        print(f"L={length} step {name:24s} {s * 1e3:7.2f} ms, ex/s vs flax {t['flax'] / s:.3f}")

    lowered = {"ours": ours_step.lower(so, batch), "flax": flax_step.lower(sf, batch)}
    for name, low in lowered.items():
        c = low.compile()
        cost = c.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        entry = c.as_text().split("ENTRY", 1)[1]
        print(
            f"L={length} {name}: {cost['flops'] / 1e9:.3f} GFLOP, "
            f"{cost['bytes accessed'] / 1e9:.3f} GB accessed, {entry.count(' fusion(')} fusions"
        )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (32, 40))
