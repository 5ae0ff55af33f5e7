"""A linear model on the binary bag of hashed n-grams; the classifier adds its logits to its own.

This is the "wide" half of wide-and-deep (Cheng et al. 2016) and the model of NBSVM / TF-IDF +
logistic regression: every distinct n-gram of the text votes once, whatever its position. It is
what makes those baselines strong on long reviews, where one layer of attention averaged into a
single vector loses rare decisive phrases; trained jointly, attention learns what the bag cannot
(order beyond n, negation scope, context).

Features: each distinct bucket id of a row (per n-gram order) counts once, padding never; the bag
is L2-normalised, weight 1/√(number of distinct n-grams), as TF-IDF rows are. logits [B, C] =
Σ_n Σ_{distinct ids i in row b} table[i] / √count_b.
"""

import jax
import jax.numpy as jnp

_NONE = -1  # the id that marks a padding position once ids are sorted


def weights(ids_NxBxL: jax.Array, real_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Bucket ids [N, B, L] of each n-gram order and real-token mask [B, L] -> (ids sorted along L
    [N, B, L] int32, weights [N, B, L] float32): 1/√count at the first of each distinct id of a
    row, 0 at repeats and padding. Sorting makes the dedup O(L log L) instead of O(L²)."""
    sorted_NxBxL = jnp.sort(jnp.where(real_BxL[None], ids_NxBxL, _NONE), axis=-1)
    before_NxBxL = jnp.pad(sorted_NxBxL, ((0, 0), (0, 0), (1, 0)), constant_values=_NONE)[..., :-1]
    first_NxBxL = (sorted_NxBxL != _NONE) & (sorted_NxBxL != before_NxBxL)
    count_B = first_NxBxL.sum((0, 2)).astype(jnp.float32)
    w_NxBxL = first_NxBxL / jnp.sqrt(jnp.maximum(count_B, 1.0))[None, :, None]
    return jnp.maximum(sorted_NxBxL, 0), w_NxBxL.astype(jnp.float32)


def logits(
    table_VxC: jax.Array,
    ids_NxBxL: jax.Array,
    real_BxL: jax.Array,
    *,
    dropout: float = 0.0,
    train: bool = False,
    rng: jax.Array | None = None,
) -> jax.Array:
    """Logits [B, C] float32 of the bag of the bucket ids [N, B, L] (ids in [0, V)).

    In training, `dropout` drops each distinct n-gram with that probability (the others scaled by
    1/(1 - dropout)), so the attention model cannot lean on a few memorised n-grams.
    """
    sorted_NxBxL, w_NxBxL = weights(ids_NxBxL, real_BxL)
    if train and dropout > 0.0:
        keep_NxBxL = jax.random.bernoulli(rng, 1.0 - dropout, w_NxBxL.shape)
        w_NxBxL = jnp.where(keep_NxBxL, w_NxBxL / (1.0 - dropout), 0.0)
    return jnp.einsum("nbl,nblc->bc", w_NxBxL, table_VxC[sorted_NxBxL])
