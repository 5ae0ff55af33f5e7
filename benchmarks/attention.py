"""Section 1: attention kernels. Ours (matrix and chunked) against jax.nn and Flax: time, compile
time, XLA temp memory and FLOP/s over sequence lengths, forward and forward+backward, and three
targets; and the batched entry point `attn.dot_product_attention` against the vmapped
`attn.attention` it is built on, at every length."""

import dataclasses
import functools
import re
import statistics
import time
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from attn import masks
from attn.attention import attention as attend
from attn.batched import dot_product_attention
from benchmarks import timing

GIB = 1 << 30
MAX_TEMP_BYTES = 8 * GIB  # methods whose estimated peak memory exceeds this are not run
# XLA:CPU's fused custom (kCustom) kernels for softmax(QKᵀ)V allocate scratch outside buffer
# assignment, so temp_size_in_bytes misses it: a fresh process running the matrix or flax forward
# grows by two [B, H, L, L] float32 arrays while temp reports O(L) (benchmarks/probes/rss.py).
# The skip rule therefore adds that much to every form except the chunked one (RSS ~ temp there).
UNSEEN_LxL_SCRATCH = 2
MAX_RUN_SECONDS = 120.0  # ... nor those whose extrapolated single run would take longer
CELL_SECONDS = 6.0  # timing budget per (method, shape) once compiled: sets the repeats


def ours(implementation: str) -> Callable:
    """`attn.attention.attention` vmapped over heads and batch: q, k, v, out [B, L, H, D]."""

    def one(q_LxD, k_LxD, v_LxD):
        return attend(q_LxD, k_LxD, v_LxD, implementation=implementation)[0]

    return jax.vmap(jax.vmap(one, in_axes=1, out_axes=1))


def batched(implementation: str) -> Callable:
    """`attn.dot_product_attention`: the same attention, batch and heads vmapped for the caller."""
    return lambda q, k, v: dot_product_attention(q, k, v, implementation=implementation)


# Each batched form right after its twin, so the two meet the same machine load in every repeat.
METHODS: dict[str, Callable] = {
    "matrix": ours("matrix"),
    "batched": batched("matrix"),
    "chunked": ours("chunked"),
    "batched chunked": batched("chunked"),
    "jax.nn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla"),
    "flax": lambda q, k, v: nn.dot_product_attention(q, k, v),
}
REFERENCE_TIME, REFERENCE_MEMORY = "jax.nn", "matrix"
CHUNKED = ("chunked", "batched chunked")  # O(L) memory: the only forms run at the largest L
TWINS = {"batched": "matrix", "batched chunked": "chunked"}  # batched form -> what it vmaps


def program(fn: Callable, mode: str) -> Callable:
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


def plan(quick: bool) -> AttentionPlan:
    if quick:
        return AttentionPlan(2, 2, ((32, 8), (64, 8)), 64, 1, 256)
    lengths = (128, 512, 1024, 2048, 4096, 8192, 16384)
    shapes = [(L, 32) for L in lengths] + [(L, 64) for L in (512, 1024, 2048)]
    return AttentionPlan(8, 4, tuple(sorted(shapes)), 8192, 15, 2048)


def run(quick: bool) -> dict:
    """The attention section of results.json."""
    p = plan(quick)
    mm_flops = timing.matmul_flops(p.matmul_n, 3 if quick else 7)
    print(f"{p.matmul_n}² float32 matmul: {mm_flops / 1e9:.1f} GFLOP/s")
    rows, same_program = [], []
    last_time: dict[tuple[str, str, int], tuple[int, float]] = {}  # (method, mode, D) -> (L, s)
    for length, d in p.shapes:
        shape = (p.batch, length, p.heads, d)
        keys = jax.random.split(jax.random.key(length * 1000 + d), 3)
        q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys)
        for mode in ("fwd", "fwd_bwd"):
            flops = attention_flops(p.batch, p.heads, length, d, mode)
            cells, runs, hlo = {}, {}, {}
            for name, fn in METHODS.items():
                start = time.perf_counter()
                if length > p.only_chunked_above and name not in CHUNKED:
                    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
                    compiled = jax.jit(program(fn, mode)).lower(spec, spec, spec).compile()
                else:
                    compiled = jax.jit(program(fn, mode)).lower(q, k, v).compile()
                compile_s = time.perf_counter() - start
                hlo[name] = hlo_program(compiled.as_text())
                temp = int(compiled.memory_analysis().temp_size_in_bytes)
                scratch = 0 if name in CHUNKED else UNSEEN_LxL_SCRATCH * 4 * length**2
                peak = temp + scratch * p.batch * p.heads
                cell = {"method": name, "mode": mode, "L": length, "D": d, "temp_bytes": temp}
                cell["estimated_peak_bytes"] = peak
                cell["compile_s"] = compile_s
                prev = last_time.get((name, mode, d))
                estimate = prev[1] * (length / prev[0]) ** 2 if prev else 0.0
                if peak > MAX_TEMP_BYTES:
                    cell["skipped"] = (
                        f"temp {temp / GIB:.1f} GiB, estimated peak {peak / GIB:.1f} GiB > 8 GiB"
                    )
                elif length > p.only_chunked_above and name not in CHUNKED:
                    cell["skipped"] = f"only the chunked form runs above L={p.only_chunked_above}"
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
                repeats = max(1, min(p.max_repeats, int(CELL_SECONDS / max(slowest, 1e-9))))
                times = timing.time_interleaved(runs, repeats)
                for name, ts in times.items():
                    t = statistics.median(ts)
                    last_time[(name, mode, d)] = (length, t)
                    cells[name].update(
                        time_s=t,
                        repeats=repeats,
                        gflops=flops / t / 1e9,
                        fraction_of_matmul=flops / t / mm_flops,
                    )
            for name, twin in TWINS.items():
                same = hlo[name] == hlo[twin]
                same_program.append(
                    {"method": name, "mode": mode, "L": length, "D": d, "same": same}
                )
            rss = timing.peak_rss_bytes()
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
        "batch": p.batch,
        "heads": p.heads,
        "dtype": "float32",
        "matmul_n": p.matmul_n,
        "matmul_gflops": mm_flops / 1e9,
        "max_temp_bytes": MAX_TEMP_BYTES,
        "flops_note": "fwd 4·B·H·L²·D, fwd_bwd 3× that (no recomputation counted)",
        "rows": rows,
        "scaling": (scaling := chunked_scaling(quick)),
        "targets": {**targets(rows), "chunked_linear": linear_target(scaling)},
        "batched": batched_target(rows, same_program),
    }


def hlo_program(text: str) -> str:
    """A compiled program's optimised HLO without what does not change what it computes: the
    source locations it records and the names of its parameters (the Python arguments')."""
    if "StackFrames" in text:
        text = text[text.index("\n\n", text.index("StackFrames")) :]
    text = re.sub(r",? ?metadata=\{[^}]*\}", "", text)
    text = re.sub(r",? ?stack_frame_id=\d+", "", text)
    text = re.sub(r"(HloModule|ENTRY) \S+", "", text)
    for name, i in re.findall(r"%([\w.-]+) = \S+ parameter\((\d+)\)", text):
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", f"parameter.{i}", text)
    return text


def batched_target(rows: list[dict], same_program: list[dict]) -> dict:
    """The batched entry point against the vmapped attention it is built on, wherever both ran:
    time ratio per (L, D, mode) and whether XLA compiled the very same program."""
    ratios = []
    for r in rows:
        twin = TWINS.get(r["method"])
        other = twin and _cell(rows, twin, r["mode"], r["L"], r["D"])
        if other and "time_s" in r and "time_s" in other:
            ratios.append(
                {"method": r["method"], "mode": r["mode"], "L": r["L"], "D": r["D"],
                 "ratio": r["time_s"] / other["time_s"], "repeats": r["repeats"]}
            )  # fmt: skip
    worst = max((x["ratio"] for x in ratios), default=None)
    return {
        "target": "attn.dot_product_attention time <= 1.05x attn.attention under vmap (same "
        "implementation) at every L",
        "ratios": ratios,
        "worst": worst,
        "lengths": sorted({x["L"] for x in ratios}),
        "same_program": same_program,
        "all_same_program": all(x["same"] for x in same_program),
        "met": worst is not None and worst <= 1.05,
    }


def chunked_scaling(quick: bool) -> list[dict]:
    """XLA temp memory of chunked fwd+bwd on one head (d=64, 128x128 chunks) as L doubles, with
    no mask and with `masks.causal`: compiled only, so exact and independent of machine load."""
    rows = []
    for length in (64, 128, 256) if quick else (8192, 16384, 32768):
        spec = jax.ShapeDtypeStruct((length, 64), jnp.float32)
        for mask in ("none", "causal"):

            def loss(q, k, v, mask=mask):
                fn = masks.causal if mask == "causal" else None
                return attend(q, k, v, fn, implementation="chunked")[0].sum()

            grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            temp = grad.lower(spec, spec, spec).compile().memory_analysis().temp_size_in_bytes
            rows.append({"L": length, "mask": mask, "temp_bytes": int(temp)})
            print(f"chunked fwd+bwd, one head, L={length} mask={mask}: {temp / 2**20:.1f} MiB")
    return rows


def linear_target(scaling: list[dict]) -> dict:
    """Memory linear in L: 4x the length needs at most 4.4x the temp memory (10% slack)."""
    plain = sorted((r["L"], r["temp_bytes"]) for r in scaling if r["mask"] == "none")
    (l0, m0), (l1, m1) = plain[0], plain[-1]
    ratio = m1 / m0
    return {
        "target": f"chunked fwd+bwd temp memory linear in L: L={l1} / L={l0} <= "
        f"{1.1 * l1 / l0:.1f}x",
        "ratio": ratio,
        "met": ratio <= 1.1 * l1 / l0,
    }


def _print_attention_row(c: dict) -> None:
    t = f"{c['time_s'] * 1e3:10.2f} ms" if "time_s" in c else f"{'skipped':>13}"
    ratio = f"{c['time_ratio_vs_jax_nn']:6.2f}x" if "time_ratio_vs_jax_nn" in c else " " * 7
    frac = f"{c['fraction_of_matmul']:6.1%}" if "fraction_of_matmul" in c else " " * 6
    print(
        f"L={c['L']:6d} D={c['D']:3d} {c['mode']:8s} {c['method']:15s} {t} {ratio} "
        f"mem {c['temp_bytes'] / 2**20:10.1f} MiB ({c['memory_ratio_vs_matrix']:7.3f}x) "
        f"{frac} compile {c['compile_s']:5.2f} s {c.get('skipped', '')}"
    )


def _cell(rows, method, mode, length, d=None):
    for r in rows:
        if (r["method"], r["mode"], r["L"]) == (method, mode, length) and d in (None, r["D"]):
            return r
    return None


def targets(rows: list[dict]) -> dict:
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
