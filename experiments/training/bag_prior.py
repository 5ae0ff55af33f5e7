"""The bag's starting table from the training split: naive Bayes log-count ratios.

Counted on the ids the bag reads (the cut texts, or the longer cut of `data.bag_len`; hashed as
the model's `bag_ids` hashes them: `attn.classifier`'s or, fine-tuning,
`attn.encoder_classifier`'s), one evaluation-size batch at a time, so no [N, V] matrix is ever
built.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from attn import bag, models
from experiments.data import batching, encoding
from experiments.data.tokenizers import PAD


def naive_bayes(cfg: models.AnyConfig, train: encoding.Split, data: Any) -> jax.Array:
    """The table [bag_buckets, num_classes] float32 of `attn.bag.naive_bayes_table` for `train`."""
    counts_VxC = jnp.zeros((cfg.bag_buckets, cfg.num_classes), jnp.float32)
    for _, b in batching.eval_batches(
        train.ids,
        train.labels,
        batch_size=data.eval_batch_size,
        buckets=data.buckets,
        max_len=data.max_len,
        bag_ids=train.bag_ids,
        bag_len=data.bag_len,
    ):
        read_BxG = b.get("bag_tokens", b["tokens"])
        counts_VxC = _add_counts(counts_VxC, read_BxG, b["label"], b["weight"], cfg=cfg)
    return bag.naive_bayes_table(counts_VxC)


@functools.partial(jax.jit, static_argnames="cfg", donate_argnums=0)
def _add_counts(counts_VxC, tokens_BxL, labels_B, weight_B, *, cfg: models.AnyConfig):
    return counts_VxC + bag.document_counts(
        models.module(cfg).bag_ids(tokens_BxL, cfg),
        tokens_BxL != PAD,
        labels_B,
        weight_B,
        buckets=cfg.bag_buckets,
        num_classes=cfg.num_classes,
    )
