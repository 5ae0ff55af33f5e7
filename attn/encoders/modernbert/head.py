"""ModernBERT's sequence-classification head (ModernBertForSequenceClassification):

    x = h[:, 0]  ("cls")  |  mean of h over real tokens  ("mean")    classifier_pooling
    v = LN(act(head.dense(x)))                [B, D]    act: classifier_activation (GELU); the
                                                        dense layer's bias only with
                                                        classifier_bias; LN without bias (norm_eps)

then Dropout and the final linear layer `classifier` (`attn.head`). ModernBertForMaskedLM's
prediction head is the same module under the same names (head.dense, head.norm), so a fine-tune
of a masked-LM checkpoint starts from it, as transformers' does.
"""

import math

import jax
import jax.numpy as jnp

from attn import layers, pooling
from attn.encoders import heads
from attn.encoders.hub import CheckpointError, Rule
from attn.encoders.modernbert.model import Config

__all__ = ["HEAD"]

_CLASSES = heads.Classes(
    classifier="ModernBertForSequenceClassification",
    prefix="model.",
    module="transformers.models.modernbert.modeling_modernbert",
    base="ModernBertModel",
    pretrained="ModernBertPreTrainedModel",
)
_POOLINGS = ("cls", "mean")


def _init(key: jax.Array, cfg: Config, pooling_: str) -> dict:
    """As ModernBERT draws its head: the dense layer ~ N(0, std²) cut at 2 std, std
    initializer_range / sqrt(2 num_layers); LayerNorm scale 1."""
    del pooling_
    d = cfg.d_model
    std = cfg.initializer_range / math.sqrt(2.0 * max(cfg.num_layers, 1))
    dense = {"w": std * jax.random.truncated_normal(key, -2.0, 2.0, (d, d), jnp.float32)}
    if cfg.classifier_bias:
        dense["b"] = jnp.zeros((d,), jnp.float32)
    return {"dense": dense, "ln": {"scale": jnp.ones((d,), jnp.float32)}}


def _apply(
    pool: dict,
    encoder: dict,
    cfg: Config,
    h_BxLxD: jax.Array,
    mask_BxL: jax.Array,
    pooling_: str,
    *,
    dropout: float,
    train: bool,
    rng: jax.Array | None,
) -> jax.Array:
    del encoder, dropout, train, rng  # the class drops nothing before its final layer
    if pooling_ == "mean":
        x_BxD = jax.vmap(pooling.mean_pool)(h_BxLxD, mask_BxL)
    else:
        x_BxD = h_BxLxD[:, 0]
    y_BxD = heads.activation(cfg.classifier_act)(layers.dense(pool["dense"], x_BxD))
    return layers.layer_norm({"scale": pool["ln"]["scale"], "bias": 0.0}, y_BxD, cfg.norm_eps)


def _rules(cfg: Config, pooling_: str) -> dict:
    del pooling_
    out = {
        "head.dense.weight": (Rule(("pool", "dense", "w"), transpose=True),),
        "head.norm.weight": (Rule(("pool", "ln", "scale")),),
    }
    if cfg.classifier_bias:
        out["head.dense.bias"] = (Rule(("pool", "dense", "b")),)
    return {**out, **heads.final_linear("classifier")}


def _from_hf(hf: dict, where: str) -> str:
    """config.json's classifier_pooling ("cls" when absent, transformers' default)."""
    chosen = hf.get("classifier_pooling", "cls")
    if chosen not in _POOLINGS:
        raise CheckpointError(
            f"{where}: config.json is not supported: classifier_pooling {chosen!r} (only "
            f"{' or '.join(_POOLINGS)})"
        )
    return chosen


HEAD = heads.Head(
    poolings=_POOLINGS,
    init=_init,
    apply=_apply,
    classes=lambda cfg: _CLASSES,
    rules=_rules,
    from_hf=_from_hf,
    to_hf=lambda cfg, pooling_: {"classifier_pooling": pooling_},
)
