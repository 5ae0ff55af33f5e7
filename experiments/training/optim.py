"""What a config trains and how: the model config, the optimizer, the train state, the loss and
one train step (a pure function; the train loop jits it over a `functools.partial`)."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from attn import classifier
from experiments.errors import UserError

# apply_if_finite would apply a non-finite update after this many skips; the train loop stops
# long before (config.optim.max_nonfinite), so this only has to be out of reach.
_NEVER = 2**30


# config.model fields that say where a run's parameters start (`warm_start`), not what the model is.
RUN_FIELDS = ("init_from", "embeddings_from")


def model_config(
    config: ml_collections.ConfigDict, vocab_size: int, num_classes: int
) -> classifier.ModelConfig:
    """The frozen model config: `config.model` plus what the data decides."""
    fields = {k: v for k, v in config.model.to_dict().items() if k not in RUN_FIELDS}
    try:
        return classifier.ModelConfig(
            vocab_size=vocab_size, num_classes=num_classes, max_len=config.data.max_len, **fields
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"config.model: {e}") from None


def check_model(config: ml_collections.ConfigDict) -> None:
    """config.model's mistakes before any data is read: the vocabulary, the classes and a length
    left to the data are stood in for by valid values."""
    probe = {"model": config.model.to_dict(), "data": {"max_len": max(config.data.max_len, 1)}}
    model_config(ml_collections.ConfigDict(probe), vocab_size=4, num_classes=2)


BAG_INITS = ("zeros", "naive_bayes")


def check_optim(optim: ml_collections.ConfigDict) -> None:
    """Optimizer settings outside their range fail here, by name, instead of as NaNs later."""
    rules = {
        "learning_rate": (lambda v: v > 0, "> 0"),
        "warmup_steps": (
            lambda v: v >= -1 and float(v).is_integer(),
            "an integer >= 0 (or -1: from the data)",
        ),
        "weight_decay": (lambda v: v >= 0, ">= 0"),
        "clip_norm": (lambda v: v > 0, "> 0"),
        "label_smoothing": (lambda v: 0 <= v < 1, "in [0, 1)"),
        "penalty_weight": (lambda v: v >= 0, ">= 0"),
        "adversarial_eps": (lambda v: v >= 0, ">= 0 (0 = no adversarial loss)"),
        "ema_decay": (lambda v: 0 <= v < 1, "in [0, 1) (0 = no running average)"),
        "max_nonfinite": (lambda v: v >= 1 and float(v).is_integer(), "an integer >= 1"),
        "warm_lr_scale": (lambda v: v >= 0, ">= 0 (0 freezes what the run starts from)"),
    }
    for name, (ok, want) in rules.items():
        v = optim[name]
        if isinstance(v, bool) or not isinstance(v, int | float) or not ok(v):
            raise UserError(f"config.optim.{name} must be {want}; got {v!r}")
    if optim.bag_init not in BAG_INITS:
        raise UserError(f"config.optim.bag_init must be one of {BAG_INITS}; got {optim.bag_init!r}")


def make_optimizer(
    optim: ml_collections.ConfigDict,
    total_steps: int,
    warm: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
    """AdamW with warmup + cosine decay, global-norm clipping, skipping of non-finite updates.

    warm(params) -> a tree of bools marks the parameters a run starts from (a pretrained encoder,
    word vectors): their updates are scaled by optim.warm_lr_scale (0 freezes them), so the
    fresh parameters may learn fast without overwriting what the warm ones bring.
    """
    warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=optim.learning_rate * 0.01,
    )
    # Decay matrices only: biases, LayerNorm scales and offsets are vectors.
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    tx = optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(schedule, weight_decay=optim.weight_decay, mask=decay_mask),
    )
    scale = optim.get("warm_lr_scale", 1.0)
    if warm is not None and scale != 1.0:
        tx = optax.chain(tx, optax.masked(optax.scale(scale), warm))
    return optax.apply_if_finite(tx, max_consecutive_errors=_NEVER)


def init_params(
    key: jax.Array,
    cfg: classifier.ModelConfig,
    *,
    bag_VxC: jax.Array | None = None,
    tokens_VxD: jax.Array | None = None,
) -> dict:
    """`classifier.init`'s params, with the bag's starting table bag_VxC instead of zeros and the
    token embeddings tokens_VxD (e.g. pretrained word vectors) instead of random rows, if given."""
    params = classifier.init(key, cfg)
    for path, table in ((("bag",), bag_VxC), (("embed", "tokens"), tokens_VxD)):
        if table is None:
            continue
        parent = params if len(path) == 1 else params[path[0]]
        if table.shape != parent[path[-1]].shape:
            raise ValueError(
                f"{'/'.join(path)}: table {table.shape}, model {parent[path[-1]].shape}"
            )
        parent[path[-1]] = jnp.asarray(table, jnp.float32)
    return params


def state_of(params: dict, tx: optax.GradientTransformation, rng: jax.Array, *, ema: bool = False):
    """A fresh train state of `params`: {"params", "opt_state", "step", "rng"} (rng: dropout and
    whatever else a step draws), plus "ema" (a running average of params) if ema."""
    state = {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.zeros([], jnp.int32),
        "rng": rng,
    }
    if ema:  # a copy: a donated state may not hold one buffer twice
        state["ema"] = jax.tree.map(jnp.copy, params)
    return state


def init_state(
    key: jax.Array,
    cfg: classifier.ModelConfig,
    tx: optax.GradientTransformation,
    *,
    ema: bool = False,
    bag_VxC: jax.Array | None = None,
    tokens_VxD: jax.Array | None = None,
):
    """The classifier's fresh train state (`state_of`); bag_VxC and tokens_VxD as in
    `init_params`."""
    init_key, dropout_key = jax.random.split(key)
    params = init_params(init_key, cfg, bag_VxC=bag_VxC, tokens_VxD=tokens_VxD)
    return state_of(params, tx, dropout_key, ema=ema)


def eval_params(state: dict) -> Any:
    """The params to evaluate and serve: the running average when the state keeps one."""
    return state.get("ema", state["params"])


def _ema_update(ema: Any, params: Any, step: jax.Array, decay: float) -> Any:
    """The bias-corrected running average after update number step + 1: the weights of all
    updates so far, weighted by decay**age and normalised; the initial params weigh nothing."""
    d = jnp.float32(decay)  # one precision throughout, so the first weight is exactly 1
    w = (1 - d) / (1 - d ** (step + 1).astype(jnp.float32))
    return jax.tree.map(lambda e, p: e + w * (p - e), ema, params)


def apply_gradients(
    state: dict,
    grads: Any,
    tx: optax.GradientTransformation,
    metrics: dict,
    *,
    ema_decay: float = 0.0,
) -> tuple[dict, dict]:
    """The state after one optimizer step on `grads` (unchanged params when they are not finite),
    and `metrics` with what the train loop logs of the step itself."""
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    new_state = {**state, "params": params, "opt_state": opt_state, "step": state["step"] + 1}
    if "ema" in state:
        new_state["ema"] = _ema_update(state["ema"], params, state["step"], ema_decay)
    metrics = {
        **metrics,
        "grad_norm": optax.tree.norm(grads),
        "nonfinite_run": opt_state.notfinite_count,
        "nonfinite_total": opt_state.total_notfinite,
    }
    return new_state, metrics
