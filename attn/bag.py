"""A linear model on the binary bag of hashed n-grams; the classifier adds its logits to its own.

This is the "wide" half of wide-and-deep (Cheng et al. 2016) and the model of NBSVM / TF-IDF +
logistic regression: every distinct n-gram of the text votes once, whatever its position. It is
what makes those baselines strong on long reviews, where one layer of attention averaged into a
single vector loses rare decisive phrases; trained jointly, attention learns what the bag cannot
(order beyond n, negation scope, context).

Features: each distinct bucket id of a row (per n-gram order) counts once, padding never; the bag
is L2-normalised, weight 1/√(number of distinct n-grams), as TF-IDF rows are. logits [B, C] =
Σ_o Σ_{distinct ids i in row b} table[i] / √count_b.

The bucket ids are hashed n-grams of token ids (`ngram_buckets`), whatever the tokenizer: attn's
own ids or a pretrained checkpoint's WordPiece ids.

The table may start from naive Bayes log-count ratios of the training split (`document_counts`,
`naive_bayes_table`): NBSVM's features (Wang & Manning 2012), here a starting point that training
moves on from, instead of zeros.
"""

import numbers
from typing import Any

import jax
import jax.numpy as jnp

from attn import layers

__all__ = [
    "beside",
    "checked_orders",
    "document_counts",
    "logits",
    "naive_bayes_table",
    "ngram_buckets",
    "weights",
]

_NONE = -1  # the id that marks a padding position once ids are sorted


def _fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3 finaliser: spreads every input bit over the low bits the modulo keeps."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def checked_orders(orders: Any, name: str, needed: bool) -> tuple[int, ...]:
    """n-gram orders as a tuple (a list read back from JSON too), or ValueError naming the field
    `name`: distinct integers >= 1, at least one when `needed` (its buckets are on)."""
    if (
        isinstance(orders, str | bytes)
        or not hasattr(orders, "__iter__")
        or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in orders)
        or any(n < 1 for n in orders)
        or len(set(orders)) != len(orders)
        or (needed and len(orders) == 0)
    ):
        raise ValueError(
            f"{name} must be a non-empty tuple of distinct integers >= 1; got {orders!r}"
        )
    return tuple(int(n) for n in orders)


def ngram_buckets(tokens_BxL: jax.Array, orders: tuple[int, ...], buckets: int) -> jax.Array:
    """Bucket ids [len(orders), B, L] of the n-gram of token ids ending at each position.

    Ids before the sequence start count as padding (0). FNV-1a over whole ids (uint32
    wrap-around), seeded with the order so a bigram and a trigram of the same ids land in
    different buckets.
    """
    t_BxL = tokens_BxL.astype(jnp.uint32)
    out = []
    for n in orders:
        h_BxL = jnp.full(t_BxL.shape, 2166136261 ^ n, jnp.uint32)
        for back in range(n - 1, -1, -1):  # oldest token first
            prev_BxL = jnp.pad(t_BxL, ((0, 0), (back, 0)))[:, : t_BxL.shape[1]]
            h_BxL = (h_BxL ^ prev_BxL) * jnp.uint32(16777619)
        out.append(_fmix32(h_BxL) % jnp.uint32(buckets))
    return jnp.stack(out).astype(jnp.int32)


def weights(ids_OxBxL: jax.Array, real_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Bucket ids [O, B, L] of each n-gram order and real-token mask [B, L] -> (ids sorted along L
    [O, B, L] int32, weights [O, B, L] float32): 1/√count at the first of each distinct id of a
    row, 0 at repeats and padding. Sorting makes the dedup O(L log L) instead of O(L²)."""
    sorted_OxBxL = jnp.sort(jnp.where(real_BxL[None], ids_OxBxL, _NONE), axis=-1)
    before_OxBxL = jnp.pad(sorted_OxBxL, ((0, 0), (0, 0), (1, 0)), constant_values=_NONE)[..., :-1]
    first_OxBxL = (sorted_OxBxL != _NONE) & (sorted_OxBxL != before_OxBxL)
    count_B = first_OxBxL.sum((0, 2)).astype(jnp.float32)
    w_OxBxL = first_OxBxL / jnp.sqrt(jnp.maximum(count_B, 1.0))[None, :, None]
    return jnp.maximum(sorted_OxBxL, 0), w_OxBxL.astype(jnp.float32)


def logits(
    table_VxC: jax.Array,
    ids_OxBxL: jax.Array,
    real_BxL: jax.Array,
    *,
    dropout: float = 0.0,
    train: bool = False,
    rng: jax.Array | None = None,
) -> jax.Array:
    """Logits [B, C] float32 of the bag of the bucket ids [O, B, L] (ids in [0, V)).

    In training, `dropout` drops each distinct n-gram with that probability (`attn.layers.dropout`:
    the others scaled by 1 / the keep probability), so the attention model cannot lean on a few
    memorised n-grams.
    """
    sorted_OxBxL, w_OxBxL = weights(ids_OxBxL, real_BxL)
    if train and dropout > 0.0:
        w_OxBxL = layers.dropout(w_OxBxL, dropout, train=True, rng=rng)
    return jnp.einsum("obl,oblc->bc", w_OxBxL, table_VxC[sorted_OxBxL])


def beside(
    logits_BxC: jax.Array,
    table_VxC: jax.Array,
    ids_OxBxG: jax.Array,
    real_BxG: jax.Array,
    *,
    dropout: float,
    train: bool,
    rng: jax.Array | None,
) -> jax.Array:
    """A model's logits [B, C] plus the bag's (`logits`), as attn's classifiers add them. The
    bag's dropout key is folded from the model's rng rather than split from it, so a config
    without the bag keeps its random streams."""
    r_bag = jax.random.fold_in(rng, 1) if train else None
    return logits_BxC + logits(
        table_VxC, ids_OxBxG, real_BxG, dropout=dropout, train=train, rng=r_bag
    )


def document_counts(
    ids_OxBxL: jax.Array,
    real_BxL: jax.Array,
    labels_B: jax.Array,
    weight_B: jax.Array,
    *,
    buckets: int,
    num_classes: int,
) -> jax.Array:
    """Counts [V, C] float32: how many documents of each class hold each bucket id (a document
    counts once per id, however often it repeats it); rows of weight 0 count nothing."""
    sorted_OxBxL, w_OxBxL = weights(ids_OxBxL, real_BxL)
    first_OxBxL = (w_OxBxL > 0) * weight_B[None, :, None]
    labels_OxBxL = jnp.broadcast_to(labels_B[None, :, None], sorted_OxBxL.shape)
    counts_VxC = jnp.zeros((buckets, num_classes), jnp.float32)
    return counts_VxC.at[sorted_OxBxL, labels_OxBxL].add(first_OxBxL)


def naive_bayes_table(counts_VxC: jax.Array, alpha: float = 1.0) -> jax.Array:
    """A table [V, C] float32 from document counts [V, C]: each class's smoothed log-probability of
    the bucket (multinomial naive Bayes over binary features), centred across classes, so that
    for two classes the columns are ∓ half the log-count ratio. Buckets no training document
    holds stay 0: the smoothing alone would give them a bias towards the smaller class."""
    p_VxC = counts_VxC + alpha
    logp_VxC = jnp.log(p_VxC / p_VxC.sum(0, keepdims=True))
    centred_VxC = logp_VxC - logp_VxC.mean(1, keepdims=True)
    return jnp.where(counts_VxC.sum(1, keepdims=True) > 0, centred_VxC, 0.0)
