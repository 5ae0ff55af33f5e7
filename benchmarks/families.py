"""Section 10: every encoder family's fine-tuning step at its real base size, with attn's
attention against the same step with `jax.nn.dot_product_attention`.

Each family's config is the size of the hub model a user would pick (its defaults; random weights:
timing does not depend on their values), the step is `benchmarks.bert`'s (forward, backward of the
mean-pooled cross-entropy through a linear head, AdamW over every parameter; hidden dropout on,
attention dropout off, since jax.nn has none), and the two attentions run interleaved in one
process: attn's matrix form (`attn.Attention()`) and jax.nn's XLA one (`implementation="xla"`,
with the family's own score and mask: ModernBERT's rotary q and k and its local windows go
through). A family whose score jax.nn cannot compute (DeBERTa's disentangled attention) is timed
against the BERT step of its size instead, which prices the relative-position terms. ModernBERT's
attn step is also timed at 3 and 12 layers: how it grows with depth.
"""

import dataclasses
import statistics

import jax
import numpy as np
import optax

from attn import encoders
from attn.attention import Attention
from benchmarks import bert, timing

# family -> the hub model whose size its config's defaults are.
MODELS = {
    "bert": "bert-base-uncased",
    "distilbert": "distilbert-base-uncased",
    "electra": "google/electra-base-discriminator",
    "modernbert": "answerdotai/ModernBERT-base",
    "deberta-v2": "microsoft/deberta-v3-base",
    "albert": "albert-base-v2",
}
LENGTH, BATCH = 128, 8
XLA = "jax.nn"
# The family whose step is timed at two depths, and the depths (--quick: 1 and 2): a step linear
# in depth grows by their ratio (4x from 3 to 12), less for the embeddings and head, which depth
# leaves alone.
DEPTH = ("modernbert", (3, 12))
# --quick: the same families at a tiny size (fields a family lacks are left out), one layer: the
# smoke test compiles 14 steps, and a step's compile time grows with its layers.
TINY = {
    "vocab_size": 100,
    "d_model": 32,
    "embedding_size": 32,
    "num_layers": 1,
    "num_heads": 4,
    "d_ff": 64,
    "local_window": 4,
    "position_buckets": 8,
}


def base_config(name: str, quick: bool):
    """The family's config at its hub model's size (its defaults; tiny with --quick),
    attention dropout off."""
    cfg = encoders.family(name).config()
    fields = {f.name for f in dataclasses.fields(cfg)}
    tiny = {k: v for k, v in TINY.items() if k in fields} if quick else {}
    return dataclasses.replace(cfg, **tiny, attention_dropout=0.0)


def _compiled(cfg, attend, batch: dict, tx) -> tuple:
    """(`benchmarks.bert`'s step bound to fresh state, compile seconds, XLA temp bytes, param
    count)."""
    state = bert.init_state(jax.random.key(0), cfg, tx)
    ((run, seconds, temp),) = bert.compile_steps(cfg, {"": attend}, batch, tx, state).values()
    return run, seconds, temp, encoders.param_count(state["params"])


def _batch(cfg, batch: int, length: int) -> dict:
    rng = np.random.default_rng(0)
    ids = rng.integers(1, cfg.vocab_size, (batch, length), dtype=np.int32)
    ids[ids == cfg.pad_id] = cfg.pad_id + 1  # padding comes from the mask alone
    mask = np.ones((batch, length), bool)
    mask[::2, length * 3 // 4 :] = False  # half the rows padded, as a batch of real texts is
    return {"ids": ids, "mask": mask, "label": np.arange(batch, dtype=np.int32) % 2}


def family_row(name: str, quick: bool, repeats: int) -> dict:
    """attn's step and the reference step of one family, timed interleaved."""
    cfg = base_config(name, quick)
    length, batch_size = (16, 2) if quick else (LENGTH, BATCH)
    batch = _batch(cfg, batch_size, length)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    fam = encoders.family(cfg)
    if "xla" in fam.unsupported:
        ref_name = "bert, same size"
        ref_cfg = base_config("bert", quick)
        ref_cfg = dataclasses.replace(ref_cfg, vocab_size=cfg.vocab_size, num_layers=cfg.num_layers)
        reference = _compiled(ref_cfg, Attention(), batch, tx)
        why = fam.unsupported["xla"]
    else:
        ref_name, why = XLA, ""
        reference = _compiled(cfg, Attention(implementation="xla"), batch, tx)
    attn_step = _compiled(cfg, Attention(), batch, tx)
    runs = {"attn": attn_step[0], ref_name: reference[0]}
    timing.time_interleaved(runs, 1)  # first calls
    times = timing.time_interleaved(runs, repeats)
    row = {
        "hub_id": MODELS[name],
        "model": dataclasses.asdict(cfg),
        "param_count": attn_step[3],
        "L": length,
        "batch": batch_size,
        "repeats": repeats,
        "reference": ref_name,
        "no_jax_nn": why,
    }
    for key, prog in (("attn", attn_step), ("reference_step", reference)):
        ts = times["attn" if key == "attn" else ref_name]
        row[key] = {
            "step_s": statistics.median(ts),
            "compile_s": prog[1],
            "temp_bytes": prog[2],
        }
    row["ratio"] = row["attn"]["step_s"] / row["reference_step"]["step_s"]  # < 1: attn faster
    print(
        f"{name} ({row['hub_id']}, {row['param_count']:,} params) B={batch_size} L={length}: "
        f"attn {row['attn']['step_s']:.2f} s, {ref_name} {row['reference_step']['step_s']:.2f} s,"
        f" attn / {ref_name} {row['ratio']:.3f}"
    )
    return row


def depth_row(quick: bool, repeats: int) -> dict:
    """DEPTH's family's attn step at its two depths (else the size `family_row` times), timed
    interleaved, and the deeper step's time over the shallower's."""
    name, depths = DEPTH[0], (1, 2) if quick else DEPTH[1]
    cfg = base_config(name, quick)
    length, batch_size = (16, 2) if quick else (LENGTH, BATCH)
    batch = _batch(cfg, batch_size, length)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    runs = {
        n: _compiled(dataclasses.replace(cfg, num_layers=n), Attention(), batch, tx)[0]
        for n in depths
    }
    timing.time_interleaved(runs, 1)  # first calls
    steps = {n: statistics.median(ts) for n, ts in timing.time_interleaved(runs, repeats).items()}
    shallow, deep = depths
    ratio = steps[deep] / steps[shallow]
    print(
        f"{name} depth: attn step {steps[shallow]:.2f} s at {shallow} layers, {steps[deep]:.2f} s "
        f"at {deep}: {deep} / {shallow} layers {ratio:.2f} (linear in depth: {deep / shallow:g})"
    )
    return {
        "family": name,
        "layers": list(depths),
        "step_s": [steps[n] for n in depths],
        "repeats": repeats,
        "ratio": ratio,
    }


def run(quick: bool) -> dict:
    """The families section of results.json."""
    repeats = 2 if quick else 5
    rows = {name: family_row(name, quick, repeats) for name in MODELS}
    return {
        "L": 16 if quick else LENGTH,
        "batch": 2 if quick else BATCH,
        "rows": rows,
        "depth": depth_row(quick, repeats),
        "peak_rss_bytes": timing.peak_rss_bytes(),
    }
