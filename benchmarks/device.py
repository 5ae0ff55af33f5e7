"""`python -m benchmarks device`: where a GPU or TPU stands, in one command of a few minutes.

On JAX's default backend it measures, prints and writes to `<out>/device.json`:
  matmul     the dense matmul rate of one device in bfloat16 and in float32 (JAX's default
             precision, which on a TPU multiplies float32 in bfloat16 passes)
  attention  forward+backward of each `attn.attention` implementation (its fused ones, cudnn
             and splash, on their own hardware) and of
             `jax.nn.dot_product_attention` (XLA's, and cuDNN's on a GPU) on one device, at
             L = 512, 2048 and 8192, in bfloat16 and float32: the time, the ratio to jax.nn's
             XLA form, and the share of the same dtype's matmul rate that the textbook FLOPs reach
  train      train-step examples/s of configs/imdb.py's model at the shapes it chooses on IMDB,
             float32 against bfloat16 (`config.model.dtype`), interleaved, on every device
  lra        with --imdb_path: configs/lra_text.py trained from that local aclImdb folder for
             about --lra_minutes of steps, and the test accuracy it reached
  finetune   with --imdb_path and --bert_dir: configs/finetune.py:imdb, the checkpoint
             fine-tuned on that folder's official split once per --seeds, each seed's test
             accuracy against NBSVM's 91.22% and DistilBERT's 92.8%, and its wall time
  bert       the fine-tuning step of an all-MiniLM-L6-v2-shaped `attn.bert` encoder
             (`benchmarks/bert.py`) at L = 512, in float32 and bfloat16, with attn's matrix,
             chunked and fused attention (cudnn on an NVIDIA GPU, splash on a TPU), with
             jax.nn.dot_product_attention, and the same step in PyTorch with
             scaled_dot_product_attention (`benchmarks/torch_sdpa.py`, when torch is installed):
             time, tokens/s, the ratio to jax.nn and the share of the same dtype's matmul rate
A figure that cannot be measured (cuDNN off a GPU, a program larger than the device's memory, the
LRA run without --imdb_path) is still listed, with the reason: "not measurable here: ..." for a
fused kernel off its hardware or dtypes (attn's own refusal) and for PyTorch where it is absent
or has no backend for the device. `--quick` measures every figure at tiny sizes in seconds: the
command's smoke test on a CPU. `--parts` runs a subset.
"""

import dataclasses
import functools
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from attn import fused
from attn.attention import IMPLEMENTATIONS, Attention
from attn.attention import attention as attend
from benchmarks import attention as attention_section
from benchmarks import bert as bert_section
from benchmarks import config_file, finetune, lra, timing
from experiments import fields, parallel, train
from experiments.errors import UserError
from experiments.training import classify, optim

PARTS = ("attention", "train", "lra", "bert", "finetune")
LENGTHS = (512, 2048, 8192)
DTYPES = ("bfloat16", "float32")
REFERENCE = "jax.nn xla"
CUDNN = "jax.nn cudnn"
TORCH = "torch sdpa"
FUSED = tuple(f"attn {name}" for name in fused.FUSED)


@dataclasses.dataclass(frozen=True)
class Sizes:
    batch: int
    heads: int
    head_dim: int
    measured_length: int  # 0 = each figure's own L; else every L is measured at this one
    matmul_n: int
    group_seconds: float  # timing budget of the methods at one (L, dtype), once compiled
    lra_config: str
    bert_batch: int = 32
    bert_length: int = 512
    bert_tiny: bool = False  # a 2-layer, d=32 encoder instead of all-MiniLM-L6-v2's shape


ON_DEVICE = Sizes(4, 8, 64, 0, 4096, 3.0, "lra_text.py")
QUICK = Sizes(1, 2, 16, 32, 128, 0.05, "lra_text.py:tiny", 2, 16, True)


def _ours(implementation: str) -> Callable:
    """`attn.attention` vmapped over batch and heads: q, k, v, out [B, L, H, D]."""

    def one(q_LxD, k_LxD, v_LxD):
        return attend(q_LxD, k_LxD, v_LxD, implementation=implementation)[0]

    return jax.vmap(jax.vmap(one, in_axes=1, out_axes=1))


METHODS: dict[str, Callable] = {
    **{f"attn {name}": _ours(name) for name in IMPLEMENTATIONS},
    REFERENCE: functools.partial(jax.nn.dot_product_attention, implementation="xla"),
    CUDNN: functools.partial(jax.nn.dot_product_attention, implementation="cudnn"),
}


BERT_METHODS: dict[str, Callable] = {
    "attn matrix": attend,
    "attn chunked": Attention(implementation="chunked"),
    **{f"attn {name}": Attention(implementation=name) for name in fused.FUSED},
    REFERENCE: bert_section.jax_nn_attend,
}


def bert_figure(method: str, dtype: str) -> str:
    return f"bert fine-tuning step, {method}, {dtype}"


def attention_figure(method: str, length: int, dtype: str) -> str:
    return f"attention fwd+bwd, {method}, L={length}, {dtype}"


def figures() -> list[str]:
    """Every figure the command reports, on any device."""
    names = [f"matmul rate, {dtype}" for dtype in DTYPES]
    names += [
        attention_figure(m, length, dtype)
        for length in LENGTHS
        for dtype in DTYPES
        for m in METHODS
    ]
    names += [f"train step, configs/imdb.py, {dtype}" for dtype in DTYPES]
    names += [bert_figure(m, dtype) for dtype in DTYPES for m in [*BERT_METHODS, TORCH]]
    return [*names, "lra_text test accuracy", FINETUNE]


def _memory_limit() -> int:
    """What one device can hold: its allocator's limit, or the attention section's 8 GiB rule
    where the backend reports none (CPU)."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # some backends do not implement it
        stats = {}
    return int(stats.get("bytes_limit", attention_section.MAX_TEMP_BYTES))


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _not_compiled(method: str, e: Exception) -> str:
    """Why a method has no time: attn's refusal of a fused kernel off its hardware or dtypes
    (a ValueError at trace time), or a failure to compile."""
    if method in FUSED and isinstance(e, ValueError):
        return f"not measurable here: {str(e).strip()}"
    return f"does not compile here: {_first_line(e)}"


def _loss_grad(fn: Callable) -> Callable:
    return jax.grad(lambda q, k, v: fn(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))


def attention_rows(sizes: Sizes, matmul: dict[str, float]) -> list[dict]:
    platform = jax.default_backend()
    limit = _memory_limit()
    rows = []
    programs: dict[tuple, object] = {}  # (method, measured L, dtype) -> compiled, or why not
    for length in LENGTHS:
        measured = sizes.measured_length or length
        shape = (sizes.batch, measured, sizes.heads, sizes.head_dim)
        flops = attention_section.attention_flops(
            sizes.batch, sizes.heads, measured, sizes.head_dim, "fwd_bwd"
        )
        for dtype in DTYPES:
            keys = jax.random.split(jax.random.key(measured), 3)
            q, k, v = (jax.random.normal(key, shape, jnp.dtype(dtype)) for key in keys)
            cells, runs = {}, {}
            for name, fn in METHODS.items():
                cell = {"figure": attention_figure(name, length, dtype), "method": name}
                cell.update(L=length, measured_L=measured, dtype=dtype)
                cells[name] = cell
                if name == CUDNN and platform != "gpu":
                    cell["skipped"] = "cuDNN runs on NVIDIA GPUs only"
                    continue
                key = (name, measured, dtype)
                if key not in programs:
                    try:
                        programs[key] = jax.jit(_loss_grad(fn)).lower(q, k, v).compile()
                    except Exception as e:  # e.g. cuDNN's dtype and shape limits
                        programs[key] = _not_compiled(name, e)
                compiled = programs[key]
                if isinstance(compiled, str):
                    cell["skipped"] = compiled
                    continue
                analysis = compiled.memory_analysis()  # None where a backend has none
                temp = int(analysis.temp_size_in_bytes) if analysis is not None else 0
                need = temp + 6 * q.nbytes
                if platform == "cpu" and name != "attn chunked":  # see benchmarks/attention.py
                    need += (
                        attention_section.UNSEEN_LxL_SCRATCH
                        * 4
                        * measured**2
                        * (sizes.batch * sizes.heads)
                    )
                cell["memory_bytes"] = need
                if need > 0.9 * limit:
                    cell["skipped"] = f"needs {need / 2**30:.1f} GiB of {limit / 2**30:.1f} GiB"
                    continue
                runs[name] = functools.partial(compiled, q, k, v)
            if runs:
                first = timing.time_interleaved(runs, 1)  # the first call of each also warms up
                per_round = sum(t[0] for t in first.values())
                repeats = max(3, min(20, int(sizes.group_seconds / max(per_round, 1e-9))))
                for name, ts in timing.time_interleaved(runs, repeats).items():
                    t = statistics.median(ts)
                    cells[name].update(
                        time_s=t,
                        repeats=repeats,
                        tflops=flops / t / 1e12,
                        fraction_of_matmul=flops / t / matmul[dtype],
                    )
            ref = cells[REFERENCE].get("time_s")
            for cell in cells.values():
                if ref and "time_s" in cell:
                    cell["ratio_vs_jax_nn"] = cell["time_s"] / ref
                rows.append(cell)
                print(_attention_line(cell))
    return rows


def _attention_line(c: dict) -> str:
    head = f"L={c['L']:5d} {c['dtype']:8s} {c['method']:13s}"
    if "time_s" not in c:
        return f"{head} skipped: {c['skipped']}"
    ratio = f"{c['ratio_vs_jax_nn']:5.2f}x jax.nn" if "ratio_vs_jax_nn" in c else " " * 13
    return f"{head} {c['time_s'] * 1e3:9.3f} ms {ratio} {c['fraction_of_matmul']:6.1%} of matmul"


def imdb_model_config(quick: bool) -> ml_collections.ConfigDict:
    """configs/imdb.py with what it chooses from IMDB's training split (its docstring); `tiny`
    when quick."""
    config = config_file("imdb.py:tiny" if quick else "imdb.py")
    if not quick:
        with config.unlocked():
            d = config.data
            d.max_len, d.tail_len, d.bag_len = 512, 384, 2048
            config.optim.warmup_steps = 100
            config.train.num_epochs = 2
    return config


def train_rows(quick: bool, sizes: Sizes) -> dict:
    """Examples/s of the real train step (AdamW, the config's adversarial loss) of configs/imdb.py's
    model on a full-length batch, in float32 and bfloat16, on every device."""
    config = imdb_model_config(quick)
    d = config.data
    dp = parallel.data_parallel(d)
    vocab = d.max_vocab
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(3, vocab, (d.batch_size, d.max_len), dtype=np.int32),
        "label": np.arange(d.batch_size, dtype=np.int32) % 2,
        "weight": np.ones(d.batch_size, np.float32),
    }
    if config.model.bag_buckets and d.bag_len:
        batch["bag_tokens"] = rng.integers(3, vocab, (d.batch_size, d.bag_len), dtype=np.int32)
    batch = dp.put(batch)
    steps, param_dtypes = {}, {}
    for dtype in DTYPES:
        with config.unlocked():
            config.model.dtype = dtype
        cfg = fields.model_config(config, vocab, 2)
        tx = optim.make_optimizer(config.optim, 1000)
        state = parallel.replicate(optim.init_state(jax.random.key(0), cfg, tx), dp)
        param_dtypes[dtype] = sorted({str(x.dtype) for x in jax.tree.leaves(state["params"])})
        step = jax.jit(
            functools.partial(
                classify.train_step, cfg=cfg, tx=tx, **classify.loss_options(config.optim)
            )
        )
        steps[dtype] = functools.partial(step.lower(state, batch).compile(), state, batch)
    first = timing.time_interleaved(steps, 1)
    per_round = sum(t[0] for t in first.values())
    repeats = max(5, min(30, int(4 * sizes.group_seconds / max(per_round, 1e-9))))
    rows = []
    for dtype, ts in timing.time_interleaved(steps, repeats).items():
        t = statistics.median(ts)
        rows.append(
            {
                "figure": f"train step, configs/imdb.py, {dtype}",
                "dtype": dtype,
                "step_s": t,
                "examples_per_s": d.batch_size / t,
                "tokens_per_s": d.batch_size * d.max_len / t,
                "param_dtypes": param_dtypes[dtype],
                "repeats": repeats,
            }
        )
    by = {r["dtype"]: r for r in rows}
    speedup = by["bfloat16"]["examples_per_s"] / by["float32"]["examples_per_s"]
    shape = {"batch": d.batch_size, "max_len": d.max_len, "bag_len": d.bag_len, "vocab": vocab}
    print(
        f"train step, configs/imdb.py{':tiny' if quick else ''} {shape} on {jax.device_count()} "
        f"device(s): float32 {by['float32']['examples_per_s']:.1f} ex/s, bfloat16 "
        f"{by['bfloat16']['examples_per_s']:.1f} ex/s, bfloat16/float32 speed {speedup:.2f}x"
    )
    return {"shape": shape, "rows": rows, "bfloat16_speedup": speedup}


def bert_rows(sizes: Sizes, matmul: dict[str, float]) -> list[dict]:
    """The fine-tuning step of `benchmarks/bert.py` on one device, per dtype and attention."""
    base = bert_section.MINILM
    if sizes.bert_tiny:
        base = dataclasses.replace(
            base, vocab_size=100, d_model=32, num_layers=2, num_heads=4, d_ff=64
        )
    batch_size, length = sizes.bert_batch, sizes.bert_length
    tx = optax.adamw(1e-4, weight_decay=0.01)
    flops = bert_section.step_flops(base, batch_size, length)
    rows = []
    for dtype in DTYPES:
        cfg = dataclasses.replace(base, dtype=dtype)
        state = bert_section.init_state(jax.random.key(0), cfg, tx)
        batch = bert_section.make_batch(cfg, batch_size, length)
        cells, runs = {}, {}
        for name, fn in BERT_METHODS.items():
            cells[name] = {"figure": bert_figure(name, dtype), "method": name, "dtype": dtype}
            cells[name].update(L=length, batch=batch_size)
            try:
                compiled, compile_s, temp = bert_section.compile_steps(
                    cfg, {name: fn}, batch, tx, state
                )[name]
            except Exception as e:  # e.g. out of memory while compiling
                cells[name]["skipped"] = _not_compiled(name, e)
                continue
            cells[name].update(compile_s=compile_s, memory_bytes=temp)
            runs[name] = compiled
        cells[TORCH] = {"figure": bert_figure(TORCH, dtype), "method": TORCH, "dtype": dtype}
        cells[TORCH].update(L=length, batch=batch_size)
        torch_step = _torch_step(cfg, batch, dtype)
        if isinstance(torch_step, str):
            cells[TORCH]["skipped"] = f"not measurable here: {torch_step}"
        else:
            runs[TORCH] = torch_step
        if runs:
            first = timing.time_interleaved(runs, 1)
            per_round = sum(t[0] for t in first.values())
            repeats = max(3, min(20, int(4 * sizes.group_seconds / max(per_round, 1e-9))))
            for name, ts in timing.time_interleaved(runs, repeats).items():
                t = statistics.median(ts)
                cells[name].update(
                    step_s=t,
                    repeats=repeats,
                    tokens_per_s=batch_size * length / t,
                    tflops=flops / t / 1e12,
                    fraction_of_matmul=flops / t / matmul[dtype],
                )
        ref = cells[REFERENCE].get("step_s")
        for cell in cells.values():
            if ref and "step_s" in cell:
                cell["ratio_vs_jax_nn"] = cell["step_s"] / ref
            rows.append(cell)
            print(_bert_line(cell))
    return rows


def _torch_step(cfg, batch: dict, dtype: str) -> Callable[[], float] | str:
    """PyTorch SDPA's step on this device (`benchmarks/torch_sdpa.py`), or why it cannot run."""
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (no dependency of attn)"
    from benchmarks import torch_sdpa

    platform = jax.default_backend()
    return torch_sdpa.unavailable(platform) or torch_sdpa.step(cfg, batch, dtype, platform)


def _bert_line(c: dict) -> str:
    head = f"bert step L={c['L']} B={c['batch']} {c['dtype']:8s} {c['method']:13s}"
    if "step_s" not in c:
        return f"{head} skipped: {c['skipped']}"
    return (
        f"{head} {c['step_s'] * 1e3:9.2f} ms {c['ratio_vs_jax_nn']:5.2f}x jax.nn "
        f"{c['tokens_per_s']:10.0f} tok/s {c['fraction_of_matmul']:6.1%} of matmul"
    )


def lra_run(sizes: Sizes, imdb_path: str, minutes: float) -> dict:
    """configs/lra_text.py from a local aclImdb folder for about `minutes` of train steps (the
    step time measured first, on every device), then its test accuracy."""
    figure = {"figure": "lra_text test accuracy", "config": sizes.lra_config}
    if not imdb_path:
        return {**figure, "skipped": "no --imdb_path (a local aclImdb folder)"}
    config = config_file(sizes.lra_config)
    d = config.data
    with config.unlocked():
        d.path = imdb_path
        config.train.baseline = False
    dp = parallel.data_parallel(d)
    cfg = fields.model_config(config, 259, 2)  # the byte tokenizer's vocabulary
    tx = optim.make_optimizer(config.optim, 1000)
    state = parallel.replicate(optim.init_state(jax.random.key(0), cfg, tx), dp)
    step = jax.jit(
        functools.partial(
            classify.train_step, cfg=cfg, tx=tx, **classify.loss_options(config.optim)
        )
    )
    tokens = np.random.default_rng(0).integers(3, 259, (d.batch_size, d.max_len), np.int32)
    batch = dp.put(
        {
            "tokens": tokens,
            "label": np.arange(d.batch_size, dtype=np.int32) % 2,
            "weight": np.ones(d.batch_size, np.float32),
        }
    )
    compiled = step.lower(state, batch).compile()
    times = timing.time_interleaved({"step": lambda: compiled(state, batch)}, 4)["step"]
    step_s = statistics.median(times[1:])
    steps = max(1, int(minutes * 60 / step_s))
    if config.train.max_steps:
        steps = min(steps, config.train.max_steps)
    with config.unlocked():
        config.train.max_steps = steps
        config.train.eval_every_steps = config.train.checkpoint_every_steps = steps
    workdir = tempfile.mkdtemp(prefix="attn-device-lra-")
    start = time.perf_counter()
    try:
        result = train.train_and_evaluate(config, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    row = {
        **figure,
        "budget_s": minutes * 60,
        "step_s": step_s,
        "steps": steps,
        "examples_seen": steps * d.batch_size,
        "step_gflop": lra.step_flops(cfg, d.batch_size, d.max_len) / 1e9,
        "wall_s": time.perf_counter() - start,
        "test_accuracy": result["accuracy"],
        "test_examples": result["num_examples"],
    }
    print(
        f"lra_text ({sizes.lra_config}): {steps} steps of {step_s * 1e3:.1f} ms, test accuracy "
        f"{row['test_accuracy']:.4f} on {row['test_examples']} reviews ({row['wall_s']:.0f} s)"
    )
    return row


FINETUNE = "IMDB fine-tuned test accuracy"


def run(
    quick: bool,
    out: str,
    imdb_path: str,
    lra_minutes: float,
    parts: list[str],
    bert_dir: str = "",
    seeds: tuple[str, ...] = ("0", "1", "2"),
) -> dict:
    """Measures `parts`, prints every figure and writes `<out>/device.json`; returns it."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise UserError(f"--parts must be some of {', '.join(PARTS)}; got {','.join(parts)!r}")
    if imdb_path and not os.path.isdir(imdb_path):
        raise UserError(f"--imdb_path={imdb_path} is not a folder (an unpacked aclImdb)")
    if lra_minutes <= 0:
        raise UserError(f"--lra_minutes must be > 0; got {lra_minutes}")
    start = time.perf_counter()
    sizes = QUICK if quick else ON_DEVICE
    dev = jax.devices()[0]
    result = {
        "device": {
            "platform": dev.platform,
            "kind": dev.device_kind,
            "count": jax.device_count(),
            "jax": jax.__version__,
        },
        "quick": quick,
        "sizes": dataclasses.asdict(sizes),
        "parts": list(parts),
    }
    print(
        f"{jax.device_count()} x {dev.device_kind} ({dev.platform}), jax {jax.__version__}"
        + (" (--quick: tiny sizes)" if quick else "")
    )
    if "attention" in parts or "bert" in parts:
        matmul = {}
        for dtype in DTYPES:
            matmul[dtype] = timing.matmul_flops(sizes.matmul_n, 5, jnp.dtype(dtype))
            print(f"matmul {sizes.matmul_n}² {dtype}: {matmul[dtype] / 1e12:.2f} TFLOP/s")
        result["matmul"] = [
            {"figure": f"matmul rate, {dtype}", "dtype": dtype, "n": sizes.matmul_n, "flops": f}
            for dtype, f in matmul.items()
        ]
    if "attention" in parts:
        shape = f"batch {sizes.batch}, {sizes.heads} heads, head dim {sizes.head_dim}"
        print(f"attention fwd+bwd on one device, q, k, v [B, L, H, D]: {shape}")
        result["attention"] = attention_rows(sizes, matmul)
    if "train" in parts:
        result["train"] = train_rows(quick, sizes)
    if "lra" in parts:
        result["lra"] = lra_run(sizes, imdb_path, lra_minutes)
    if "bert" in parts:
        result["bert"] = bert_rows(sizes, matmul)
    if "finetune" in parts:
        result["finetune"] = {
            "figure": FINETUNE,
            **finetune.imdb_runs(quick, imdb_path, bert_dir, list(seeds), "finetune.py:imdb"),
        }
    result["wall_s"] = time.perf_counter() - start
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "device.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path} ({result['wall_s']:.0f} s)")
    return result
