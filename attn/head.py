"""The classifier head both classifiers share (`attn.classifier` over its own encoder,
`attn.encoder_classifier` over a pretrained one): the pooled vector, dropped out, through a
linear layer, with the bag's logits added beside it, and the aux dict `apply` returns.

    logits = W Dropout(v) + b                 [B, C]
           (+ bag.logits(ids)                 [B, C]   with a "bag" table in params)

Params: {"head": {"w": [X, C], "b": [C]}, "bag": [bag_buckets, C] if the model has a bag}.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from attn import bag, layers

__all__ = ["aux", "init", "logits"]


def init(
    key: jax.Array, d_in: int, num_classes: int, *, bag_buckets: int, std: float | None = None
) -> dict:
    """{"head": ..., "bag": zeros} (no bag at bag_buckets 0): the linear layer Xavier-uniform
    (std None) or ~ N(0, std²) as ...ForSequenceClassification draws it, bias 0. The bag's table
    starts at 0, drawing no key, so a model with a bag has the other params of one without."""
    if std is None:
        dense = layers.dense_init(key, d_in, num_classes)
    else:
        w = std * jax.random.normal(key, (d_in, num_classes), jnp.float32)
        dense = {"w": w, "b": jnp.zeros((num_classes,), jnp.float32)}
    params = {"head": dense}
    if bag_buckets:
        params["bag"] = jnp.zeros((bag_buckets, num_classes), jnp.float32)
    return params


def logits(
    params: dict,
    pooled_BxX: jax.Array,
    *,
    dropout: float,
    train: bool,
    rng_pool: jax.Array | None,
    bag_ids_OxBxG: jax.Array | None = None,
    bag_mask_BxG: jax.Array | None = None,
    bag_dropout: float = 0.0,
    rng_bag: jax.Array | None = None,
) -> jax.Array:
    """Logits [B, C] float32 of the pooled vectors [B, X]; given the bag's bucket ids [O, B, G],
    plus the logits of params["bag"] over the real tokens bag_mask [B, G] (`attn.bag.beside`)."""
    v_BxX = layers.dropout(pooled_BxX.astype(jnp.float32), dropout, train=train, rng=rng_pool)
    logits_BxC = layers.dense(params["head"], v_BxX)
    if bag_ids_OxBxG is not None:
        logits_BxC = bag.beside(
            logits_BxC,
            params["bag"],
            bag_ids_OxBxG,
            bag_mask_BxG,
            dropout=bag_dropout,
            train=train,
            rng=rng_bag,
        )
    return logits_BxC


def aux(
    weights: Sequence[jax.Array | None],
    pool_weights_BxRxL: jax.Array | None = None,
    penalty: jax.Array | None = None,
) -> dict:
    """`apply`'s aux: {"attention": per-layer [B, H, L, L] float32, or None when the
    implementation forms no weights; "pool_weights": [B, R, L] or None; "penalty": scalar}."""
    no_weights = any(w is None for w in weights)
    return {
        "attention": None if no_weights else tuple(weights),
        "pool_weights": pool_weights_BxRxL,
        "penalty": jnp.zeros((), jnp.float32) if penalty is None else penalty,
    }
