"""Trains a self-attention classifier from an ml_collections config; resumes from the workdir.

  python -m experiments.train --config=configs/default.py --workdir=runs/default \
      [--config.model.num_layers=2 ...]

`main` is a thin wrapper over `train_and_evaluate(config, workdir)`, which a notebook can call.
"""

import dataclasses
import json
import os
import shutil
import sys
import time

import jax
import ml_collections
import numpy as np
from absl import flags
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import config_flags
from tqdm import tqdm

from attn import classifier
from experiments import (
    batching,
    checkpoints,
    cli,
    datasets,
    evaluation,
    plots,
    steps,
    tokenizers,
)
from experiments.errors import UserError
from experiments.metrics_log import MetricsLog

_MIN_FREE_BYTES = 64 << 20


def model_config(config: ml_collections.ConfigDict, vocab_size: int, num_classes: int):
    """The frozen model config: `config.model` plus what the data decides."""
    try:
        return classifier.ModelConfig(
            vocab_size=vocab_size,
            num_classes=num_classes,
            max_len=config.data.max_len,
            **config.model.to_dict(),
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"config.model: {e}") from None


def check_optim(optim: ml_collections.ConfigDict) -> None:
    """Optimizer settings outside their range fail here, by name, instead of as NaNs later."""
    rules = {
        "learning_rate": (lambda v: v > 0, "> 0"),
        "warmup_steps": (lambda v: v >= 0 and float(v).is_integer(), "an integer >= 0"),
        "weight_decay": (lambda v: v >= 0, ">= 0"),
        "clip_norm": (lambda v: v > 0, "> 0"),
        "label_smoothing": (lambda v: 0 <= v < 1, "in [0, 1)"),
        "penalty_weight": (lambda v: v >= 0, ">= 0"),
        "adversarial_eps": (lambda v: v >= 0, ">= 0 (0 = no adversarial loss)"),
        "ema_decay": (lambda v: 0 <= v < 1, "in [0, 1) (0 = no running average)"),
        "max_nonfinite": (lambda v: v >= 1 and float(v).is_integer(), "an integer >= 1"),
    }
    for name, (ok, want) in rules.items():
        v = optim[name]
        if isinstance(v, bool) or not isinstance(v, int | float) or not ok(v):
            raise UserError(f"config.optim.{name} must be {want}; got {v!r}")


def check_workdir(workdir: str) -> None:
    """Fails before any work when the workdir cannot hold checkpoints."""
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, ".write_test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"workdir {workdir!r} is not writable: {e.strerror}") from None
    free = shutil.disk_usage(workdir).free
    if free < _MIN_FREE_BYTES:
        raise UserError(f"workdir {workdir!r} has only {free >> 20} MiB free; need 64 MiB")


def write_json(path: str, obj: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)


def data_mesh() -> tuple[NamedSharding, NamedSharding]:
    """Batch sharded over every device, state replicated: plain data parallelism."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    return NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())


def check_batch_sizes(data: ml_collections.ConfigDict) -> None:
    n = jax.device_count()
    for name in ("batch_size", "eval_batch_size"):
        if data[name] % n:
            raise UserError(
                f"config.data.{name}={data[name]} is not divisible by the {n} devices; "
                f"use a multiple of {n}"
            )


def load_tokenizer_for(config, workdir: str, train_texts: list[str]):
    """The workdir's tokenizer when resuming, else one built from the training texts and saved."""
    if os.path.exists(os.path.join(workdir, "tokenizer.json")):
        return tokenizers.load_tokenizer(workdir)
    d = config.data
    tok = tokenizers.build_tokenizer(
        d.tokenizer, train_texts, lowercase=d.lowercase, min_freq=d.min_freq, max_vocab=d.max_vocab
    )
    tok.save(workdir)
    return tok


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains, keeps the best-on-validation checkpoint, and returns its test metrics."""
    check_optim(config.optim)
    check_workdir(workdir)
    check_batch_sizes(config.data)
    d, t, o = config.data, config.train, config.optim
    use_ema = o.ema_decay > 0
    splits = datasets.load_splits(d)
    label_names = splits["train"][2]
    tok = load_tokenizer_for(config, workdir, splits["train"][0])
    cfg = model_config(config, tok.vocab_size, len(label_names))
    add_cls = cfg.pooling == "cls"
    encoded = {
        s: (batching.encode_all(tok, texts, max_len=d.max_len, add_cls=add_cls), labels)
        for s, (texts, labels, _) in splits.items()
    }
    n_train = len(encoded["train"][0])
    spe = batching.steps_per_epoch(n_train, d.batch_size)
    total_steps = t.max_steps or t.num_epochs * spe

    tx = steps.make_optimizer(o, total_steps)
    batch_sharding, replicated = data_mesh()
    put = lambda batch: jax.device_put(batch, batch_sharding)
    init = steps.init_state(jax.random.PRNGKey(t.seed), cfg, tx, ema=use_ema)
    state = jax.device_put(init, replicated)

    last = checkpoints.manager(workdir, checkpoints.LAST, t.keep_checkpoints, cleanup_tmp=True)
    best = checkpoints.manager(workdir, checkpoints.BEST, 1, cleanup_tmp=True)
    step, best_acc = 0, -1.0
    if last.latest_step() is not None:
        meta = checkpoints.read_meta(last, last.latest_step())
        checkpoints.check_same_model(meta["model"], cfg, f"workdir {workdir!r}")
        if meta.get("ema", False) != use_ema:
            raise UserError(
                f"workdir {workdir!r} was trained {'with' if meta.get('ema') else 'without'} a "
                f"weight average but config.optim.ema_decay={o.ema_decay}; use a new --workdir "
                "or the original setting"
            )
        state, meta = checkpoints.restore(last, last.latest_step(), state)
        step, best_acc = int(state["step"]), meta["best_val_accuracy"]
        print(f"resuming from step {step} of {total_steps}", file=sys.stderr)
    write_json(os.path.join(workdir, "config.json"), config.to_dict())
    log = MetricsLog(workdir, step)

    def meta_now() -> dict:
        return {
            "model": dataclasses.asdict(cfg),
            "label_names": list(label_names),
            "step": step,
            "best_val_accuracy": best_acc,
            "ema": use_ema,  # the state holds an "ema" entry
        }

    step_kw = dict(
        cfg=cfg,
        tx=tx,
        label_smoothing=o.label_smoothing,
        penalty_weight=o.penalty_weight,
        ema_decay=o.ema_decay,
        adversarial_eps=o.adversarial_eps,
    )
    bar = tqdm(total=total_steps, initial=step, desc="train", unit="step", mininterval=1.0)
    window = {
        "loss_sum": 0.0,
        "correct": 0.0,
        "count": 0.0,
        "wait": 0.0,
        "start": time.perf_counter(),
    }
    try:
        while step < total_steps:
            epoch, offset = divmod(step, spe)
            batches = batching.prefetch(
                batching.train_batches(
                    *encoded["train"],
                    batch_size=d.batch_size,
                    buckets=tuple(d.buckets),
                    max_len=d.max_len,
                    seed=t.seed,
                    epoch=epoch,
                    start_step=offset,
                )
            )
            for _ in range(offset, spe):
                if step >= total_steps:
                    break
                wait_start = time.perf_counter()
                batch = next(batches)
                batch.pop("index")
                window["wait"] += time.perf_counter() - wait_start
                state, m = steps.train_step(state, put(batch), **step_kw)
                m = jax.device_get(m)
                step += 1
                if int(m["nonfinite_run"]) >= o.max_nonfinite:
                    raise UserError(
                        f"{o.max_nonfinite} consecutive steps had non-finite loss or gradients "
                        f"(last at step {step}); lower config.optim.learning_rate. The last good "
                        f"checkpoint is step {last.latest_step()}"
                    )
                if np.isfinite(m["loss"]):
                    for k in ("loss_sum", "correct", "count"):
                        window[k] += float(m[k])
                bar.update(1)
                if step % t.log_every_steps == 0 or step == total_steps:
                    elapsed = time.perf_counter() - window["start"]
                    # A window of only skipped steps has no loss: NaN, not a misleading 0.
                    seen = window["count"] or float("nan")
                    row = {
                        "loss": window["loss_sum"] / seen,
                        "accuracy": window["correct"] / seen,
                        "examples_per_sec": window["count"] / max(elapsed, 1e-9),
                        "input_wait_fraction": window["wait"] / max(elapsed, 1e-9),
                        "skipped_steps": int(m["nonfinite_total"]),
                        "grad_norm": float(m["grad_norm"]),
                    }
                    log.write(step, "train", row)
                    bar.set_postfix(
                        loss=f"{row['loss']:.3f}",
                        acc=f"{row['accuracy']:.3f}",
                        ex_s=f"{row['examples_per_sec']:.0f}",
                        skipped=row["skipped_steps"],
                    )
                    window = dict.fromkeys(window, 0.0) | {"start": time.perf_counter()}
                if step % t.eval_every_steps == 0 or step == total_steps:
                    val = evaluation.evaluate(
                        steps.eval_params(state), cfg, *encoded["validation"], data=d, put=put
                    )
                    log.write(step, "validation", val)
                    bar.write(
                        f"step {step}: validation accuracy {val['accuracy']:.4f} "
                        f"loss {val['loss']:.4f}"
                    )
                    # A diverged model (NaN validation loss) never becomes the best checkpoint.
                    if val["accuracy"] > best_acc and np.isfinite(val["loss"]):
                        best_acc = val["accuracy"]
                        checkpoints.save(best, step, state, meta_now())
                if step % t.checkpoint_every_steps == 0 or step == total_steps:
                    checkpoints.save(last, step, state, meta_now())
    finally:
        bar.close()
        log.close()

    if best.latest_step() is None:
        raise UserError(
            "no evaluation had a finite validation loss, so there is no best model; "
            "lower config.optim.learning_rate"
        )
    best_state, _ = checkpoints.restore(best, best.latest_step(), state)
    test = evaluation.evaluate(
        steps.eval_params(best_state), cfg, *encoded["test"], data=d, put=put
    )
    test["step"] = best.latest_step()
    write_json(os.path.join(workdir, "eval_test.json"), test)
    return test


def define_flags() -> None:
    """Flags are defined only when run as a script, so notebooks can import every entry point."""
    config_flags.DEFINE_config_file("config", None, "Path to a config file[:variant].")
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, vocabulary and metrics.")


def main(argv: list[str]) -> None:
    config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
    if config is None or not workdir:
        raise UserError("both --config=configs/<name>.py and --workdir=DIR are required")
    start = time.perf_counter()
    test = train_and_evaluate(config, workdir)
    curves = plots.plot_curves(workdir)
    print(
        f"test accuracy {test['accuracy']:.4f}  macro-F1 {test['macro_f1']:.4f}  "
        f"({test['num_examples']} examples, best step {test['step']}, "
        f"{time.perf_counter() - start:.0f} s)"
    )
    print(f"curves: {curves}\nresults: {os.path.join(workdir, 'eval_test.json')}")


if __name__ == "__main__":
    define_flags()
    cli.main(main)
