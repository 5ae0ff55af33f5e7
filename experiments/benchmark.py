"""Benchmarks: attention kernels, the train step against Flax, and accuracy against a baseline.

  python -m experiments.benchmark [attention|train|accuracy|all] [--out=benchmarks] [--quick]

Writes `<out>/results.json` (sections not run keep their previous results), `<out>/REPORT.md`
with every target stated as met or missed, and PNG plots; prints a table per section.
Timings: compiled ahead of time, `block_until_ready`, methods interleaved within each repeat (so
drift hits all of them), median reported. Memory: XLA's exact `temp_size_in_bytes` from compiling
only, plus the process's peak RSS after each measurement.
`--quick` runs tiny sizes in seconds (used by tests/test_benchmark.py).
"""

import dataclasses
import functools
import json
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags

from attn.attention import attention as attend
from experiments import batching, cli, datasets, flax_reference, steps, tokenizers, train
from experiments.errors import UserError

SECTIONS = ("attention", "train", "accuracy")

_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
GIB = 1 << 30
MAX_TEMP_BYTES = 8 * GIB  # methods whose estimated peak memory exceeds this are not run
# XLA:CPU's fused custom (kCustom) kernels for softmax(QKᵀ)V allocate scratch outside buffer
# assignment, so temp_size_in_bytes misses it: a fresh process running the matrix or flax forward
# grows by two [B, H, L, L] float32 arrays while temp reports O(L) (benchmarks/probes/rss.py).
# The skip rule therefore adds that much to every form except the chunked one (RSS ~ temp there).
UNSEEN_LxL_SCRATCH = 2
MAX_RUN_SECONDS = 120.0  # ... nor those whose extrapolated single run would take longer
CELL_SECONDS = 6.0  # timing budget per (method, shape) once compiled: sets the repeats


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each fn; each repeat runs every fn once, in turn."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return times


def matmul_flops(n: int, repeats: int) -> float:
    """Measured FLOP/s of an n x n float32 matmul (2 n^3 FLOPs), median of `repeats`."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    mm = jax.jit(jnp.matmul).lower(a, a).compile()
    jax.block_until_ready(mm(a, a))
    seconds = time_interleaved({"mm": lambda: mm(a, a)}, repeats)["mm"]
    return 2 * n**3 / statistics.median(seconds)


# --------------------------------------------------------------------------------------------
# 1. attention


def _ours(implementation: str) -> Callable:
    """`attn.attention.attention` vmapped over heads and batch: q, k, v, out [B, L, H, D]."""

    def one(q_LxD, k_LxD, v_LxD):
        return attend(q_LxD, k_LxD, v_LxD, implementation=implementation)[0]

    return jax.vmap(jax.vmap(one, in_axes=1, out_axes=1))


METHODS: dict[str, Callable] = {
    "matrix": _ours("matrix"),
    "chunked": _ours("chunked"),
    "jax.nn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla"),
    "flax": lambda q, k, v: nn.dot_product_attention(q, k, v),
}
REFERENCE_TIME, REFERENCE_MEMORY = "jax.nn", "matrix"


def _program(fn: Callable, mode: str) -> Callable:
    if mode == "fwd":
        return fn
    return jax.grad(lambda q, k, v: fn(q, k, v).sum(), argnums=(0, 1, 2))


def attention_flops(batch: int, heads: int, length: int, d: int, mode: str) -> float:
    """Matmul FLOPs of the textbook algorithm: QKᵀ and PV forward, four products backward."""
    fwd = 4.0 * batch * heads * length**2 * d
    return fwd if mode == "fwd" else 3.0 * fwd


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
    batch: int
    heads: int
    shapes: tuple[tuple[int, int], ...]  # (L, head dim)
    only_chunked_above: int  # L above which only the chunked form is tried
    max_repeats: int
    matmul_n: int


def attention_plan(quick: bool) -> AttentionPlan:
    if quick:
        return AttentionPlan(2, 2, ((32, 8), (64, 8)), 64, 1, 256)
    lengths = (128, 512, 1024, 2048, 4096, 8192, 16384)
    shapes = [(L, 32) for L in lengths] + [(L, 64) for L in (512, 1024, 2048)]
    return AttentionPlan(8, 4, tuple(sorted(shapes)), 8192, 15, 2048)


def bench_attention(quick: bool) -> dict:
    plan = attention_plan(quick)
    mm_flops = matmul_flops(plan.matmul_n, 3 if quick else 7)
    print(f"{plan.matmul_n}² float32 matmul: {mm_flops / 1e9:.1f} GFLOP/s")
    rows = []
    last_time: dict[tuple[str, str, int], tuple[int, float]] = {}  # (method, mode, D) -> (L, s)
    for length, d in plan.shapes:
        shape = (plan.batch, length, plan.heads, d)
        keys = jax.random.split(jax.random.key(length * 1000 + d), 3)
        q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys)
        for mode in ("fwd", "fwd_bwd"):
            flops = attention_flops(plan.batch, plan.heads, length, d, mode)
            cells, runs = {}, {}
            for name, fn in METHODS.items():
                if length > plan.only_chunked_above and name != "chunked":
                    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
                    compiled = jax.jit(_program(fn, mode)).lower(spec, spec, spec).compile()
                else:
                    compiled = jax.jit(_program(fn, mode)).lower(q, k, v).compile()
                temp = int(compiled.memory_analysis().temp_size_in_bytes)
                scratch = 0 if name == "chunked" else UNSEEN_LxL_SCRATCH * 4 * length**2
                peak = temp + scratch * plan.batch * plan.heads
                cell = {"method": name, "mode": mode, "L": length, "D": d, "temp_bytes": temp}
                cell["estimated_peak_bytes"] = peak
                prev = last_time.get((name, mode, d))
                estimate = prev[1] * (length / prev[0]) ** 2 if prev else 0.0
                if peak > MAX_TEMP_BYTES:
                    cell["skipped"] = (
                        f"temp {temp / GIB:.1f} GiB, estimated peak {peak / GIB:.1f} GiB > 8 GiB"
                    )
                elif length > plan.only_chunked_above and name != "chunked":
                    cell["skipped"] = (
                        f"only the chunked form runs above L={plan.only_chunked_above}"
                    )
                elif estimate > MAX_RUN_SECONDS:
                    cell["skipped"] = (
                        f"one run extrapolated to {estimate:.0f} s > {MAX_RUN_SECONDS:.0f} s"
                    )
                else:
                    runs[name] = functools.partial(compiled, q, k, v)
                cells[name] = cell
            if runs:
                # Repeats from the slowest method's extrapolated time, so big shapes run once.
                slowest = max(
                    (
                        last_time[(n, mode, d)][1] * (length / last_time[(n, mode, d)][0]) ** 2
                        for n in runs
                        if (n, mode, d) in last_time
                    ),
                    default=0.0,
                )
                repeats = max(1, min(plan.max_repeats, int(CELL_SECONDS / max(slowest, 1e-9))))
                times = time_interleaved(runs, repeats)
                for name, ts in times.items():
                    t = statistics.median(ts)
                    last_time[(name, mode, d)] = (length, t)
                    cells[name].update(
                        time_s=t,
                        repeats=repeats,
                        gflops=flops / t / 1e9,
                        fraction_of_matmul=flops / t / mm_flops,
                    )
            rss = peak_rss_bytes()
            ref_t = cells[REFERENCE_TIME].get("time_s")
            ref_m = cells[REFERENCE_MEMORY]["temp_bytes"]
            for cell in cells.values():
                cell["peak_rss_bytes"] = rss
                cell["memory_ratio_vs_matrix"] = cell["temp_bytes"] / max(ref_m, 1)
                if ref_t and "time_s" in cell:
                    cell["time_ratio_vs_jax_nn"] = cell["time_s"] / ref_t
                rows.append(cell)
                _print_attention_row(cell)
    return {
        "batch": plan.batch,
        "heads": plan.heads,
        "dtype": "float32",
        "matmul_n": plan.matmul_n,
        "matmul_gflops": mm_flops / 1e9,
        "max_temp_bytes": MAX_TEMP_BYTES,
        "flops_note": "fwd 4·B·H·L²·D, fwd_bwd 3× that (no recomputation counted)",
        "rows": rows,
        "targets": attention_targets(rows),
    }


def _print_attention_row(c: dict) -> None:
    t = f"{c['time_s'] * 1e3:10.2f} ms" if "time_s" in c else f"{'skipped':>13}"
    ratio = f"{c['time_ratio_vs_jax_nn']:6.2f}x" if "time_ratio_vs_jax_nn" in c else " " * 7
    frac = f"{c['fraction_of_matmul']:6.1%}" if "fraction_of_matmul" in c else " " * 6
    print(
        f"L={c['L']:6d} D={c['D']:3d} {c['mode']:8s} {c['method']:8s} {t} {ratio} "
        f"mem {c['temp_bytes'] / 2**20:10.1f} MiB ({c['memory_ratio_vs_matrix']:7.3f}x) "
        f"{frac} {c.get('skipped', '')}"
    )


def _cell(rows, method, mode, length, d=None):
    for r in rows:
        if (r["method"], r["mode"], r["L"]) == (method, mode, length) and d in (None, r["D"]):
            return r
    return None


def attention_targets(rows: list[dict]) -> dict:
    """The three attention targets, each with its numbers and met / missed."""
    fb = [r for r in rows if r["method"] == "matrix" and r["mode"] == "fwd_bwd" and "time_s" in r]
    both = [(r, _cell(rows, "jax.nn", "fwd_bwd", r["L"], r["D"])) for r in fb]
    ratios = [
        {"L": r["L"], "D": r["D"], "ratio": r["time_s"] / x["time_s"]}
        for r, x in both
        if x and "time_s" in x
    ]
    worst = max((x["ratio"] for x in ratios), default=None)
    speed = {
        "target": "scaled-dot (matrix) fwd+bwd time <= 1.05x jax.nn.dot_product_attention",
        "ratios": ratios,
        "worst": worst,
        "met": worst is not None and worst <= 1.05,
    }

    lengths = sorted({r["L"] for r in rows})
    big = 8192 if 8192 in lengths else max(lengths)
    ch = _cell(rows, "chunked", "fwd_bwd", big, 32) or _cell(rows, "chunked", "fwd_bwd", big)
    nv = _cell(rows, "matrix", "fwd_bwd", big, ch["D"]) if ch else None
    mem_ratio = ch["temp_bytes"] / nv["temp_bytes"] if ch and nv else None
    time_ratio = ch["time_s"] / nv["time_s"] if ch and nv and "time_s" in nv else None
    # Where the naive form ran, the largest such L shows the time cost of chunking.
    ran = [
        (r["L"], r["time_s"], _cell(rows, "chunked", "fwd_bwd", r["L"], r["D"]))
        for r in fb
        if r["D"] == (ch["D"] if ch else 32)
    ]
    largest = max(ran, default=None, key=lambda x: x[0])
    chunked = {
        "target": f"chunked fwd+bwd at L={big}: temp <= 1/16 of matrix, time <= 1.3x matrix",
        "L": big,
        "memory_ratio": mem_ratio,
        "time_ratio": time_ratio,
        "matrix_skipped": nv.get("skipped") if nv else "not compiled",
        "largest_L_both_ran": largest[0] if largest else None,
        "time_ratio_at_largest_L_both_ran": (
            largest[2]["time_s"] / largest[1] if largest and largest[2] else None
        ),
        "memory_met": mem_ratio is not None and mem_ratio <= 1 / 16,
        "time_met": time_ratio is not None and time_ratio <= 1.3,
    }
    chunked["met"] = chunked["memory_met"] and chunked["time_met"]

    top = max(lengths)
    c_top = _cell(rows, "chunked", "fwd_bwd", top, 32) or _cell(rows, "chunked", "fwd_bwd", top)
    n_top = _cell(rows, "matrix", "fwd_bwd", top, c_top["D"]) if c_top else None
    runs_where = {
        "target": f"chunked fwd+bwd runs at L={top} where matrix temp exceeds 8 GiB",
        "L": top,
        "chunked_time_s": c_top.get("time_s") if c_top else None,
        "chunked_temp_bytes": c_top["temp_bytes"] if c_top else None,
        "matrix_temp_bytes": n_top["temp_bytes"] if n_top else None,
        "met": bool(c_top and "time_s" in c_top and n_top and n_top["temp_bytes"] > MAX_TEMP_BYTES),
    }
    return {"matrix_speed": speed, "chunked_memory": chunked, "chunked_long": runs_where}


# --------------------------------------------------------------------------------------------
# 2. train step


def load_config(spec: str) -> ml_collections.ConfigDict:
    """configs/<spec> (e.g. "default.py:tiny"), read at run time."""
    return cli.load_config_file(os.path.join(_CONFIG, spec))


def _train_data(config):
    d = config.data
    texts, labels, names = datasets.load_split(d, "train")
    tok = tokenizers.build_tokenizer(
        d.tokenizer, texts, lowercase=d.lowercase, min_freq=d.min_freq, max_vocab=d.max_vocab
    )
    cfg = train.model_config(config, tok.vocab_size, len(names))
    enc = batching.encode_all(tok, texts, max_len=d.max_len, add_cls=cfg.pooling == "cls")
    return cfg, enc, labels


def _epoch(config, enc, labels, epoch: int = 0):
    d = config.data
    return batching.train_batches(
        enc,
        labels,
        batch_size=d.batch_size,
        buckets=tuple(d.buckets),
        max_len=d.max_len,
        seed=config.train.seed,
        epoch=epoch,
    )


def _count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def bench_train(quick: bool) -> dict:
    config = load_config("default.py:tiny" if quick else "default.py")
    o = config.optim
    cfg, enc, labels = _train_data(config)
    tx = steps.make_optimizer(o, 1000)
    key = jax.random.key(config.train.seed)
    ours_state = steps.init_state(key, cfg, tx)
    ours_kw = dict(cfg=cfg, tx=tx, label_smoothing=0.0, penalty_weight=o.penalty_weight)
    flax_step = jax.jit(flax_reference.train_step, static_argnames=("cfg", "tx", "penalty_weight"))
    flax_kw = dict(cfg=cfg, tx=tx, penalty_weight=o.penalty_weight)

    # One real batch per bucket length (from the epoch-0 order), shared by both models.
    by_length: dict[int, dict] = {}
    for batch in _epoch(config, enc, labels):
        by_length.setdefault(batch["tokens"].shape[1], batch)
    # Shortest, middle and longest bucket: each length costs two compiles.
    lengths = sorted(by_length)
    lengths = (
        lengths[:1] if quick else sorted({lengths[0], lengths[len(lengths) // 2], lengths[-1]})
    )
    flax_state = flax_reference.init_state(key, cfg, tx, lengths[0])
    n_ours, n_flax = _count(ours_state["params"]), _count(flax_state["params"])
    if n_ours != n_flax:
        raise AssertionError(f"param counts differ: ours {n_ours}, flax {n_flax}")

    rows = []
    for length in lengths:
        batch = {k: v for k, v in by_length[length].items() if k != "index"}
        runs = {
            "ours": lambda b=batch: steps.train_step(ours_state, b, **ours_kw),
            "flax": lambda b=batch: flax_step(flax_state, b, **flax_kw),
        }
        time_interleaved(runs, 1)  # compile
        times = time_interleaved(runs, 2 if quick else 15)
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
    pipeline = input_pipeline_share(config, enc, labels, ours_state, ours_kw, 3 if quick else 60)
    print(
        f"input pipeline: {pipeline['wait_fraction']:.2%} of {pipeline['steps']} steps "
        f"({pipeline['examples_per_s']:.1f} ex/s end to end)"
    )
    ratios = [r["ratio"] for r in rows]
    return {
        "model": dataclasses.asdict(cfg),
        "optimizer": "experiments.steps.make_optimizer(config.optim) for both",
        "param_count": {"ours": n_ours, "flax": n_flax},
        "rows": rows,
        "pipeline": pipeline,
        "peak_rss_bytes": peak_rss_bytes(),
        "targets": {
            "train_speed": {
                "target": "train step examples/s >= Flax baseline (ratio >= 1.0) at every length",
                "worst": min(ratios),
                "met": min(ratios) >= 1.0,
            }
        },
    }


def input_pipeline_share(config, enc, labels, state, step_kw, num_steps: int) -> dict:
    """Share of loop time spent in next() of prefetch(train_batches(...)) over real steps."""
    # Compile every bucket shape first: compile time is neither input wait nor a typical step.
    for length in batching.bucket_sizes(config.data.buckets, config.data.max_len):
        b = config.data.batch_size
        tokens = np.full((b, length), 3, np.int32)
        warm = {"tokens": tokens, "mask": tokens != 0, "label": np.zeros(b, np.int32)}
        warm["weight"] = np.ones(b, np.float32)
        jax.block_until_ready(steps.train_step(state, warm, **step_kw))
    batches = batching.prefetch(_epoch(config, enc, labels, epoch=1))
    wait, examples, done = 0.0, 0.0, 0
    start = time.perf_counter()
    for _ in range(num_steps):
        t = time.perf_counter()
        batch = next(batches, None)
        wait += time.perf_counter() - t
        if batch is None:
            break
        batch.pop("index")
        state, metrics = steps.train_step(state, batch, **step_kw)
        examples += float(jax.device_get(metrics["count"]))
        done += 1
    total = time.perf_counter() - start
    return {
        "steps": done,
        "seconds": total,
        "wait_seconds": wait,
        "wait_fraction": wait / total,
        "examples_per_s": examples / total,
    }


# --------------------------------------------------------------------------------------------
# 3. accuracy


def tfidf_baseline(
    data_cfg, *, grid: tuple[float, ...], sublinear: bool, max_train: int | None = None
) -> dict:
    """Char 1-3-gram TF-IDF + logistic regression: fit on train, C chosen on validation.

    sublinear=True (tf -> 1 + log tf) is the recipe of shared/DESIGN.md's 86.3%."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    start = time.perf_counter()
    split = datasets.load_splits(data_cfg)
    x_train, y_train = split["train"][0][:max_train], split["train"][1][:max_train]
    vec = TfidfVectorizer(
        analyzer="char", ngram_range=(1, 3), lowercase=data_cfg.lowercase, sublinear_tf=sublinear
    )
    f_train = vec.fit_transform(x_train)
    f_val, f_test = (vec.transform(split[s][0]) for s in ("validation", "test"))
    val_acc, models = {}, {}
    for c in grid:
        models[c] = LogisticRegression(C=c, max_iter=2000).fit(f_train, y_train)
        val_acc[c] = float((models[c].predict(f_val) == split["validation"][1]).mean())
    best = max(grid, key=lambda c: val_acc[c])
    test_acc = float((models[best].predict(f_test) == split["test"][1]).mean())
    return {
        "test_accuracy": test_acc,
        "sublinear_tf": sublinear,
        "best_C": best,
        "validation_accuracy": {str(c): a for c, a in val_acc.items()},
        "num_train": len(x_train),
        "num_test": len(split["test"][0]),
        "wall_s": time.perf_counter() - start,
    }


def _train_variant(config: ml_collections.ConfigDict) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        test = train.train_and_evaluate(config, workdir)
        wall = time.perf_counter() - start
    return {
        "test_accuracy": test["accuracy"],
        "test_macro_f1": test["macro_f1"],
        "best_step": test["step"],
        "wall_s": wall,
        "model": config.model.to_dict(),
        "epochs": config.train.num_epochs,
        "max_steps": config.train.max_steps,
    }


def _accuracy_config(spec: str, quick: bool) -> ml_collections.ConfigDict:
    config = load_config(spec)
    if quick:  # one bucket: one compile per step function
        config.data.buckets = (config.data.max_len,)
    return config


def bench_accuracy(quick: bool) -> dict:
    base = "default.py:tiny" if quick else "default.py"
    default = _accuracy_config(base, quick)
    results = {"default": _train_variant(default)}
    structured = _accuracy_config(base if quick else "default.py:structured", quick)
    structured.model.pooling = "structured"  # a no-op for the named variant; tiny needs it
    results["structured"] = _train_variant(structured)
    if default.model.pooling == "mean":
        results["mean"] = {**results["default"], "same_as": "default"}
    else:
        mean = _accuracy_config(base, quick)
        mean.model.pooling = "mean"
        results["mean"] = _train_variant(mean)
    for name in ("default", "structured", "mean"):
        r = results[name]
        print(f"{name}: test {r['test_accuracy']:.4f} ({r['wall_s']:.0f} s)")
    grid = (1.0, 10.0) if quick else (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
    for key, sublinear in (("tfidf_logreg", False), ("tfidf_sublinear_logreg", True)):
        results[key] = tfidf_baseline(
            default.data, grid=grid, sublinear=sublinear, max_train=2000 if quick else None
        )
        b = results[key]
        print(f"{key}: test {b['test_accuracy']:.4f} (C={b['best_C']}, {b['wall_s']:.0f} s)")
    # The bar is the better of the two on test: stricter than choosing between them on validation.
    b = max(
        results["tfidf_logreg"], results["tfidf_sublinear_logreg"], key=lambda r: r["test_accuracy"]
    )
    d = results["default"]
    results["config"] = base
    results["peak_rss_bytes"] = peak_rss_bytes()
    results["targets"] = {
        "beats_baseline": {
            "target": "default config beats the better TF-IDF+logreg test accuracy in < 5 min "
            "on 2 cores",
            "accuracy": d["test_accuracy"],
            "baseline": b["test_accuracy"],
            "wall_s": d["wall_s"],
            "met": d["test_accuracy"] > b["test_accuracy"] and d["wall_s"] < 300,
        }
    }
    return results


# --------------------------------------------------------------------------------------------
# report


def _met(t: dict) -> str:
    return "**met**" if t["met"] else "**missed**"


def _num(x, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


_STYLE = {"matrix": ("o", "-"), "chunked": ("s", "-"), "jax.nn": ("^", "--"), "flax": ("v", ":")}


def plot_attention(att: dict, out: str) -> list[str]:
    """Time and temp memory against L (log-log), one line per method, fwd and fwd+bwd panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = min(r["D"] for r in att["rows"])
    rows = [r for r in att["rows"] if r["D"] == d]
    names = []
    for key, label in (("time_s", "time (s)"), ("temp_bytes", "XLA temp memory (MiB)")):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, mode in zip(axes, ("fwd", "fwd_bwd"), strict=True):
            for method in METHODS:
                pts = sorted(
                    (r["L"], r[key], "skipped" in r)
                    for r in rows
                    if r["method"] == method and r["mode"] == mode and key in r
                )
                if not pts:
                    continue
                marker, ls = _STYLE[method]
                scale = 1 if key == "time_s" else 2**-20
                xs, ys = [p[0] for p in pts], [p[1] * scale for p in pts]
                line = ax.plot(xs, ys, marker=marker, ls=ls, label=method, alpha=0.85)
                skipped = [p for p in pts if p[2]]
                if skipped:  # memory of compiled-but-not-run programs: hollow markers
                    ax.scatter(
                        [p[0] for p in skipped],
                        [p[1] * scale for p in skipped],
                        s=80,
                        facecolors="none",
                        edgecolors=line[0].get_color(),
                    )
            if key == "temp_bytes":
                ax.axhline(
                    MAX_TEMP_BYTES / 2**20,
                    color="gray",
                    ls="--",
                    lw=1,
                    label="8 GiB skip threshold",
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L")
            ax.set_title(f"{'forward' if mode == 'fwd' else 'forward + backward'}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel(label)
        axes[1].legend()
        fig.suptitle(
            f"attention, float32, batch {att['batch']}, {att['heads']} heads, head dim {d}"
            + (" (hollow: compiled only, not run)" if key == "temp_bytes" else "")
        )
        fig.tight_layout()
        name = f"attention_{'time' if key == 'time_s' else 'memory'}.png"
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def _attention_md(att: dict, out: str) -> list[str]:
    t = att["targets"]
    lines = [
        "## 1. Attention kernels",
        "",
        f"float32, batch {att['batch']}, {att['heads']} heads; q, k, v [B, L, H, D]; no mask. "
        f"`matrix` and `chunked` are `attn.attention.attention` vmapped over batch and heads; "
        f"`jax.nn` is `jax.nn.dot_product_attention(implementation='xla')`; `flax` is "
        f"`flax.linen.dot_product_attention`. fwd+bwd = grad of the sum of outputs wrt q, k, v. "
        f"Time: median over interleaved repeats of the AOT-compiled program; memory: XLA "
        f"`temp_size_in_bytes`; est. peak adds the two [B, H, L, L] float32 scratch arrays that "
        f"XLA:CPU's fused kernels allocate outside it for every form but the chunked one "
        f"(measured with benchmarks/probes/rss.py); the 8 GiB skip rule uses est. peak. "
        f"FLOP/s use {att['flops_note']}, as a fraction of the "
        f"{att['matmul_n']}² float32 matmul measured in the same run: "
        f"**{att['matmul_gflops']:.1f} GFLOP/s**.",
        "",
        "| L | D | mode | method | time (ms) | × jax.nn | temp MiB | × matrix | est. peak MiB "
        "| GFLOP/s | of matmul | repeats | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in att["rows"]:
        lines.append(
            f"| {r['L']} | {r['D']} | {r['mode']} | {r['method']} | "
            f"{_num(r.get('time_s') and r['time_s'] * 1e3, '.1f')} | "
            f"{_num(r.get('time_ratio_vs_jax_nn'), '.2f')} | {r['temp_bytes'] / 2**20:.1f} | "
            f"{r['memory_ratio_vs_matrix']:.3f} | {r['estimated_peak_bytes'] / 2**20:.0f} | "
            f"{_num(r.get('gflops'), '.1f')} | "
            f"{_num(r.get('fraction_of_matmul'), '.1%')} | {r.get('repeats', '')} | "
            f"{r.get('skipped', '')} |"
        )
    s, c, lg = t["matrix_speed"], t["chunked_memory"], t["chunked_long"]
    ratios = ", ".join(f"L={x['L']}/D={x['D']}: {x['ratio']:.3f}" for x in s["ratios"])
    lines += [
        "",
        "### Targets",
        "",
        f"- {s['target']}: {_met(s)}; worst ratio {_num(s['worst'], '.3f')} ({ratios}).",
        f"- {c['target']}: memory {_met({'met': c['memory_met']})} (chunked/matrix "
        f"{_num(c['memory_ratio'], '.5f')}); time "
        f"{_met({'met': c['time_met']})} (chunked/matrix {_num(c['time_ratio'], '.2f')}; "
        f"matrix at L={c['L']}: {c['matrix_skipped'] or 'ran'}; at L={c['largest_L_both_ran']}, "
        f"the largest L where both ran, chunked/matrix time = "
        f"{_num(c['time_ratio_at_largest_L_both_ran'], '.2f')}).",
        f"- {lg['target']}: {_met(lg)}; chunked {_num(lg['chunked_time_s'], '.1f')} s with "
        f"{lg['chunked_temp_bytes'] / 2**20:.0f} MiB temp; matrix would need "
        f"{lg['matrix_temp_bytes'] / GIB:.1f} GiB.",
        "",
    ]
    for name in plot_attention(att, out):
        lines += [f"![{name}]({name})", ""]
    return lines


def _train_md(tr: dict) -> list[str]:
    p, t = tr["pipeline"], tr["targets"]["train_speed"]
    m = tr["model"]
    lines = [
        "## 2. Train step: ours vs a flax.linen twin",
        "",
        f"`experiments.steps.train_step` (jit) against `experiments.flax_reference` "
        f"(`nn.MultiHeadDotProductAttention`, same embedding, positions, pre-LN blocks, pooling "
        f"and head), same real batch, same optax optimizer, dropout on in both. Model: "
        f"d_model {m['d_model']}, {m['num_heads']} heads, {m['num_layers']} layer(s), d_ff "
        f"{m['d_ff']}, pooling {m['pooling']}, n-gram buckets {m['ngram_buckets']}, vocab "
        f"{m['vocab_size']}. Parameter counts: ours {tr['param_count']['ours']:,}, flax "
        f"{tr['param_count']['flax']:,} (asserted equal). Median of interleaved steps.",
        "",
        "| L | batch | ours ex/s | flax ex/s | ratio | ours tokens/s | flax tokens/s "
        "| ours real tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in tr["rows"]:
        o, f = r["ours"], r["flax"]
        lines.append(
            f"| {r['L']} | {r['batch']} | {o['examples_per_s']:.1f} | {f['examples_per_s']:.1f} | "
            f"{r['ratio']:.3f} | {o['tokens_per_s']:.0f} | {f['tokens_per_s']:.0f} | "
            f"{o['real_tokens_per_s']:.0f} |"
        )
    lines += [
        "",
        f"Input pipeline (`prefetch(train_batches(...))` over {p['steps']} real steps of an "
        f"epoch, all bucket shapes compiled beforehand): **{p['wait_fraction']:.2%}** of the "
        f"loop time is spent in `next()` ({p['wait_seconds']:.3f} s of {p['seconds']:.2f} s); "
        f"end to end {p['examples_per_s']:.1f} examples/s.",
        "",
        "### Target",
        "",
        f"- {t['target']}: {_met(t)}; worst ratio {t['worst']:.3f}.",
        "",
    ]
    return lines


def _accuracy_md(acc: dict) -> list[str]:
    b, t = acc["tfidf_logreg"], acc["targets"]["beats_baseline"]
    bs = acc["tfidf_sublinear_logreg"]
    lines = [
        "## 3. Accuracy",
        "",
        f"`experiments.train.train_and_evaluate(configs/{acc['config']}, tmp)`; wall time "
        f"includes data loading, tokenizer, compiles, training, validation and test evaluation. "
        f"Baseline: character 1-3-gram TF-IDF + logistic regression (scikit-learn), fit on "
        f"train ({b['num_train']:,} texts), C chosen on validation from "
        f"{sorted(float(c) for c in b['validation_accuracy'])}, test on the same "
        f"{b['num_test']:,} examples; with and without sublinear tf (1 + log tf).",
        "",
        "| model | test accuracy | macro-F1 | wall (s) | note |",
        "|---|---|---|---|---|",
    ]
    for name in ("default", "structured", "mean"):
        r = acc[name]
        note = f"pooling {r['model']['pooling']}, {r['epochs']} epochs" + (
            f", max_steps {r['max_steps']}" if r["max_steps"] else ""
        )
        if r.get("same_as"):
            note = f"the default already uses mean pooling: same run as {r['same_as']}"
        lines.append(
            f"| {name} | {r['test_accuracy']:.4f} | {r['test_macro_f1']:.4f} | "
            f"{r['wall_s']:.0f} | {note} |"
        )
    lines += [
        f"| TF-IDF + logreg | {b['test_accuracy']:.4f} | | {b['wall_s']:.0f} | C={b['best_C']} |",
        f"| TF-IDF (sublinear tf) + logreg | {bs['test_accuracy']:.4f} | | {bs['wall_s']:.0f} | "
        f"C={bs['best_C']} |",
        "",
        "### Target",
        "",
        f"- {t['target']}: {_met(t)}; {t['accuracy']:.4f} vs {t['baseline']:.4f} in "
        f"{t['wall_s']:.0f} s.",
        "",
    ]
    return lines


def write_outputs(results: dict, out: str) -> None:
    """results.json, and REPORT.md (+ PNGs) for every section present."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m experiments.benchmark [attention|train|accuracy|all]` on 2 CPU "
        "cores shared with other jobs (timings are noisy; ratios come from interleaved runs in "
        "one process). Every number is copied from `results.json`; a section that was not re-run "
        "keeps the numbers of the run that produced it.",
        "",
    ]
    for name, fn in (("attention", None), ("train", _train_md), ("accuracy", _accuracy_md)):
        if name not in results:
            continue
        sec = results[name]
        lines += _attention_md(sec, out) if fn is None else fn(sec)
        lines += [
            f"_Section wall time {sec.get('wall_s', 0):.0f} s; process peak RSS so far "
            f"{_peak(sec) / 2**30:.2f} GiB{'; --quick' if sec.get('quick') else ''}._",
            "",
        ]
    notes = os.path.join(out, "analysis.md")
    if os.path.exists(notes):  # hand-written reading of the numbers, kept across runs
        with open(notes, encoding="utf-8") as f:
            lines += [f.read()]
    with open(os.path.join(out, "REPORT.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def _peak(sec: dict) -> int:
    if "peak_rss_bytes" in sec:
        return sec["peak_rss_bytes"]
    return max((r["peak_rss_bytes"] for r in sec.get("rows", [])), default=0)


def define_flags() -> None:
    """Flags are defined only when run as a script, so notebooks can import every entry point."""
    flags.DEFINE_string("out", "benchmarks", "Directory for results.json, REPORT.md, plots.")
    flags.DEFINE_bool("quick", False, "Tiny sizes, one repeat: a smoke test in seconds.")


def main(argv: list[str]) -> None:
    which = argv[1:] or ["all"]
    if len(which) != 1 or which[0] not in (*SECTIONS, "all"):
        raise UserError(f"benchmark must be one of {', '.join((*SECTIONS, 'all'))}; got {which}")
    sections = SECTIONS if which[0] == "all" else (which[0],)
    out, quick = flags.FLAGS.out, flags.FLAGS.quick
    path = os.path.join(out, "results.json")
    results = {}
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                results = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"cannot read previous results {path!r}: {e}") from None
    benches = {"attention": bench_attention, "train": bench_train, "accuracy": bench_accuracy}
    for name in sections:
        start = time.perf_counter()
        results[name] = benches[name](quick)
        results[name]["wall_s"] = time.perf_counter() - start
        results[name]["quick"] = quick
        write_outputs(results, out)
    results["machine"] = {"cpu_count": os.cpu_count(), "jax": jax.__version__}
    write_outputs(results, out)
    print(f"wrote {path} and {os.path.join(out, 'REPORT.md')}")


if __name__ == "__main__":
    define_flags()
    cli.main(main)
