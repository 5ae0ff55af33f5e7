"""ELECTRA's sequence-classification head (ElectraClassificationHead):

    v = GELU(dense(Dropout(h[:, 0])))         [B, D]    exact (erf) GELU, as transformers has it

then Dropout and the final linear layer `classifier.out_proj` (`attn.head`); the dense layer is
`classifier.dense`. Both dropouts take the classifier's rate, as the class's one rate
(classifier_dropout, else hidden_dropout_prob) serves both.
"""

import jax

from attn.encoders import heads
from attn.encoders.bert.checkpoint import linear
from attn.encoders.electra.model import Config

__all__ = ["HEAD"]

_CLASSES = heads.Classes(
    classifier="ElectraForSequenceClassification",
    prefix="electra.",
    module="transformers.models.electra.modeling_electra",
    base="ElectraModel",
    pretrained="ElectraPreTrainedModel",
)
_GELU = heads.activation("gelu")


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
    del encoder, cfg, mask_BxL, pooling
    return heads.first_token_dense(
        pool["dense"], h_BxLxD, act=_GELU, dropout=dropout, train=train, rng=rng
    )


HEAD = heads.Head(
    poolings=("cls",),
    init=_init,
    apply=_apply,
    classes=lambda cfg: _CLASSES,
    rules=lambda cfg, pooling: {
        **linear("classifier.dense", ("pool", "dense")),
        **heads.final_linear("classifier.out_proj"),
    },
    from_hf=heads.fixed_pooling,
    to_hf=lambda cfg, pooling: {},
)
