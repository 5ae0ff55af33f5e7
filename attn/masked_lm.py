"""Masked-token pretraining (BERT's objective, Devlin et al. 2019): which tokens are hidden, the
head that predicts them, and the loss.

Of each sequence's real tokens (not PAD, CLS or UNK), a share `rate` (at least one) is chosen as
a target. A target is shown as UNK with probability 0.8, as a random real token with 0.1, and
unchanged with 0.1; the model must predict the original at every target. The hidden token is
shown as UNK, the id the classifier already reads for a token it does not know, so the pretrained
encoder has exactly the classifier's parameters and a saved vocabulary needs no new id. The hashed
n-grams are computed from the corrupted ids, so they cannot leak a hidden token.

The head (`init_head`, `head_logits`): dense + GELU + LayerNorm, then scores against the token
embedding table itself (tied, scaled by 1/√D) plus a bias per token. It is computed only at the
targets, [B, P] of them, never at all L positions: a [B, L, V] array of a 30,000-word vocabulary
would dwarf the rest of the step. Even so, on a large vocabulary the head's softmax is most of
the step (three quarters of it at 30,000 words, L=512, D=64 on a CPU), so `corrupt` can take
its targets among the `predicted` most frequent ids only (ids are in frequency order) and the
head score those alone: rarer tokens are read, never predicted.
"""

import math

import jax
import jax.numpy as jnp

from attn import layers

__all__ = ["corrupt", "head_logits", "init_head", "loss", "num_targets"]

MASKED, RANDOM = 0.8, 0.1  # shares of targets shown as UNK and as a random token; the rest as is
FIRST_REAL = 3  # ids 0, 1, 2 are PAD, UNK and CLS
UNK = 1


def num_targets(length: int, rate: float) -> int:
    """P, the targets a row of `length` tokens may hold: ceil(rate * length), at least 1."""
    return max(1, math.ceil(rate * length))


def corrupt(
    key: jax.Array,
    tokens_BxL: jax.Array,
    *,
    vocab_size: int,
    rate: float = 0.15,
    predicted: int | None = None,
) -> tuple[jax.Array, dict]:
    """Hides `rate` of each row's real tokens -> (corrupted ids [B, L], targets): {"positions":
    int32 [B, P], "ids": int32 [B, P] (the original tokens), "weight": float32 [B, P] (1 for a
    target, 0 for an unused slot)}, P = `num_targets(L, rate)`.

    A row of n real tokens gets round(rate * n) targets (at least 1 when n > 0), chosen uniformly
    without replacement; the corrupted ids differ from tokens_BxL only at targets. With
    `predicted`, only tokens with ids below it count as real here (None: every id below
    vocab_size), so every target id is < predicted.
    """
    predicted = vocab_size if predicted is None else predicted
    if not 0.0 < rate < 1.0:
        raise ValueError(f"rate must be in (0, 1); got {rate}")
    if vocab_size <= FIRST_REAL:
        raise ValueError(f"vocab_size must be > {FIRST_REAL}; got {vocab_size}")
    if not FIRST_REAL < predicted <= vocab_size:
        raise ValueError(f"predicted must be in ({FIRST_REAL}, {vocab_size}]; got {predicted}")
    batch, length = tokens_BxL.shape
    p = num_targets(length, rate)
    k_pick, k_kind, k_random = jax.random.split(key, 3)
    eligible_BxL = (tokens_BxL >= FIRST_REAL) & (tokens_BxL < predicted)
    # Eligible positions draw from [0, 1), the others 2: the first P of the sort are a uniform
    # sample of the eligible ones, followed by the rest.
    u_BxL = jnp.where(eligible_BxL, jax.random.uniform(k_pick, (batch, length)), 2.0)
    positions_BxP = jnp.argsort(u_BxL, axis=-1)[:, :p].astype(jnp.int32)
    n_B = eligible_BxL.sum(-1)
    want_B = jnp.where(n_B > 0, jnp.maximum(jnp.round(rate * n_B), 1), 0)
    weight_BxP = (jnp.arange(p)[None, :] < want_B[:, None]).astype(jnp.float32)
    ids_BxP = jnp.take_along_axis(tokens_BxL, positions_BxP, axis=-1)

    kind_BxP = jax.random.uniform(k_kind, (batch, p))
    random_BxP = jax.random.randint(k_random, (batch, p), FIRST_REAL, vocab_size, jnp.int32)
    shown_BxP = jnp.where(
        kind_BxP < MASKED, UNK, jnp.where(kind_BxP < MASKED + RANDOM, random_BxP, ids_BxP)
    )
    shown_BxP = jnp.where(weight_BxP > 0, shown_BxP, ids_BxP)  # unused slots change nothing
    rows_BxP = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, p))
    corrupted_BxL = tokens_BxL.at[rows_BxP, positions_BxP].set(shown_BxP.astype(tokens_BxL.dtype))
    return corrupted_BxL, {"positions": positions_BxP, "ids": ids_BxP, "weight": weight_BxP}


def init_head(key: jax.Array, d_model: int, vocab_size: int) -> dict:
    """{"transform": dense D->D, "ln": layer norm, "bias": zeros [V]}."""
    return {
        "transform": layers.dense_init(key, d_model, d_model),
        "ln": layers.layer_norm_init(d_model),
        "bias": jnp.zeros((vocab_size,), jnp.float32),
    }


def head_logits(
    head: dict, table_VxD: jax.Array, h_BxLxD: jax.Array, positions_BxP: jax.Array
) -> jax.Array:
    """Logits [B, P, V] float32 over the V tokens of table_VxD (the first V of the head's bias) at
    the target positions of states h."""
    h_BxPxD = jnp.take_along_axis(h_BxLxD, positions_BxP[..., None], axis=1).astype(jnp.float32)
    t_BxPxD = layers.layer_norm(head["ln"], jax.nn.gelu(layers.dense(head["transform"], h_BxPxD)))
    scale = 1.0 / math.sqrt(table_VxD.shape[-1])  # unit-variance t against N(0, 1) rows
    bias_V = head["bias"][: table_VxD.shape[0]]
    return jnp.einsum("bpd,vd->bpv", t_BxPxD, table_VxD) * scale + bias_V


def loss(logits_BxPxV: jax.Array, targets: dict) -> tuple[jax.Array, dict]:
    """Mean cross-entropy over the targets, and the sums the train loop logs: {"loss_sum",
    "correct", "count"} over targets."""
    logp_BxPxV = jax.nn.log_softmax(logits_BxPxV.astype(jnp.float32))
    nll_BxP = -jnp.take_along_axis(logp_BxPxV, targets["ids"][..., None], axis=-1)[..., 0]
    w_BxP = targets["weight"]
    count = w_BxP.sum()
    loss_sum = (nll_BxP * w_BxP).sum()
    correct = ((logits_BxPxV.argmax(-1) == targets["ids"]) * w_BxP).sum()
    return loss_sum / jnp.maximum(count, 1.0), {
        "loss_sum": loss_sum,
        "correct": correct,
        "count": count,
    }
