"""Section 2: the train step. Ours against its Flax twin (`flax_twin`) on the same real batches
with the same optimizer, at the shortest, a middle and the longest bucket length; and the share
of a training loop's time spent waiting for the input pipeline."""

import dataclasses
import functools
import itertools
import statistics
import time

import jax
import ml_collections
import numpy as np

from attn import classifier
from benchmarks import config_file, flax_twin, timing
from experiments import fields
from experiments.data import batching, encoding
from experiments.training import classify, optim


def train_data(config: ml_collections.ConfigDict) -> tuple[classifier.ModelConfig, encoding.Split]:
    """The model config and the encoded train split that `config` trains on."""
    add_cls = config.model.pooling == "cls"
    data = encoding.load(config.data, ("train",), add_cls=add_cls)
    cfg = fields.model_config(config, data.tokenizer.vocab_size, len(data.label_names))
    return cfg, data.splits["train"]


def stream(config: ml_collections.ConfigDict, train: encoding.Split, start_step: int = 0):
    """Training batches from `start_step` on, in the order training uses."""
    return batching.train_stream(
        train.ids,
        train.labels,
        seed=config.train.seed,
        start_step=start_step,
        **batching.options(config.data),
    )


def plain_step(cfg: classifier.ModelConfig, tx, o: ml_collections.ConfigDict):
    """Our jitted train step without label smoothing, weight average or adversarial loss: the
    same computation as the Flax twin's."""
    return jax.jit(
        functools.partial(
            classify.train_step,
            cfg=cfg,
            tx=tx,
            label_smoothing=0.0,
            penalty_weight=o.penalty_weight,
        )
    )


def param_count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def run(quick: bool) -> dict:
    """The train section of results.json."""
    config = config_file("default.py:tiny" if quick else "default.py")
    o = config.optim
    cfg, train = train_data(config)
    tx = optim.make_optimizer(o, 1000)
    key = jax.random.key(config.train.seed)
    ours_state = optim.init_state(key, cfg, tx)
    ours_step = plain_step(cfg, tx, o)
    flax_step = jax.jit(
        functools.partial(flax_twin.train_step, cfg=cfg, tx=tx, penalty_weight=o.penalty_weight)
    )

    # One real batch per bucket length (from the epoch-0 order), shared by both models.
    by_length: dict[int, dict] = {}
    per_epoch = batching.steps_per_epoch(len(train.ids), config.data.batch_size)
    for batch in itertools.islice(stream(config, train), per_epoch):
        by_length.setdefault(batch["tokens"].shape[1], batch)
    # Shortest, middle and longest bucket: each length costs two compiles.
    lengths = sorted(by_length)
    lengths = (
        lengths[:1] if quick else sorted({lengths[0], lengths[len(lengths) // 2], lengths[-1]})
    )
    flax_state = flax_twin.init_state(key, cfg, tx, lengths[0])
    n_ours, n_flax = param_count(ours_state["params"]), param_count(flax_state["params"])
    if n_ours != n_flax:
        raise AssertionError(f"param counts differ: ours {n_ours}, flax {n_flax}")

    rows = []
    for length in lengths:
        batch = by_length[length]
        runs = {
            "ours": lambda b=batch: ours_step(ours_state, b),
            "flax": lambda b=batch: flax_step(flax_state, b),
        }
        timing.time_interleaved(runs, 1)  # compile
        times = timing.time_interleaved(runs, 2 if quick else 15)
        bsz = batch["tokens"].shape[0]
        real = int(batch["mask"].sum())
        row = {"L": length, "batch": bsz, "real_tokens": real}
        for name, ts in times.items():
            t = statistics.median(ts)
            row[name] = {
                "step_s": t,
                "examples_per_s": bsz / t,
                "tokens_per_s": bsz * length / t,
                "real_tokens_per_s": real / t,
            }
        row["ratio"] = row["ours"]["examples_per_s"] / row["flax"]["examples_per_s"]
        rows.append(row)
        print(
            f"train L={length:4d} B={bsz}: ours {row['ours']['examples_per_s']:8.1f} ex/s, "
            f"flax {row['flax']['examples_per_s']:8.1f} ex/s, ratio {row['ratio']:.3f}"
        )
    pipeline = input_pipeline_share(
        config, stream(config, train, per_epoch), ours_state, ours_step, 3 if quick else 60
    )
    print(
        f"input pipeline: {pipeline['wait_fraction']:.2%} of {pipeline['steps']} steps "
        f"({pipeline['examples_per_s']:.1f} ex/s end to end)"
    )
    ratios = [r["ratio"] for r in rows]
    return {
        "model": dataclasses.asdict(cfg),
        "optimizer": "experiments.training.optim.make_optimizer(config.optim) for both",
        "param_count": {"ours": n_ours, "flax": n_flax},
        "rows": rows,
        "pipeline": pipeline,
        "peak_rss_bytes": timing.peak_rss_bytes(),
        "targets": {
            "train_speed": {
                "target": "train step examples/s >= Flax baseline (ratio >= 1.0) at every length",
                "worst": min(ratios),
                "met": min(ratios) >= 1.0,
            }
        },
    }


def input_pipeline_share(config, batches, state, step, num_steps: int) -> dict:
    """Share of loop time spent in next() of prefetch(batches) over `num_steps` real steps."""
    # Compile every bucket shape first: compile time is neither input wait nor a typical step.
    for length in batching.bucket_sizes(config.data.buckets, config.data.max_len):
        b = config.data.batch_size
        tokens = np.full((b, length), 3, np.int32)
        warm = {"tokens": tokens, "mask": tokens != 0, "label": np.zeros(b, np.int32)}
        warm["weight"] = np.ones(b, np.float32)
        jax.block_until_ready(step(state, warm))
    batches = batching.prefetch(batches)
    wait, examples = 0.0, 0.0
    start = time.perf_counter()
    for _ in range(num_steps):
        t = time.perf_counter()
        batch = next(batches)
        wait += time.perf_counter() - t
        state, metrics = step(state, batch)
        examples += float(jax.device_get(metrics["count"]))
    total = time.perf_counter() - start
    return {
        "steps": num_steps,
        "seconds": total,
        "wait_seconds": wait,
        "wait_fraction": wait / total,
        "examples_per_s": examples / total,
    }
