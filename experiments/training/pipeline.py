"""A whole run of each objective, what the commands call: `train_and_evaluate` (python -m
experiments.train: masked-token pretraining first when config.pretrain asks for it, the fork
between attn's own classifier and a pretrained checkpoint's, a teacher's transfer set in place of
the training split (`distill`), training, the test split, the TF-IDF baseline and the files a
finished run leaves) and `pretrain` (python -m experiments.pretrain).

Each reads its data, describes its objective as a `setup.Task` (`classify`'s or
`masked_tokens`' loss, step and evaluation) and hands it to `setup.train`.
"""

import functools
import os

import jax
import ml_collections
import numpy as np

from attn import masked_lm
from experiments import fields, parallel, workdirs
from experiments.data import batching, encoding, scripts, unlabeled
from experiments.data.splits import SPLITS
from experiments.explain import plots
from experiments.training import (
    bag_prior,
    baseline,
    checkpoints,
    classify,
    distill,
    finetune,
    masked_tokens,
    optim,
    schedule,
    setup,
    warm_start,
)

PRETRAIN_RESULT = "pretrain.json"  # the best checkpoint's validation metrics and what was read


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains, keeps the best-on-validation checkpoint, and returns its test metrics.

    With config.pretrain.num_epochs (or max_steps) > 0 and no model.init_from, it first pretrains
    the encoder into WORKDIR/pretrain (`pretrain`) and starts from there.
    """
    fields.check(config)
    start_from = config.model.init_from
    if pretraining_requested(config):
        schedule.check_pretraining(config)  # how long to pretrain: before any data is read
        if not start_from:
            start_from = os.path.join(workdir, "pretrain")
            workdirs.check_writable(workdir)
            pretrain(config, start_from)
    s = setup.start(config, workdir, start_from)
    config, d, o = s.config, s.config.data, s.config.optim
    pre = finetune.load(config) if finetune.requested(config) else None
    src_tokenizer = pre.tokenizer if pre else s.src.tokenizer if s.src else None
    if src_tokenizer is None and fields.distills(config):
        src_tokenizer = distill.tokenizer(config, workdir)
    data = encoding.load(
        d, add_cls=config.model.pooling == "cls", workdir=workdir, tokenizer=src_tokenizer
    )
    train, validation, test = (data.splits[name] for name in SPLITS)
    taught = distill.prepare(config, data, workdir) if fields.distills(config) else None
    if pre:
        cfg = finetune.model_config(config, pre.encoder, len(data.label_names))
        nb = o.bag_init == "naive_bayes"
        bag_start = functools.partial(bag_prior.naive_bayes, cfg, train, d) if nb else None
        init_params = finetune.init_params(pre, cfg, bag_start)
    else:
        cfg = fields.model_config(config, data.tokenizer.vocab_size, len(data.label_names))

        def init_params(key: jax.Array, fresh: bool) -> dict:
            # A resumed run overwrites the starting values: count or read them only for a fresh
            # one.
            bag_VxC = (
                bag_prior.naive_bayes(cfg, train, d)
                if o.bag_init == "naive_bayes" and fresh
                else None
            )
            tokens_VxD = (
                warm_start.word_vectors(config, data.tokenizer, train.ids) if fresh else None
            )
            return optim.init_params(key, cfg, bag_VxC=bag_VxC, tokens_VxD=tokens_VxD)

    def split_metrics(state: dict, split: encoding.Split, desc: str = "") -> dict:
        return classify.evaluate(
            optim.eval_params(state),
            cfg,
            split.ids,
            split.labels,
            data=d,
            dp=s.dp,
            bag_ids=split.bag_ids,
            desc=desc,
        )

    def batches(start: int):
        if taught:
            return taught.batches(config, s.dp, start)
        return batching.train_stream(
            train.ids,
            train.labels,
            seed=config.train.seed,
            start_step=start,
            rows=s.dp.rows(d.batch_size),
            bag_ids=train.bag_ids,
            **batching.options(d),
        )

    task = setup.Task(
        cfg=cfg,
        tokenizer=data.tokenizer,
        train_ids=taught.split.ids if taught else train.ids,
        meta=checkpoints.new_meta(cfg, data.label_names, ema=o.ema_decay > 0),
        step=functools.partial(
            classify.train_step, **classify.loss_options(o, config.get("distill"))
        ),
        init_params=init_params,
        batches=batches,
        evaluate=lambda state: split_metrics(state, validation),
        ema=o.ema_decay > 0,
        summary=pre.describe() if pre else taught.summary if taught else "",
        warm=finetune.warm if pre and not pre.random else None,
        lr_scales=finetune.layer_scales(pre.layer_keys, o.layer_decay) if pre else None,
    )
    best = setup.train(s, task, workdir, schedule.training(config, len(task.train_ids)))
    result = split_metrics(best, test, desc=f"test (step {int(best['step'])})")
    result["step"] = int(best["step"])
    result["label_names"] = list(data.label_names)  # as evaluate's files have them
    primary = parallel.is_primary()
    if primary and config.train.baseline:
        texts = {name: (data.splits[name].texts, data.splits[name].labels) for name in SPLITS}
        result["baseline"] = baseline.fit_for_run(d, texts, workdir)
    if primary:
        shares = os.path.join(workdir, scripts.SCRIPTS_FILE)
        if not os.path.exists(shares):  # for predict: the scripts the model has read
            workdirs.write_json(shares, scripts.script_shares(train.texts))
        workdirs.write_json(os.path.join(workdir, "eval_test.json"), result)
    return result


def pretraining_requested(config: ml_collections.ConfigDict) -> bool:
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
    fields.check(config)  # the config's own mistakes first, before any data is read
    schedule.check_pretraining(config)  # and how long to pretrain
    s = setup.start(config, workdir)
    config, d, p = s.config, s.config.data, s.config.pretrain
    texts = unlabeled.load(d)
    tok = s.src.tokenizer if s.src else encoding.tokenizer_for(d, texts.train, workdir)
    add_cls = config.model.pooling == "cls"
    train_ids, val_ids = (
        encoding.cut(
            [tok.encode(t) for t in part], max_len=d.max_len, add_cls=add_cls, tail_len=d.tail_len
        )
        for part in (texts.train, texts.validation)
    )
    cfg = masked_tokens.model_config(config, tok.vocab_size)
    k = masked_tokens.predicted(config, tok.vocab_size)

    def init_params(key: jax.Array, fresh: bool) -> dict:
        k_model, k_head = jax.random.split(key)
        tokens_VxD = warm_start.word_vectors(config, tok, train_ids) if fresh else None
        params = optim.init_params(k_model, cfg, tokens_VxD=tokens_VxD)
        params[masked_tokens.HEAD] = masked_lm.init_head(k_head, cfg.d_model, cfg.vocab_size)
        return params

    def validate(state: dict) -> dict:
        return masked_tokens.evaluate(
            state["params"],
            cfg,
            val_ids,
            rate=p.mask_rate,
            predicted=k,
            seed=config.train.seed,
            data=d,
            dp=s.dp,
        )

    labels = np.zeros(len(train_ids), np.int32)  # the batches' label field; never read here
    task = setup.Task(
        cfg=cfg,
        tokenizer=tok,
        train_ids=train_ids,
        meta=checkpoints.new_meta(cfg, [], ema=False, objective=checkpoints.MASKED_LM),
        step=functools.partial(masked_tokens.train_step, rate=p.mask_rate, predicted=k),
        init_params=init_params,
        batches=lambda start: batching.train_stream(
            train_ids,
            labels,
            seed=config.train.seed,
            start_step=start,
            rows=s.dp.rows(d.batch_size),
            batch_size=d.batch_size,
            buckets=tuple(d.buckets),
            max_len=d.max_len,
        ),
        evaluate=validate,
        label=masked_tokens.LABEL,
        summary=texts.summary,
    )
    best = setup.train(s, task, workdir, schedule.pretraining(config, len(train_ids)))
    result = validate(best)
    result.update(step=int(best["step"]), texts=len(train_ids), sources=texts.summary)
    if parallel.is_primary():
        workdirs.write_json(os.path.join(workdir, PRETRAIN_RESULT), result)
        plots.plot_curves(workdir, label=masked_tokens.LABEL)
    return result
