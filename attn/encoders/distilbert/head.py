"""DistilBERT's sequence-classification head (DistilBertForSequenceClassification):

    v = ReLU(pre_classifier(h[:, 0]))         [B, D]

then Dropout and the final linear layer `classifier` (`attn.head`). No dropout comes before
pre_classifier; the class's one dropout rate (seq_classif_dropout) is the classifier's.
"""

import jax

from attn.encoders import heads
from attn.encoders.bert.checkpoint import linear
from attn.encoders.distilbert.model import Config

__all__ = ["HEAD"]

_CLASSES = heads.Classes(
    classifier="DistilBertForSequenceClassification",
    prefix="distilbert.",
    module="transformers.models.distilbert.modeling_distilbert",
    base="DistilBertModel",
    pretrained="DistilBertPreTrainedModel",
)


def _init(key: jax.Array, cfg: Config, pooling: str) -> dict:
    del pooling
    return {"dense": heads.dense_init(key, cfg.d_model, cfg.initializer_range)}


def _apply(
    pool: dict,
    encoder: dict,
    cfg: Config,
    h_BxLxD: jax.Array,
    mask_BxL: jax.Array,
    pooling: str,
    *,
    dropout: float,
    train: bool,
    rng: jax.Array | None,
) -> jax.Array:
    del encoder, cfg, mask_BxL, pooling, dropout
    return heads.first_token_dense(
        pool["dense"], h_BxLxD, act=jax.nn.relu, dropout=0.0, train=train, rng=rng
    )


HEAD = heads.Head(
    poolings=("cls",),
    init=_init,
    apply=_apply,
    classes=lambda cfg: _CLASSES,
    rules=lambda cfg, pooling: {
        **linear("pre_classifier", ("pool", "dense")),
        **heads.final_linear("classifier"),
    },
    from_hf=heads.fixed_pooling,
    to_hf=lambda cfg, pooling: {},
)
