"""Loading a trained workdir (config, tokenizer, model config, params) and classifying texts."""

import dataclasses
import functools
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from attn import classifier
from experiments import batching, checkpoints, steps, tokenizers
from experiments.errors import UserError


@dataclasses.dataclass(frozen=True)
class Trained:
    config: ml_collections.ConfigDict
    cfg: classifier.ModelConfig
    params: Any
    tokenizer: Any
    label_names: tuple[str, ...]
    step: int


def load(workdir: str, which: str = checkpoints.BEST) -> Trained:
    """All that predict, evaluate and visualize need; UserError when the workdir lacks it."""
    if not os.path.isdir(workdir):
        raise UserError(f"workdir {workdir!r} does not exist; train first with experiments.train")
    config_path = os.path.join(workdir, "config.json")
    if not os.path.exists(config_path):
        raise UserError(f"{workdir!r} has no config.json; is it a training workdir?")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = ml_collections.ConfigDict(json.load(f))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {config_path}: {e}") from None
    mngr, step = _latest(workdir, which)
    if step is None and which == checkpoints.BEST:  # a run stopped before its first evaluation
        mngr, step = _latest(workdir, checkpoints.LAST)
    if step is None:
        raise UserError(f"{workdir!r} holds no checkpoint yet; train (or resume) first")
    meta = checkpoints.read_meta(mngr, step)
    try:
        model = meta["model"]
        cfg = classifier.ModelConfig(
            **{**model, "ngram_orders": tuple(model.get("ngram_orders", ()))}
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(
            f"checkpoint {step} in {workdir!r} has an unusable model config: {e}"
        ) from None
    tok = tokenizers.load_tokenizer(workdir)
    if tok.vocab_size != cfg.vocab_size:
        raise UserError(
            f"vocabulary in {workdir!r} has {tok.vocab_size} ids but the checkpoint expects "
            f"{cfg.vocab_size}; the workdir is inconsistent"
        )
    # The optimizer state's structure does not depend on the schedule, so one step will do.
    tx = steps.make_optimizer(config.optim, total_steps=2)
    init = functools.partial(steps.init_state, cfg=cfg, tx=tx, ema=meta.get("ema", False))
    target = jax.eval_shape(init, jax.random.PRNGKey(0))
    state, _ = checkpoints.restore(mngr, step, target)
    params = steps.eval_params(state)
    return Trained(config, cfg, params, tok, tuple(meta["label_names"]), step)


def _latest(workdir: str, which: str) -> tuple[Any, int | None]:
    """The manager and newest step of `workdir/which`; None when absent (the manager would create
    the directory, and reading must leave a workdir unchanged)."""
    if not os.path.isdir(os.path.join(workdir, which)):
        return None, None
    mngr = checkpoints.manager(workdir, which, keep=1)
    return mngr, mngr.latest_step()


@functools.partial(jax.jit, static_argnames=("cfg",))
def _forward(params, tokens_BxL, *, cfg):
    logits_BxC, aux = classifier.apply(params, tokens_BxL, cfg)
    return jax.nn.softmax(logits_BxC), aux


def check_text(text: str) -> str:
    """The text itself, or a UserError saying why it cannot be classified."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError("text is not valid UTF-8") from None
    if not text.strip():
        raise UserError("text is empty")
    return text


def encode(trained: Trained, text: str) -> np.ndarray:
    """Token ids of one text as the model saw them in training (truncation, CLS)."""
    return batching.encode_all(
        trained.tokenizer,
        [check_text(text)],
        max_len=trained.cfg.max_len,
        add_cls=trained.cfg.pooling == "cls",
    )[0]


def analyse(trained: Trained, ids_L: np.ndarray) -> dict:
    """Probabilities, per-layer attention [H, L, L] and the attention each token receives [L].

    Chunked attention never forms the weights, so maps are computed with the matrix form:
    the same function of the same parameters.
    """
    cfg = dataclasses.replace(trained.cfg, implementation="matrix")
    tokens_1xL = jnp.asarray(ids_L[None, :], jnp.int32)
    probs_1xC, aux = _forward(trained.params, tokens_1xL, cfg=cfg)
    attention = [np.asarray(w[0], np.float32) for w in aux["attention"]]
    if aux["pool_weights"] is not None:  # structured pooling: what the classifier reads
        received_L = np.asarray(aux["pool_weights"][0], np.float32).mean(0)
    elif attention:
        received_L = attention[-1].mean(axis=(0, 1))
    else:
        received_L = np.full(len(ids_L), 1.0 / max(len(ids_L), 1), np.float32)
    return {"probs": np.asarray(probs_1xC[0]), "attention": attention, "received": received_L}
