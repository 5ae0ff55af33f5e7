"""The optimizer and the train state every objective shares: AdamW with its schedule, fresh
params and state, the weight average, and one optimizer step on given gradients."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from attn import classifier

# apply_if_finite would apply a non-finite update after this many skips; the train loop stops
# long before (config.optim.max_nonfinite), so this only has to be out of reach.
_NEVER = 2**30


def make_optimizer(
    optim: ml_collections.ConfigDict,
    total_steps: int,
    warm: Callable[[Any], Any] | None = None,
    lr_scales: Callable[[Any], Any] | None = None,
    *,
    learning_rate: float | None = None,
    warmup_steps: int | None = None,
) -> optax.GradientTransformation:
    """AdamW with linear warmup then cosine (or, optim.schedule, linear) decay, global-norm
    clipping, skipping of non-finite updates. The peak `learning_rate` and `warmup_steps` are
    optim's unless given (pretraining's own, `schedule.pretraining`).

    warm(params) -> a tree of bools marks the parameters a run starts from (a pretrained encoder,
    word vectors): their updates are scaled by optim.warm_lr_scale (0 freezes them), so the
    fresh parameters may learn fast without overwriting what the warm ones bring.
    lr_scales(params) -> a tree of floats multiplies each parameter's update, weight decay
    included (layer-wise learning-rate decay).
    """
    lr = optim.learning_rate if learning_rate is None else learning_rate
    warmup = optim.warmup_steps if warmup_steps is None else warmup_steps
    warmup = min(warmup, max(total_steps - 1, 0))
    schedule = _schedule(optim, lr, warmup, max(total_steps, warmup + 1))
    # Decay matrices only: biases, LayerNorm scales and offsets are vectors.
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    scale = optim.get("warm_lr_scale", 1.0) if warm is not None else 1.0
    frozen = frozen_mask(optim, warm)
    tx = optax.chain(
        # Frozen gradients zeroed first, so that they do not shrink the others' by clipping.
        *([optax.masked(optax.set_to_zero(), frozen)] if frozen is not None else []),
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(schedule, weight_decay=optim.weight_decay, mask=decay_mask),
    )
    if lr_scales is not None:
        tx = optax.chain(tx, _scale_by_tree(lr_scales))
    if scale != 1.0:
        tx = optax.chain(tx, optax.masked(optax.scale(scale), warm))
    return optax.apply_if_finite(tx, max_consecutive_errors=_NEVER)


def frozen_mask(
    optim: ml_collections.ConfigDict, warm: Callable[[Any], Any] | None
) -> Callable[[Any], Any] | None:
    """`warm` when optim.warm_lr_scale is 0 (what the run starts from is frozen), else None."""
    return warm if warm is not None and optim.get("warm_lr_scale", 1.0) == 0 else None


def _schedule(
    optim: ml_collections.ConfigDict, lr: float, warmup: int, total: int
) -> optax.Schedule:
    if optim.get("schedule", "cosine") == "linear":  # BERT's: to 0 at the last step
        return optax.join_schedules(
            [
                optax.linear_schedule(0.0, lr, warmup),
                optax.linear_schedule(lr, 0.0, total - warmup),
            ],
            [warmup],
        )
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=lr, warmup_steps=warmup, decay_steps=total, end_value=lr * 0.01
    )


def _scale_by_tree(scales: Callable[[Any], Any]) -> optax.GradientTransformation:
    """Multiplies each update by its entry of scales(params), a tree of the params' structure."""

    def update(updates, state, params=None):
        factors = scales(updates)
        return jax.tree.map(lambda u, f: u * jnp.asarray(f, u.dtype), updates, factors), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


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
    params_from: Callable[[jax.Array], dict] | None = None,
) -> dict:
    """A fresh train state (`state_of`) with the params `params_from(k)` makes of a key split from
    `key` (by default the classifier's, `init_params(k, cfg)`); the other half draws dropout."""
    init_key, rng = jax.random.split(key)
    params = params_from(init_key) if params_from else init_params(init_key, cfg)
    return state_of(params, tx, rng, ema=ema)


def eval_params(state: dict) -> Any:
    """The params to evaluate and serve: the running average when the state keeps one."""
    return state["ema"] if "ema" in state else state["params"]


def served(state: dict) -> dict:
    """What a best checkpoint keeps of a train state: the weights to serve under their name in
    the state ("ema" or "params", so a reader finds them where it finds a whole state's) and the
    step; not the optimizer's moments or the raw params beside an average."""
    name = "ema" if "ema" in state else "params"
    return {name: state[name], "step": state["step"]}


def _ema_update(ema: Any, params: Any, step: jax.Array, decay: float) -> Any:
    """The bias-corrected running average after update number step + 1: the weights of all
    updates so far, weighted by decay**age and normalised; the initial params weigh nothing."""
    d = jnp.float32(decay)  # one precision throughout, so the first weight is exactly 1
    w = (1 - d) / (1 - d ** (step + 1).astype(jnp.float32))
    return jax.tree.map(lambda e, p: e + w * (p - e), ema, params)


def stop_frozen(params: Any, frozen: Callable[[Any], Any] | None) -> Any:
    """params with the leaves frozen(params) marks held constant for differentiation: their
    gradients are zeros, and nothing that only they feed is differentiated (a frozen encoder
    costs its forward pass alone)."""
    if frozen is None:
        return params
    return jax.tree.map(lambda p, f: jax.lax.stop_gradient(p) if f else p, params, frozen(params))


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
