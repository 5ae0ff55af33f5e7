"""attn's pretrained path as it is against variants of it (what a change replaced, or a candidate)
and transformers' Flax BERT, interleaved in one process: what each speed change of section 9
gained, measured where the machine's load hits every side alike (benchmarks/analysis.md).

  PYTHONPATH=. python benchmarks/probes/peers_speed.py DIR/all-MiniLM-L6-v2 \
      [--mode=train|serve] [--batch=16] [--length=128] [--rounds=10] [--variants=a,b] \
      [--peers=flax,pytorch]

in a venv with requirements-peers.txt (for the peers, `benchmarks.peers`' sides; one that is not
installed is left out).
train: `peers.attn_fine_tuning`'s step (what section 9 times; each variant's compile time is
printed); serve: `classify.eval_step`. Every side compiled first, then `rounds` rounds in which
each runs once, in turn; per side the median seconds, and the median and quartiles of its
per-round ratios to "attn" (the code as it is) and to each peer (the order rotated each round).
The load average is printed before and after.

A variant re-traces attn's step under a patch of attn's code (the code a change replaced, kept
here so its gain stays measurable), other step options, or XLA compiler options.
"""

import argparse
import contextlib
import dataclasses
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from attn import layers
from benchmarks import peers
from experiments.training import classify, xla_options


def _bernoulli_keep_mask(rng: jax.Array, rate: float, shape: tuple[int, ...]):
    """Dropout's draw before 16-bit masks: `jax.random.bernoulli`, a threefry block per entry."""
    return jax.random.bernoulli(rng, 1.0 - rate, shape), 1.0 / (1.0 - rate)


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _no_dropout(options: dict) -> dict:
    cfg = options["cfg"]
    encoder = dataclasses.replace(cfg.encoder, dropout=0.0, attention_dropout=0.0)
    return {**options, "cfg": dataclasses.replace(cfg, dropout=0.0, encoder=encoder)}


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a variant's step differs from attn's as it is."""

    patch: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    options: Callable[[dict], dict] = lambda options: options  # the step's keyword arguments
    compiler_options: dict | None = None  # XLA debug options for this compilation


VARIANTS = {
    "bernoulli masks": Variant(patch=lambda: _patched(layers, "keep_mask", _bernoulli_keep_mask)),
    "dropout 0": Variant(options=_no_dropout),
    # XLA:CPU's dots and fusions in its own emitters and Eigen instead of YNNPACK's kernels
    # (what serving compiles with, `xla_options.forward()`) ...
    "no ynn": Variant(compiler_options=xla_options.NO_YNN),
    # ... and XLA's defaults, what serving compiled with before it
    "xla defaults": Variant(compiler_options={}),
    # XLA:CPU's older loop emitters for its fusions instead of the MLIR ones: the tests compile
    # with them (at LLVM level 0 they compile small programs in about half the time); MiniLM's
    # step at 32 x 64 compiled 3.2x slower with them and ran 1.065x as long (load 6)
    "loop emitters": Variant(compiler_options={"xla_cpu_use_fusion_emitters": False}),
}


def _compiled(fn, variant: Variant, options: dict, *args):
    """fn(*args, **variant's options) compiled under the variant's patch."""
    with variant.patch():
        jitted = jax.jit(functools.partial(fn, **variant.options(options)), donate_argnums=0)
        return jitted.lower(*args).compile(compiler_options=variant.compiler_options)


def train_calls(bert_dir: str, batch: int, length: int, names: list[str], peer_names) -> dict:
    """name -> a call running one fine-tuning step of that side."""
    _, cfg, step, state = peers.attn_fine_tuning(bert_dir, length)
    host = peers.make_batch(cfg.encoder.vocab_size, batch, length)
    device_batch = jax.device_put(host)
    step_fn = step.__wrapped__  # the partial of classify.train_step that peers jits
    fresh = jax.tree.map(jnp.copy, state)
    calls = {}
    for name in ["attn", *names]:
        variant = VARIANTS.get(name, Variant())
        options = dict(step_fn.keywords)
        holder = {"state": jax.tree.map(jnp.copy, fresh)}
        start = time.perf_counter()
        compiled = _compiled(step_fn.func, variant, options, holder["state"], device_batch)
        print(f"{name}: compiled in {time.perf_counter() - start:.1f} s", flush=True)

        def run(compiled=compiled, holder=holder):
            holder["state"], _ = compiled(holder["state"], device_batch)
            return holder["state"]

        calls[name] = run
    for name, side in _peer_sides(bert_dir, length, peer_names).items():
        if side.train is not None:  # a forward-only runtime has no step
            calls[name] = side.train(host)
    return calls


def serve_calls(bert_dir: str, batch: int, length: int, names: list[str], peer_names) -> dict:
    """name -> a call computing the class probabilities of the serving batch."""
    _, cfg, _, state = peers.attn_fine_tuning(bert_dir, length)
    params = jax.tree.map(jnp.copy, state.get("ema", state["params"]))
    host = peers.make_batch(cfg.encoder.vocab_size, batch, length, seed=1)
    device_batch = jax.device_put(host)
    calls = {}
    for name in ["attn", *names]:
        variant = VARIANTS.get(name, Variant())
        options = variant.compiler_options
        with variant.patch():
            fn = jax.jit(functools.partial(classify.sums_and_probabilities, cfg=cfg))
            compiled = fn.lower(params, device_batch).compile(
                compiler_options=xla_options.forward() if options is None else options
            )
        calls[name] = functools.partial(compiled, params, device_batch)
    for name, side in _peer_sides(bert_dir, length, peer_names).items():
        calls[name] = side.serve(host)
    return calls


def _peer_sides(bert_dir: str, length: int, names: list[str]) -> dict:
    _, setup = peers.attn_side(bert_dir, length)
    return peers.build_peers(setup, names)[0]


def rotated(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """`timing.time_interleaved` with the order rotated each round: a side that always ran
    after another showed a bias (two identical programs 0.81 apart on this machine)."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            jax.block_until_ready(calls[name]())
            times[name].append(time.perf_counter() - start)
    return times


def _summary(times: dict[str, list[float]], against: str) -> str:
    ratios = [a / b for a, b in zip(*(times[k] for k in ("_", against)), strict=True)]
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return f"/{against} {statistics.median(ratios):.3f} [{q[0]:.3f}, {q[2]:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bert_dir")
    parser.add_argument("--mode", choices=("train", "serve"), default="train")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--peers", default="flax", help="of " + ",".join(peers.PEERS))
    a = parser.parse_args()
    names = [n for n in a.variants.split(",") if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    make = train_calls if a.mode == "train" else serve_calls
    peer_names = [n for n in a.peers.split(",") if n]
    unknown = sorted(set(peer_names) - set(peers.PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; known: {sorted(peers.PEERS)}")
    calls = make(a.bert_dir, a.batch, a.length, names, peer_names)
    load_before = os.getloadavg()
    rotated(calls, 2)  # first calls, then lazily made state in place
    times = rotated(calls, a.rounds)
    load_after = os.getloadavg()
    print(
        f"\n{a.mode} {a.batch}x{a.length}, {a.rounds} interleaved rounds; load average "
        f"{' '.join(f'{x:.1f}' for x in load_before)} before, "
        f"{' '.join(f'{x:.1f}' for x in load_after)} after"
    )
    for name, ts in times.items():
        parts = [f"{name:34s} {statistics.median(ts):7.3f} s"]
        for against in ("attn", *peer_names):
            if against in times and against != name:
                parts.append(_summary({"_": ts, against: times[against]}, against))
        print("  ".join(parts))


if __name__ == "__main__":
    main()
