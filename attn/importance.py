"""Which tokens a classifier's prediction rests on: token importance, and erasure tests of it.

Importance methods, each a score per token [B, L] float32 (higher = counts more for the predicted
class; 0 on padding):
  `attention`      what the attention pictures show: structured pooling's weights averaged over
                   hops, else the last layer's weights averaged over heads and real queries (the
                   share of each token's value in the mean-pooled vector's attention part).
  `rollout`        attention rollout across layers (Abnar & Zuidema 2020): each layer's
                   head-averaged weights plus the residual identity, rows renormalised, multiplied
                   through the layers, then read out as the pooling reads its states.
  `gradient`       gradient × input: the predicted class's log-probability's gradient with respect
                   to each token's input embedding, dotted with that embedding (signed).
  `leave_one_out`  the exact drop of the predicted class's probability when that one token is
                   erased, the erasures batched `chunk` positions at a time.
  `random`         uniform noise: the control every other method must beat.

Erasing (`erase`) turns tokens into PAD, so the classifier masks them as keys and pools without
them; it runs again on the erased ids, so the hashed n-gram embeddings and the bag of n-grams
are recomputed and lose every n-gram the token was part of (the next token's n-grams start
afresh, as at a text's start). Not UNK, which is a token the model has embeddings for. When the
bag reads a longer cut of the text (`Bag`), the same tokens are erased from what it reads.

Faithfulness (DeYoung et al. 2020, ERASER), `erasure_drops`: comprehensiveness is the drop of the
predicted class's probability when a method's top k% of tokens are erased, sufficiency the drop
when only they are kept; higher comprehensiveness and lower sufficiency mean the ranking found
what the prediction rests on. `logit_halves` splits a model's logits into the encoder's and the
bag's: attention and gradient × input can only explain the first.

Every function here is pure and jit-able, with `cfg` static: an `attn.classifier.ModelConfig`, or
a fine-tuned encoder's `attn.encoder_classifier.Config` (whose input embedding is what its family
normalises first, e.g. word + position + token type for BERT). Attention weights are computed
with the matrix form whatever cfg.implementation says (the same function of the same
parameters).
"""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from attn import models
from attn.classifier import PAD

ModelConfig = models.AnyConfig

__all__ = [
    "Bag",
    "attention",
    "erase",
    "erasure_drops",
    "gradient",
    "has_attention",
    "leave_one_out",
    "logit_halves",
    "predicted",
    "probabilities",
    "random",
    "rollout",
    "top_counts",
    "top_k",
]


class Bag(NamedTuple):
    """What the bag reads when it reads more of each text than attention does.

    tokens_BxG: the bag's ids; source_BxG: the attention position [0, L) each of them is, or -1
    for the tokens only the bag reads (and for padding).
    """

    tokens_BxG: jax.Array
    source_BxG: jax.Array


def has_attention(cfg: ModelConfig) -> bool:
    """Whether the model has attention weights to read: an encoder layer or structured pooling."""
    return models.layout(cfg).num_layers > 0 or cfg.pooling == "structured"


def probabilities(
    params: dict, tokens_BxL: jax.Array, cfg: ModelConfig, bag: Bag | None = None
) -> jax.Array:
    """Class probabilities [B, C] float32 in evaluation mode."""
    logits_BxC, _ = models.module(cfg).apply(
        params, tokens_BxL, cfg, bag_tokens_BxG=_bag_tokens(bag)
    )
    return jax.nn.softmax(logits_BxC.astype(jnp.float32))


def predicted(
    params: dict, tokens_BxL: jax.Array, cfg: ModelConfig, bag: Bag | None = None
) -> tuple[jax.Array, jax.Array]:
    """(predicted class [B] int32, its probability [B] float32)."""
    p_BxC = probabilities(params, tokens_BxL, cfg, bag)
    c_B = jnp.argmax(p_BxC, -1).astype(jnp.int32)
    return c_B, _take(p_BxC, c_B)


def logit_halves(
    params: dict, tokens_BxL: jax.Array, cfg: ModelConfig, bag: Bag | None = None
) -> tuple[jax.Array, jax.Array]:
    """(logits [B, C] of the encoder, pooling and head alone, logits [B, C] the bag adds): the
    classifier's logits are their sum. Attention-based importance can explain only the first.
    ValueError for a model without a bag."""
    if not cfg.bag_buckets:
        raise ValueError("importance.logit_halves: the model has no bag (bag_buckets=0)")
    logits_BxC, _ = models.module(cfg).apply(
        params, tokens_BxL, cfg, bag_tokens_BxG=_bag_tokens(bag)
    )
    alone = dataclasses.replace(cfg, bag_buckets=0)
    encoder_BxC, _ = models.module(alone).apply(
        {k: v for k, v in params.items() if k != "bag"}, tokens_BxL, alone
    )
    return encoder_BxC, logits_BxC - encoder_BxC


def attention(params: dict, tokens_BxL: jax.Array, cfg: ModelConfig) -> jax.Array:
    """The attention each token receives [B, L] (see the module docstring); ValueError for a
    model without attention (`has_attention`)."""
    if not has_attention(cfg):
        raise ValueError("importance.attention: the model has no attention (num_layers=0)")
    real_BxL = tokens_BxL != PAD
    _, aux = models.module(cfg).apply(params, tokens_BxL, _matrix(cfg))
    if aux["pool_weights"] is not None:  # structured pooling: what the head reads
        received_BxL = aux["pool_weights"].mean(1)
    else:
        w_BxLxL = aux["attention"][-1].mean(1)  # heads averaged: [B, query, key]
        received_BxL = _mean_over_real_rows(w_BxLxL, real_BxL)
    return jnp.where(real_BxL, received_BxL, 0.0)


def rollout(params: dict, tokens_BxL: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Attention rollout [B, L] (Abnar & Zuidema 2020): Ã = rownorm(½ mean_heads(W) + ½ I) per
    layer, R = Ã_n ⋯ Ã_1, read out with the pooling's weights over final positions (the CLS row
    for cls pooling, structured pooling's hop-averaged weights, else the mean over real rows).
    ValueError for a model without encoder layers: rollout needs at least one."""
    if models.layout(cfg).num_layers == 0:
        raise ValueError("importance.rollout: the model has no encoder layer (num_layers=0)")
    real_BxL = tokens_BxL != PAD
    _, aux = models.module(cfg).apply(params, tokens_BxL, _matrix(cfg))
    eye_LxL = jnp.eye(tokens_BxL.shape[1], dtype=jnp.float32)
    r_BxLxL = jnp.broadcast_to(eye_LxL, (tokens_BxL.shape[0], *eye_LxL.shape))
    for w_BxHxLxL in aux["attention"]:
        a_BxLxL = 0.5 * w_BxHxLxL.mean(1) + 0.5 * eye_LxL
        a_BxLxL = a_BxLxL / a_BxLxL.sum(-1, keepdims=True)
        r_BxLxL = jnp.einsum("bij,bjk->bik", a_BxLxL, r_BxLxL)
    if cfg.pooling == "structured":
        flow_BxL = jnp.einsum("bi,bik->bk", aux["pool_weights"].mean(1), r_BxLxL)
    elif cfg.pooling == "cls":
        flow_BxL = r_BxLxL[:, 0]
    else:
        flow_BxL = _mean_over_real_rows(r_BxLxL, real_BxL)
    return jnp.where(real_BxL, flow_BxL, 0.0)


def gradient(
    params: dict, tokens_BxL: jax.Array, cfg: ModelConfig, bag: Bag | None = None
) -> jax.Array:
    """Gradient × input [B, L]: Σ_d ∂ log p(predicted class) / ∂x_ld · x_ld over each token's
    input embedding x (token + n-gram + position; word + position + token type for the BERT
    family). The bag's logits do not depend on the embeddings, so this sees only the attention
    half of a model with a bag."""
    params = _arrays(params)  # numpy leaves cannot be indexed by traced ids under grad
    x_BxLxD = models.module(cfg).embed(params, tokens_BxL, cfg)

    def log_p(delta_BxLxD: jax.Array) -> jax.Array:
        logits_BxC, _ = models.module(cfg).apply(
            params,
            tokens_BxL,
            cfg,
            embed_delta_BxLxD=delta_BxLxD,
            bag_tokens_BxG=_bag_tokens(bag),
        )
        logp_BxC = jax.nn.log_softmax(logits_BxC.astype(jnp.float32))
        c_B = jnp.argmax(jax.lax.stop_gradient(logp_BxC), -1)
        return _take(logp_BxC, c_B).sum()  # rows are independent: one grad gives every row's

    g_BxLxD = jax.grad(log_p)(jnp.zeros_like(x_BxLxD))
    return jnp.where(tokens_BxL != PAD, (g_BxLxD * x_BxLxD).sum(-1), 0.0)


def leave_one_out(
    params: dict,
    tokens_BxL: jax.Array,
    cfg: ModelConfig,
    bag: Bag | None = None,
    *,
    chunk: int | None = None,
) -> jax.Array:
    """[B, L]: p(c | text) − p(c | text with token l erased) for the predicted class c, exact.

    The erasures run `chunk` positions at a time (all L at once by default), each a batch of
    chunk·B sequences holding [H, L, L] attention weights per layer: size it to the memory."""
    length = tokens_BxL.shape[1]
    params = _arrays(params)  # numpy leaves cannot be indexed by the traced ids of lax.map
    c_B, p_B = predicted(params, tokens_BxL, cfg, bag)

    def without(pos: jax.Array) -> jax.Array:  # [B]: token `pos` of every text erased
        keep_BxL = jnp.broadcast_to(jnp.arange(length) != pos, tokens_BxL.shape)
        erased_BxL, erased_bag = erase(tokens_BxL, keep_BxL, bag, keep_outside=True)
        return _take(probabilities(params, erased_BxL, cfg, erased_bag), c_B)

    p_LxB = jax.lax.map(without, jnp.arange(length), batch_size=chunk or length)
    return jnp.where(tokens_BxL != PAD, p_B[:, None] - p_LxB.T, 0.0)


def random(key: jax.Array, tokens_BxL: jax.Array) -> jax.Array:
    """Uniform scores [B, L] in [0, 1), 0 on padding: a ranking that knows nothing."""
    u_BxL = jax.random.uniform(key, tokens_BxL.shape, jnp.float32)
    return jnp.where(tokens_BxL != PAD, u_BxL, 0.0)


def erase(
    tokens_BxL: jax.Array,
    keep_BxL: jax.Array,
    bag: Bag | None = None,
    *,
    keep_outside: bool | jax.Array,
) -> tuple[jax.Array, Bag | None]:
    """Tokens where keep_BxL is False become PAD, in tokens_BxL and in what the bag reads; the
    tokens only the bag reads are kept where keep_outside (a bool, or per row [B, 1]), erased
    elsewhere."""
    erased_BxL = jnp.where(keep_BxL, tokens_BxL, PAD)
    if bag is None:
        return erased_BxL, None
    inside_BxG = bag.source_BxG >= 0
    at_BxG = jnp.take_along_axis(keep_BxL, jnp.maximum(bag.source_BxG, 0), axis=1)
    keep_BxG = jnp.where(inside_BxG, at_BxG, keep_outside)
    return erased_BxL, Bag(jnp.where(keep_BxG, bag.tokens_BxG, PAD), bag.source_BxG)


def top_k(scores_BxL: jax.Array, candidates_BxL: jax.Array, k_B: jax.Array) -> jax.Array:
    """bool [B, L]: each row's k highest-scoring candidates (ties: the earlier position first)."""
    s_BxL = jnp.where(candidates_BxL, scores_BxL.astype(jnp.float32), -jnp.inf)
    order_BxL = jnp.argsort(-s_BxL, axis=-1, stable=True)
    rank_BxL = jnp.argsort(order_BxL, axis=-1)  # the inverse permutation
    return (rank_BxL < k_B[:, None]) & candidates_BxL


def top_counts(candidates_BxL: jax.Array, percents: tuple[int, ...]) -> jax.Array:
    """int32 [Y, B]: ceil(percent% of each row's candidates), so at least one token of any text
    (integer arithmetic: 10% of 10 tokens is exactly 1)."""
    n_B = candidates_BxL.sum(-1).astype(jnp.int32)
    return jnp.stack([(p * n_B + 99) // 100 for p in percents])


def erasure_drops(
    params: dict,
    tokens_BxL: jax.Array,
    scores_BxL: jax.Array,
    candidates_BxL: jax.Array,
    cfg: ModelConfig,
    *,
    percents: tuple[int, ...],
    bag: Bag | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(comprehensiveness [B, Y], sufficiency [B, Y]) of one ranking at each of `percents`.

    candidates_BxL marks the tokens a ranking may pick (the text's tokens, not PAD or CLS); those
    not picked stay for sufficiency, so the CLS token that cls pooling reads is never erased.
    Comprehensiveness erases the top ceil(k% · n) candidates; sufficiency erases every other
    candidate and, when the bag reads more of the text, the tokens only the bag reads."""
    c_B, p_B = predicted(params, tokens_BxL, cfg, bag)
    top_YxBxL = jax.vmap(lambda k_B: top_k(scores_BxL, candidates_BxL, k_B))(
        top_counts(candidates_BxL, percents)
    )
    top_BxYxL = jnp.swapaxes(top_YxBxL, 0, 1)
    only_BxYxL = top_BxYxL | ~candidates_BxL[:, None, :]  # the top, and every non-candidate
    # Both tests as one batch of 2Y erasures per text: comprehensiveness, then sufficiency.
    keep_Bx2YxL = jnp.concatenate([~top_BxYxL, only_BxYxL], axis=1)
    outside_2Y = jnp.repeat(jnp.array([True, False]), len(percents))
    p_Bx2Y = _erased_probability(params, tokens_BxL, keep_Bx2YxL, c_B, cfg, bag, outside_2Y)
    drop_Bx2Y = p_B[:, None] - p_Bx2Y
    return drop_Bx2Y[:, : len(percents)], drop_Bx2Y[:, len(percents) :]


def _erased_probability(
    params: dict,
    tokens_BxL: jax.Array,
    keep_BxnxL: jax.Array,
    c_B: jax.Array,
    cfg: ModelConfig,
    bag: Bag | None,
    keep_outside_n: jax.Array,
) -> jax.Array:
    """[B, n]: probability of class c_B of each text under each of its n erasures, as one batch;
    erasure i keeps the tokens only the bag reads when keep_outside_n[i]."""
    batch, n, length = keep_BxnxL.shape

    def flat(a_BxX: jax.Array) -> jax.Array:  # each text's row repeated n times
        return jnp.repeat(a_BxX, n, axis=0)

    bag_n = None if bag is None else Bag(flat(bag.tokens_BxG), flat(bag.source_BxG))
    tokens_n, bag_n = erase(
        flat(tokens_BxL),
        keep_BxnxL.reshape(batch * n, length),
        bag_n,
        keep_outside=jnp.tile(keep_outside_n, batch)[:, None],
    )
    p_nxC = probabilities(params, tokens_n, cfg, bag_n)
    return _take(p_nxC, jnp.repeat(c_B, n)).reshape(batch, n)


def _mean_over_real_rows(m_BxLxL: jax.Array, real_BxL: jax.Array) -> jax.Array:
    """Each column's mean over the rows of real tokens -> [B, L]."""
    r_BxL1 = real_BxL[..., None].astype(jnp.float32)
    return (m_BxLxL * r_BxL1).sum(1) / jnp.maximum(r_BxL1.sum(1), 1.0)


def _take(p_BxC: jax.Array, c_B: jax.Array) -> jax.Array:
    return jnp.take_along_axis(p_BxC, c_B[:, None], axis=1)[:, 0]


def _bag_tokens(bag: Bag | None) -> jax.Array | None:
    return None if bag is None else bag.tokens_BxG


def _arrays(params: dict) -> dict:
    return jax.tree.map(jnp.asarray, params)


def _matrix(cfg: ModelConfig) -> ModelConfig:
    """cfg with attention weights formed (chunked and xla never form them)."""
    return dataclasses.replace(cfg, implementation="matrix")
