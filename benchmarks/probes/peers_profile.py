"""Where attn's fine-tuning step spends its time against PyTorch's (benchmarks/peers.py, section
9): one profile of each at one shape, and the ablations that price what the profile points at.

  python benchmarks/probes/peers_profile.py DIR/all-MiniLM-L6-v2 [batch=16] [L=128] [rounds=8]

in a venv with requirements-peers.txt, from the repository root (PYTHONPATH=.).

1. attn's step (`peers.attn_fine_tuning`, what the section times) under `jax.profiler.trace`:
   every XLA thunk's self time (its nested thunks' taken out), summed per category read from
   the compiled HLO: matmuls (a dot or a fusion holding one), dropout's random bits (threefry
   loops and the ops `jax.random.bernoulli` adds), the optimizer (optax's update inside
   `apply_if_finite`'s cond), the rest of the forward and of the backward pass, the rest; then
   the top instructions. XLA's cost analysis gives the step's FLOPs and bytes.
2. PyTorch's step (`peers.PEERS["pytorch"]`) under `torch.profiler`: self CPU time per aten op,
   and the same categories.
3. Interleaved medians (attn / PyTorch) of the step as timed, then with dropout 0 on both sides
   (the random bits priced), and attn's step without `apply_if_finite` (optax's plain chain as
   `optim.make_optimizer` builds it inside the wrapper).
"""

import collections
import dataclasses
import functools
import glob
import gzip
import json
import re
import statistics
import sys
import tempfile

import jax
import jax.numpy as jnp
import optax

from benchmarks import peers, timing
from experiments.training import classify, finetune, optim

RNG = re.compile(r"_bernoulli|_uniform|threefry|random_bits|random_split|random_fold_in")
# The root op of a fusion names what it computes (the last part of its op_name).
XLA_KINDS = (
    ("LayerNorm", re.compile(r"rsqrt|var|mean")),
    ("GELU", re.compile(r"erf")),
    ("softmax", re.compile(r"exp|reduce_max|softmax|log")),
    ("dropout masks", re.compile(r"select_n|where")),
    ("embeddings (gather, scatter)", re.compile(r"gather|scatter|take")),
)
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?\s([a-z][\w\-]*)\((.*)$")


def hlo_index(text: str) -> dict[str, tuple[str, str, bool]]:
    """instruction name -> (opcode, op_name, holds a matmul) over every computation of a
    compiled module's text; a fusion holds a matmul when its called computation has a dot."""
    computations: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if head:
            current = head.group(1)
            computations[current] = ""
        elif current:
            computations[current] += line + "\n"
    index = {}
    for line in text.splitlines():
        m = INSTRUCTION.match(line)
        if not m:
            continue
        name, opcode, rest = m.groups()
        op_name = re.search(r'op_name="([^"]*)"', rest)
        called = re.search(r"calls=%([\w.\-]+)", rest)
        body = computations.get(called.group(1), "") if called else ""
        matmul = opcode == "dot" or " dot(" in body or "matmul" in rest.lower()
        index[name] = (opcode, op_name.group(1) if op_name else "", matmul)
    return index


def category(opcode: str, op_name: str, matmul: bool) -> str:
    backward = "transpose(" in op_name
    if RNG.search(op_name):
        return "dropout random bits"
    if matmul:
        return "matmul, backward" if backward else "matmul, forward"
    if op_name.split("/")[1:2] == ["cond"] or "/cond/" in op_name:
        return "optimizer (inside apply_if_finite)"
    if "jvp(" not in op_name:
        return "rest (clipping norm, finiteness check, weight average, copies)"
    what = next((c for c, pat in XLA_KINDS if pat.search(op_name.rsplit("/", 1)[-1])), "other")
    return f"{'backward' if backward else 'forward'}, {what}"


def self_times(trace: dict) -> dict[str, float]:
    """Thunk name -> summed self time (µs) on XLA's threads: each event less the events nested
    in it on its own thread."""
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    by_thread = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and "XLAEigen" in names.get((e["pid"], e["tid"]), ""):
            by_thread[(e["pid"], e["tid"])].append(e)
    out: dict[str, float] = collections.Counter()
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in events:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                out[stack[-1]["name"]] -= e["dur"]
            out[e["name"]] += e["dur"]
            stack.append(e)
    return {k: v for k, v in out.items() if not k.startswith("ThunkExecutor")}


def profile_attn(step, state, batch, steps: int) -> None:
    text = step.lower(state, batch).compile().as_text()
    index = hlo_index(text)
    for _ in range(2):
        state, _ = step(state, batch)
    jax.block_until_ready(state)
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        for _ in range(steps):
            state, _ = step(state, batch)
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
        (path,) = glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            trace = json.load(f)
    times = self_times(trace)
    per_category: dict[str, float] = collections.Counter()
    unknown = 0.0
    for name, t in times.items():
        if name in index:
            per_category[category(*index[name])] += t
        else:
            unknown += t
    total = sum(times.values())
    print(f"\nattn: {total / steps / 1e6:.3f} s of XLA thunk time per step (both threads)")
    for cat, t in sorted(per_category.items(), key=lambda x: -x[1]):
        print(f"  {t / total:6.1%}  {cat}")
    print(f"  {unknown / total:6.1%}  not in the module's text (runtime)")
    print("  top instructions:")
    for name, t in sorted(times.items(), key=lambda x: -x[1])[:15]:
        opcode, op_name, _ = index.get(name, ("?", "?", False))
        print(f"  {t / total:6.1%}  {name} ({opcode}) {op_name.replace('jit(train_step)/', '')}")


TORCH_CATEGORIES = (
    ("matmul", re.compile(r"addmm|aten::mm$|aten::bmm|matmul|linear")),
    ("softmax (attention, loss)", re.compile(r"softmax")),
    ("dropout random bits", re.compile(r"bernoulli|dropout")),
    ("LayerNorm", re.compile(r"layer_norm")),
    ("GELU", re.compile(r"gelu")),
    ("embeddings", re.compile(r"embedding")),
    ("clipping norm", re.compile(r"norm|clip")),
)


def torch_category(event) -> str:
    """An op's category: the optimizer's for anything run inside its step, else by name."""
    parent = event
    while parent is not None:
        if parent.name.startswith(("Optimizer.step", "Optimizer.zero_grad")):
            return "optimizer (AdamW, per tensor)"
        parent = parent.cpu_parent
    return next((c for c, pat in TORCH_CATEGORIES if pat.search(event.name)), "other")


def profile_torch(step, steps: int) -> None:
    import torch

    for _ in range(2):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    per_category: dict[str, float] = collections.Counter()
    for e in prof.events():
        per_category[torch_category(e)] += e.self_cpu_time_total
    total = sum(per_category.values())
    print(f"\npytorch: {total / steps / 1e6:.3f} s of self CPU time per step (main thread)")
    for cat, t in sorted(per_category.items(), key=lambda x: -x[1]):
        print(f"  {t / total:6.1%}  {cat}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def unguarded(o) -> optax.GradientTransformation:
    """`optim.make_optimizer(o, ...)`'s chain (linear schedule, no layer decay, nothing frozen)
    without `apply_if_finite`'s finiteness check and cond, its state kept: the train step reads
    its counters."""
    warmup, total = o.warmup_steps, peers.TOTAL_STEPS
    schedule = optax.join_schedules(
        [
            optax.linear_schedule(0.0, o.learning_rate, warmup),
            optax.linear_schedule(o.learning_rate, 0.0, total - warmup),
        ],
        [warmup],
    )
    inner = optax.chain(
        optax.clip_by_global_norm(o.clip_norm),
        optax.adamw(
            schedule,
            weight_decay=o.weight_decay,
            mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p),
        ),
    )

    def init(params):
        count = lambda: jnp.zeros([], jnp.int32)  # noqa: E731 (two buffers: both are donated)
        return optax.ApplyIfFiniteState(count(), jnp.array(True), count(), inner.init(params))

    def update(updates, state, params=None):
        updates, inner_state = inner.update(updates, state.inner_state, params)
        return updates, state._replace(inner_state=inner_state)

    return optax.GradientTransformation(init, update)


def main(bert_dir: str, batch_size: int, length: int, rounds: int) -> None:
    config, cfg, step, state = peers.attn_fine_tuning(bert_dir, length)
    host = peers.make_batch(cfg.encoder.vocab_size, batch_size, length)
    batch = jax.device_put(host)
    cost = step.lower(state, batch).compile().cost_analysis()
    print(
        f"attn step {batch_size}x{length}: XLA cost analysis {cost.get('flops', 0) / 1e9:.1f} "
        f"GFLOP, {cost.get('bytes accessed', 0) / 2**30:.2f} GiB accessed"
    )
    fresh = jax.tree.map(jnp.copy, state["params"])
    profile_attn(step, state, batch, steps=3)

    _, setup = peers.attn_side(bert_dir, length)
    profile_torch(peers.PEERS["pytorch"](setup).train(host), steps=3)

    # Ablations, interleaved: as timed; dropout 0 on both sides; attn without apply_if_finite.
    o = config.optim
    tx = optim.make_optimizer(o, peers.TOTAL_STEPS, finetune.warm)

    def attn_call(cfg_, tx_):
        jitted = jax.jit(
            functools.partial(
                classify.train_step, **classify.loss_options(o), cfg=cfg_, tx=tx_, frozen=None
            ),
            donate_argnums=0,
        )
        params = jax.tree.map(jnp.copy, fresh)
        holder = {"state": optim.state_of(params, tx_, jax.random.PRNGKey(0), ema=True)}

        def run():
            holder["state"], _ = jitted(holder["state"], batch)
            return holder["state"]

        return run

    off = dataclasses.replace(
        cfg,
        dropout=0.0,
        encoder=dataclasses.replace(cfg.encoder, dropout=0.0, attention_dropout=0.0),
    )
    setup_off = dataclasses.replace(
        setup,
        encoder=off.encoder,
        recipe=dataclasses.replace(setup.recipe, dropout=0.0),
    )
    calls = {
        "attn": attn_call(cfg, tx),
        "pytorch": peers.PEERS["pytorch"](setup).train(host),
        "attn, dropout 0": attn_call(off, tx),
        "pytorch, dropout 0": peers.PEERS["pytorch"](setup_off).train(host),
        "attn, no apply_if_finite": attn_call(cfg, unguarded(o)),
    }
    timing.time_interleaved(calls, 2)
    times = timing.time_interleaved(calls, rounds)
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    print(f"\nablations, {rounds} interleaved rounds, {batch_size}x{length} (medians):")
    for k, v in med.items():
        print(f"  {k:26s} {v:.3f} s")
    print(f"  attn / pytorch, as timed:  {ratio('attn', 'pytorch'):.3f}")
    print(f"  attn / pytorch, dropout 0: {ratio('attn, dropout 0', 'pytorch, dropout 0'):.3f}")
    print(f"  attn without / with apply_if_finite: {ratio('attn, no apply_if_finite', 'attn'):.3f}")
    print(f"  attn dropout 0 / attn: {ratio('attn, dropout 0', 'attn'):.3f}")
    print(f"  pytorch dropout 0 / pytorch: {ratio('pytorch, dropout 0', 'pytorch'):.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0],
        int(args[1]) if len(args) > 1 else 16,
        int(args[2]) if len(args) > 2 else 128,
        int(args[3]) if len(args) > 3 else 8,
    )
