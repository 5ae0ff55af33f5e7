"""Section 7: a pretrained-size encoder (`attn.bert`). The cost of a fine-tuning step of the
all-MiniLM-L6-v2-shaped encoder with attn's attention against the same encoder calling
`jax.nn.dot_product_attention`, at L = 128, 256 and 512; and, given a real checkpoint directory
(--bert_dir), how far attn.bert's last hidden states are from transformers' Flax BERT (the
reference file benchmarks/bert_reference.py wrote) and from a float64 numpy forward, in float32
and in bfloat16 compute.

The step: forward, backward of the mean-pooled cross-entropy through a linear head, and an
optax AdamW update of every parameter (random params: timing does not depend on their values),
hidden dropout on, attention dropout off (`jax.nn.dot_product_attention` has none).
"""

import dataclasses
import functools
import json
import os
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from attn import bert, encoders, layers, pooling, reference
from attn.attention import Attention, attention
from benchmarks import timing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCES = os.path.join(ROOT, "tests", "data", "bert")
MINILM = bert.Config(
    vocab_size=30522, d_model=384, num_layers=6, num_heads=12, d_ff=1536, attention_dropout=0.0
)
LENGTHS = (128, 256, 512)
BATCH = 8


def jax_nn_attend(q_LxK, k_MxK, v_MxK, mask=None, *, score_params=None):
    """`jax.nn.dot_product_attention` (XLA) in `attn.multihead`'s attend form, for a key
    padding mask [M] or None."""
    del score_params
    m = None if mask is None else jnp.asarray(mask)[None, None, None, :]
    out = jax.nn.dot_product_attention(
        q_LxK[None, :, None], k_MxK[None, :, None], v_MxK[None, :, None], mask=m
    )
    return out[0, :, 0], None


METHODS = {
    "attn": attention,  # matrix form
    "jax.nn": jax_nn_attend,
}
MEMORY_ONLY = {"attn chunked": Attention(implementation="chunked")}


def step_flops(cfg: bert.Config, batch: int, length: int) -> float:
    """Matmul FLOPs of one step (forward + backward = 3x forward); embeddings and head left out."""
    d, f = cfg.d_model, cfg.d_ff
    dense = 2 * batch * length * cfg.num_layers * (4 * d * d + 2 * d * f)
    scores_and_mix = 2 * batch * cfg.num_layers * 2 * length * length * d
    return 3.0 * (dense + scores_and_mix)


def init_state(key: jax.Array, cfg: Any, tx) -> dict:
    """Random params of `cfg`'s encoder (any family's config) and a linear head, and tx's state."""
    k_enc, k_head = jax.random.split(key)
    params = {
        "encoder": encoders.init(k_enc, cfg),
        "head": layers.dense_init(k_head, cfg.d_model, 2),
    }
    return {"params": params, "opt": tx.init(params)}


def train_step(state: dict, batch: dict, rng: jax.Array, *, cfg: Any, attend, tx):
    """One fine-tuning step of any family's encoder: mean-pooled states -> linear head ->
    cross-entropy; AdamW."""

    def loss_fn(params):
        h_BxLxD = encoders.encode(
            params["encoder"], cfg, batch["ids"], batch["mask"], attend=attend, train=True,
            rng=rng,
        )  # fmt: skip
        pooled_BxD = jax.vmap(pooling.mean_pool)(h_BxLxD, batch["mask"])
        logits_BxC = layers.dense(params["head"], pooled_BxD.astype(jnp.float32))
        return optax.softmax_cross_entropy_with_integer_labels(logits_BxC, batch["label"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt = tx.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss


def make_batch(cfg: bert.Config, batch: int, length: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "ids": rng.integers(1, cfg.vocab_size, (batch, length), dtype=np.int32),
        "mask": np.ones((batch, length), bool),
        "label": np.arange(batch, dtype=np.int32) % 2,
    }


def compile_steps(cfg: Any, attends: dict, batch: dict, tx, state: dict) -> dict:
    """name -> (compiled step, compile seconds, XLA temp bytes)."""
    rng = jax.random.key(1)
    out = {}
    for name, attend in attends.items():
        step = jax.jit(functools.partial(train_step, cfg=cfg, attend=attend, tx=tx))
        start = time.perf_counter()
        compiled = step.lower(state, batch, rng).compile()
        seconds = time.perf_counter() - start
        analysis = compiled.memory_analysis()
        temp = int(analysis.temp_size_in_bytes) if analysis is not None else 0
        out[name] = (functools.partial(compiled, state, batch, rng), seconds, temp)
    return out


def cost_rows(cfg: bert.Config, lengths, batch_size: int, repeats: dict, matmul: float) -> list:
    tx = optax.adamw(1e-4, weight_decay=0.01)
    state = init_state(jax.random.key(0), cfg, tx)
    rows = []
    for length in lengths:
        batch = make_batch(cfg, batch_size, length)
        progs = compile_steps(cfg, METHODS, batch, tx, state)
        memory_only = compile_steps(cfg, MEMORY_ONLY, batch, tx, state)
        runs = {name: p[0] for name, p in progs.items()}
        timing.time_interleaved(runs, 1)  # first calls
        times = timing.time_interleaved(runs, repeats[length])
        flops = step_flops(cfg, batch_size, length)
        row = {"L": length, "batch": batch_size, "repeats": repeats[length], "gflop": flops / 1e9}
        for name, ts in times.items():
            t = statistics.median(ts)
            row[name] = {
                "step_s": t,
                "tokens_per_s": batch_size * length / t,
                "gflops": flops / t / 1e9,
                "fraction_of_matmul": flops / t / matmul,
                "compile_s": progs[name][1],
                "temp_bytes": progs[name][2],
            }
        for name, (_, seconds, temp) in memory_only.items():
            row[name] = {"compile_s": seconds, "temp_bytes": temp}
        row["ratio"] = row["jax.nn"]["step_s"] / row["attn"]["step_s"]  # > 1: attn is faster
        rows.append(row)
        print(
            f"bert step L={length:4d} B={batch_size}: attn {row['attn']['step_s']:.3f} s "
            f"({row['attn']['tokens_per_s']:.0f} tok/s, {row['attn']['fraction_of_matmul']:.0%} "
            f"of matmul), jax.nn {row['jax.nn']['step_s']:.3f} s, speed ratio {row['ratio']:.3f}"
        )
    return rows


def _max_diff(a, b, mask) -> float:
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(d[np.asarray(mask) > 0].max())


def numerics(bert_dir: str) -> dict:
    """attn.bert on a real checkpoint against its reference file and the float64 oracle."""
    if not bert_dir:
        return {"skipped": "no --bert_dir (a BERT model directory)"}
    from safetensors.numpy import load_file

    name = os.path.basename(os.path.normpath(bert_dir))
    ref_path = os.path.join(REFERENCES, f"{name}_reference.npz")
    if not os.path.exists(ref_path):
        return {"skipped": f"no {os.path.relpath(ref_path, ROOT)}: run bert_reference.py first"}
    ref = dict(np.load(ref_path))
    params, cfg = bert.load(bert_dir)
    tensors = load_file(os.path.join(bert_dir, "model.safetensors"))
    with open(os.path.join(bert_dir, "config.json"), encoding="utf-8") as f:
        hf = json.load(f)
    floats = {k: v for k, v in tensors.items() if v.dtype.kind == "f"}
    args = (ref["ids"], ref["mask"] > 0, ref["types"])
    oracle = reference.bert(floats, hf, *args)
    out = {
        "model": name,
        "param_count": bert.param_count(params),
        "file_float_values": int(sum(v.size for v in floats.values())),
        "shape": list(ref["ids"].shape),
        "real_tokens": int(ref["mask"].sum()),
        "largest_abs_value": float(np.abs(ref["hidden"])[ref["mask"] > 0].max()),
        "oracle_vs_flax": _max_diff(oracle, ref["hidden"], ref["mask"]),
    }
    for dtype in ("float32", "bfloat16"):
        c = dataclasses.replace(cfg, dtype=dtype)
        with jax.default_matmul_precision("float32"):
            h = jax.jit(bert.encode, static_argnums=1)(params, c, *args)
        out[dtype] = {
            "vs_flax": _max_diff(h, ref["hidden"], ref["mask"]),
            "vs_float64_numpy": _max_diff(h, oracle, ref["mask"]),
        }
    print(
        f"{name}: {out['param_count']:,} parameters; max |attn - Flax| on {out['real_tokens']} "
        f"real tokens: float32 {out['float32']['vs_flax']:.2e}, bfloat16 "
        f"{out['bfloat16']['vs_flax']:.2e} (largest |value| {out['largest_abs_value']:.2f})"
    )
    return out


def run(quick: bool, bert_dir: str) -> dict:
    """The bert section of results.json."""
    if quick:
        cfg = bert.Config(
            vocab_size=100, d_model=32, num_layers=1, num_heads=4, d_ff=64, attention_dropout=0.0
        )
        lengths, batch_size, repeats = (16,), 2, {16: 2}
    else:
        cfg, lengths, batch_size = MINILM, LENGTHS, BATCH
        repeats = {128: 7, 256: 5, 512: 5}
    n = 256 if quick else 2048
    matmul = timing.matmul_flops(n, 3 if quick else 7)
    print(f"matmul {n}² float32: {matmul / 1e9:.1f} GFLOP/s")
    rows = cost_rows(cfg, lengths, batch_size, repeats, matmul)
    ratios = [r["ratio"] for r in rows]
    return {
        "model": dataclasses.asdict(cfg),
        "param_count": bert.param_count(bert.init(jax.random.key(0), cfg)),
        "matmul_n": n,
        "matmul_flops": matmul,
        "rows": rows,
        "numerics": numerics(bert_dir),
        "peak_rss_bytes": timing.peak_rss_bytes(),
        "targets": {
            "step_speed": {
                "target": "fine-tuning step with attn's attention at least as fast as with "
                "jax.nn.dot_product_attention (speed ratio >= 1.0) at every L",
                "worst": min(ratios),
                "met": min(ratios) >= 1.0,
            }
        },
    }
