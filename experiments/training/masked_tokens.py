"""The masked-token objective (`attn.masked_lm`) as a run of the train loop: its model config,
state, train step and validation, beside `optimization`'s classification ones.

The state is the classifier's own (`optim.init_state`, no bag: the bag is not pretrained)
with the masked-token head as one more entry of its params, "mlm", so a pretrained workdir's
encoder sits where a classifier's does and `warm_start` reads both alike.
"""

import dataclasses
import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from attn import classifier, masked_lm
from experiments import parallel, workdirs
from experiments.data import batching, chosen, encoding, unlabeled
from experiments.errors import UserError
from experiments.explain import plots
from experiments.training import checkpoints, loop, optim, warm_start

HEAD = "mlm"
RESULT = "pretrain.json"  # the best checkpoint's validation metrics and what was read
LABEL = "masked-token"  # what this objective's accuracy and loss are of


def view(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` as the train loop reads it for pretraining: config.pretrain's schedule in place of
    config.train's and config.optim's, and no early stop (more pretraining does not hurt)."""
    p = config.pretrain
    for name, ok, want in (
        ("num_epochs", p.num_epochs >= 0, ">= 0"),
        ("max_steps", p.max_steps >= 0, ">= 0"),
        ("mask_rate", 0 < p.mask_rate < 1, "in (0, 1)"),
        ("head_vocab", p.head_vocab == 0 or p.head_vocab > masked_lm.FIRST_REAL, "0 or > 3"),
        ("eval_every_steps", p.eval_every_steps >= 1, ">= 1"),
        ("checkpoint_every_steps", p.checkpoint_every_steps >= 1, ">= 1"),
    ):
        if not ok:
            raise UserError(f"config.pretrain.{name} must be {want}; got {p[name]!r}")
    if not (p.num_epochs or p.max_steps):
        raise UserError(
            "config.pretrain.num_epochs and max_steps are 0: set how long to pretrain, e.g. "
            "--config.pretrain.num_epochs=10"
        )
    out = ml_collections.ConfigDict(config.to_dict())
    out.train.update(
        num_epochs=p.num_epochs,
        max_steps=p.max_steps,
        eval_every_steps=p.eval_every_steps,
        checkpoint_every_steps=p.checkpoint_every_steps,
        patience=0,
    )
    out.optim.update(learning_rate=p.learning_rate, warmup_steps=p.warmup_steps)
    optim.check_optim(out.optim)
    return out


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> classifier.ModelConfig:
    """The classifier's config without the bag, whose table pretraining would never train."""
    cfg = optim.model_config(config, vocab_size, num_classes=2)
    return dataclasses.replace(cfg, bag_buckets=0)


def init_state(
    key: jax.Array,
    cfg: classifier.ModelConfig,
    tx: optax.GradientTransformation,
    *,
    tokens_VxD: jax.Array | None = None,
) -> dict:
    """`optim.init_state`'s state, its params holding the head as params["mlm"]."""
    init_key, rng = jax.random.split(key)
    k_model, k_head = jax.random.split(init_key)
    params = optim.init_params(k_model, cfg, tokens_VxD=tokens_VxD)
    params[HEAD] = masked_lm.init_head(k_head, cfg.d_model, cfg.vocab_size)
    return optim.state_of(params, tx, rng)


def encoder_params(params: dict) -> dict:
    """The classifier's params of a pretraining state's params: all but the head."""
    return {k: v for k, v in params.items() if k != HEAD}


def predicted(config: ml_collections.ConfigDict, vocab_size: int) -> int:
    """How many of the most frequent ids the head predicts: config.pretrain.head_vocab, at most
    the vocabulary (0 = all of it)."""
    return min(config.pretrain.head_vocab or vocab_size, vocab_size)


def _loss(params, tokens_BxL, key, cfg, rate, predicted, *, train: bool, rng):
    corrupted_BxL, targets = masked_lm.corrupt(
        key, tokens_BxL, vocab_size=cfg.vocab_size, rate=rate, predicted=predicted
    )
    model = encoder_params(params)
    h_BxLxD, _ = classifier.encode(model, corrupted_BxL, cfg, train=train, rng=rng)
    logits_BxMxV = masked_lm.head_logits(
        params[HEAD], model["embed"]["tokens"][:predicted], h_BxLxD, targets["positions"]
    )
    return masked_lm.loss(logits_BxMxV, targets)


def train_step(
    state: dict,
    batch: dict,
    *,
    cfg: classifier.ModelConfig,
    tx: optax.GradientTransformation,
    rate: float,
    predicted: int,
) -> tuple[dict, dict]:
    """One optimizer step on freshly masked tokens: the masks of step s are a function of the
    state's rng and s, so a resumed run masks exactly as an uninterrupted one."""
    k_mask, k_drop = jax.random.split(jax.random.fold_in(state["rng"], state["step"]))
    grad_fn = jax.value_and_grad(_loss, has_aux=True)
    (loss, sums), grads = grad_fn(
        state["params"], batch["tokens"], k_mask, cfg, rate, predicted, train=True, rng=k_drop
    )
    return optim.apply_gradients(state, grads, tx, {**sums, "loss": loss})


@functools.partial(jax.jit, static_argnames=("cfg", "rate", "predicted"))
def _eval_step(params, tokens_BxL, key, *, cfg, rate, predicted):
    _, sums = _loss(params, tokens_BxL, key, cfg, rate, predicted, train=False, rng=None)
    return sums


def evaluate(
    params: Any,
    cfg: classifier.ModelConfig,
    ids: Sequence[np.ndarray],
    *,
    rate: float,
    predicted: int,
    seed: int,
    data: Any,
    dp: parallel.DataParallel,
) -> dict:
    """Masked-token accuracy and loss per target on texts `ids`, with the same masks at every
    evaluation (drawn from `seed` and the batch number), so evaluations compare."""
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
    labels = np.zeros(len(ids), np.int32)
    for n, (_, batch) in enumerate(
        batching.eval_batches(
            ids,
            labels,
            batch_size=data.eval_batch_size,
            buckets=tuple(data.buckets),
            max_len=data.max_len,
            rows=dp.rows(data.eval_batch_size),
        )
    ):
        tokens = dp.put({"tokens": batch["tokens"]})["tokens"]
        sums = _eval_step(
            params, tokens, jax.random.fold_in(key, n), cfg=cfg, rate=rate, predicted=predicted
        )
        for k in totals:
            totals[k] += float(sums[k])
    count = max(totals["count"], 1.0)
    return {
        "accuracy": totals["correct"] / count,
        "loss": totals["loss_sum"] / count,
        "num_targets": int(totals["count"]),
        "num_examples": len(ids),
    }


def requested(config: ml_collections.ConfigDict) -> bool:
    """Whether config asks train to pretrain first (config.pretrain's length is set)."""
    p = config.get("pretrain")
    return bool(p and (p.num_epochs or p.max_steps))


def pretrain(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Pretrains config's encoder on masked tokens in `workdir` (resuming what is there); returns
    the best checkpoint's validation metrics, also written to WORKDIR/pretrain.json, with the
    masked-token curves in WORKDIR/curves.png.

    The texts are the training split's and data.unlabeled's (`unlabeled.load`); the tokenizer is
    built from all of them (or is model.init_from's, or the workdir's on resume).
    """
    view(config)  # the config's own mistakes first, before any data is read
    optim.check_model(config)
    workdirs.check_writable(workdir)
    src = warm_start.source(config.model.init_from) if config.model.init_from else None
    if src:
        config = warm_start.adopt(config, src)
    config, said = chosen.choose(config)
    run_config = view(config)
    d, t, p = config.data, config.train, config.pretrain
    dp = parallel.data_parallel(d)
    texts = unlabeled.load(d)
    tok = src.tokenizer if src else encoding.tokenizer_for(d, texts.train, workdir)
    add_cls = config.model.pooling == "cls"
    train_ids, val_ids = (
        encoding.cut(
            [tok.encode(s) for s in part], max_len=d.max_len, add_cls=add_cls, tail_len=d.tail_len
        )
        for part in (texts.train, texts.validation)
    )
    cfg = model_config(run_config, tok.vocab_size)
    k = predicted(config, tok.vocab_size)
    if src:
        warm_start.check_encoder(cfg, src)
    rt = run_config.train
    total_steps = rt.max_steps or rt.num_epochs * batching.steps_per_epoch(
        len(train_ids), d.batch_size
    )
    tx = optim.make_optimizer(run_config.optim, total_steps)
    step = jax.jit(
        functools.partial(train_step, cfg=cfg, tx=tx, rate=p.mask_rate, predicted=k),
        donate_argnums=0,
    )
    workdirs.check_same_run(config, workdir)
    if parallel.is_primary():
        if said:
            print(said, file=sys.stderr)
        print(texts.summary, file=sys.stderr)

    def init_state_for(fresh: bool) -> dict:
        tokens_VxD = warm_start.word_vectors(config, tok, train_ids) if fresh else None
        state = init_state(jax.random.PRNGKey(t.seed), cfg, tx, tokens_VxD=tokens_VxD)
        if src and fresh:  # Adam's moments start at zero whatever the params: only these change
            state["params"] = warm_start.encoder_params(src, state["params"])
        return state

    def accept() -> None:
        workdirs.write_json(os.path.join(workdir, "config.json"), config.to_dict())
        if not os.path.exists(os.path.join(workdir, "tokenizer.json")):
            tok.save(workdir)

    labels = np.zeros(len(train_ids), np.int32)  # the batches' label field; never read here
    best_state = loop.run(
        loop.Run(
            workdir=workdir,
            config=run_config,
            dp=dp,
            total_steps=total_steps,
            meta=checkpoints.new_meta(cfg, [], ema=False, objective=checkpoints.MASKED_LM),
            init_state=init_state_for,
            step=step,
            batches=lambda start: batching.train_stream(
                train_ids,
                labels,
                seed=t.seed,
                start_step=start,
                rows=dp.rows(d.batch_size),
                batch_size=d.batch_size,
                buckets=tuple(d.buckets),
                max_len=d.max_len,
            ),
            evaluate=lambda state: evaluate(
                state["params"],
                cfg,
                val_ids,
                rate=p.mask_rate,
                predicted=k,
                seed=t.seed,
                data=d,
                dp=dp,
            ),
            accept=accept,
            label=LABEL,
        )
    )
    result = evaluate(
        best_state["params"],
        cfg,
        val_ids,
        rate=p.mask_rate,
        predicted=k,
        seed=t.seed,
        data=d,
        dp=dp,
    )
    result.update(step=int(best_state["step"]), texts=len(train_ids), sources=texts.summary)
    if parallel.is_primary():
        workdirs.write_json(os.path.join(workdir, RESULT), result)
        plots.plot_curves(workdir, label=LABEL)
    return result
