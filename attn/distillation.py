"""Distillation losses: a student's logits against a teacher's, per example.

A teacher's logits are known only up to a constant added to each example's row (a served
classifier gives probabilities, whose logs are the logits less their log-sum-exp); neither loss
sees such a constant.

- `soft_cross_entropy`: Hinton et al. 2015's soft targets. The cross-entropy of the student's
  softmax at temperature T against the teacher's at T, times T^2 so that its gradient keeps its
  size as T grows (it falls as 1/T^2 otherwise).
- `logit_mse`: Tang et al. 2019's squared error between logits, each row centred first (its
  mean over the classes subtracted: what the softmax ignores), averaged over the classes.
- `mixed`: what a training example costs: (1 - weight) hard-label cross-entropy + weight times
  one of the above where the example has a label, the teacher's term alone where it has none (an
  augmented or unlabeled text of the transfer set).
"""

import jax
import jax.numpy as jnp

__all__ = ["LOSSES", "logit_mse", "mixed", "soft_cross_entropy"]

LOSSES = ("soft", "mse")


def soft_cross_entropy(
    student_BxC: jax.Array, teacher_BxC: jax.Array, temperature: float
) -> jax.Array:
    """[B]: T^2 * -sum_c softmax(teacher / T)_c * log softmax(student / T)_c."""
    t = jnp.float32(temperature)
    target_BxC = jax.nn.softmax(teacher_BxC.astype(jnp.float32) / t)
    logp_BxC = jax.nn.log_softmax(student_BxC.astype(jnp.float32) / t)
    return -t * t * jnp.sum(target_BxC * logp_BxC, axis=-1)


def logit_mse(student_BxC: jax.Array, teacher_BxC: jax.Array) -> jax.Array:
    """[B]: mean over the classes of (centred student logits - centred teacher logits)^2."""
    diff_BxC = student_BxC.astype(jnp.float32) - teacher_BxC.astype(jnp.float32)
    diff_BxC = diff_BxC - diff_BxC.mean(-1, keepdims=True)
    return jnp.mean(jnp.square(diff_BxC), axis=-1)


def mixed(
    student_BxC: jax.Array,
    teacher_BxC: jax.Array,
    label_B: jax.Array,
    labelled_B: jax.Array,
    *,
    loss: str,
    temperature: float,
    weight: float,
) -> jax.Array:
    """[B]: (1 - weight) * CE(label) + weight * teacher term where labelled_B, the teacher term
    alone elsewhere. `loss` is "soft" (`soft_cross_entropy` at `temperature`) or "mse"
    (`logit_mse`); weight 1 is distillation alone."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}; got {loss!r}")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1]; got {weight!r}")
    if loss == "soft":
        taught_B = soft_cross_entropy(student_BxC, teacher_BxC, temperature)
    else:
        taught_B = logit_mse(student_BxC, teacher_BxC)
    # attn needs only jax and numpy, so the cross-entropy is written out rather than optax's
    logp_BxC = jax.nn.log_softmax(student_BxC.astype(jnp.float32))
    hard_B = -jnp.take_along_axis(logp_BxC, label_B[:, None].astype(jnp.int32), axis=-1)[:, 0]
    both_B = (1.0 - weight) * hard_B + weight * taught_B
    return jnp.where(labelled_B.astype(bool), both_B, taught_B)
