"""One text through a trained model, for the pictures: its class probabilities, every layer's
attention maps and the attention each token receives, and one layer's attention step by step."""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn import models, multihead


@functools.partial(jax.jit, static_argnames=("cfg",))
def _forward(
    params: Any,
    tokens_BxL: jax.Array,
    bag_tokens_BxG: jax.Array | None,
    *,
    cfg: models.AnyConfig,
):
    model = models.module(cfg)  # attn.classifier, or a fine-tuned attn.encoder_classifier
    logits_BxC, aux = model.apply(params, tokens_BxL, cfg, bag_tokens_BxG=bag_tokens_BxG)
    return jax.nn.softmax(logits_BxC), aux


def analyse(
    params: Any, cfg: models.AnyConfig, ids_L: np.ndarray, bag_ids_G: np.ndarray | None
) -> dict:
    """Probabilities [C], per-layer attention [H, L, L] and the attention each token receives [L]
    of one text's ids [L] (and what its bag reads [M], if the model's bag reads more of it).

    Chunked attention never forms the weights, so maps are computed with the matrix form:
    the same function of the same parameters.
    """
    cfg = dataclasses.replace(cfg, implementation="matrix")
    tokens_1xL = jnp.asarray(ids_L[None, :], jnp.int32)
    bag_1xG = None if bag_ids_G is None else jnp.asarray(bag_ids_G[None, :], jnp.int32)
    probs_1xC, aux = _forward(params, tokens_1xL, bag_1xG, cfg=cfg)
    attention = [np.asarray(w[0], np.float32) for w in aux["attention"]]
    if aux["pool_weights"] is not None:  # structured pooling: what the classifier reads
        received_L = np.asarray(aux["pool_weights"][0], np.float32).mean(0)
    elif attention:
        received_L = attention[-1].mean(axis=(0, 1))
    else:
        received_L = np.full(len(ids_L), 1.0 / max(len(ids_L), 1), np.float32)
    return {"probs": np.asarray(probs_1xC[0]), "attention": attention, "received": received_L}


def attention_steps(
    params: Any, cfg: models.AnyConfig, ids_L: np.ndarray, layer: int
) -> multihead.Steps:
    """The model's `attention_steps` of one sequence of ids [L] (PAD ids are masked keys), as
    float32 numpy arrays (and the score they were computed with)."""
    model = models.module(cfg)
    st = model.attention_steps(params, jnp.asarray(ids_L, jnp.int32), cfg, layer=layer)
    arrays = {k: np.asarray(a, np.float32) for k, a in st._asdict().items() if k != "score"}
    return st._replace(**arrays)
