"""The BERT family's sequence-classification heads, by model type:

    bert                  v = tanh(pooler(h[:, 0]))             BertForSequenceClassification
    roberta, xlm-roberta  v = tanh(dense(Dropout(h[:, 0])))     RobertaClassificationHead

then Dropout and the final linear layer (`attn.head`): `classifier` (BERT), `classifier.out_proj`
(RoBERTa). BERT's pooler is part of BertModel: the encoder's params hold it when the checkpoint
has one (`pooler.dense`), so the head has no params of its own; a checkpoint without one gets a
fresh pooler here, stored back as bert.pooler.dense. RoBERTa's dense layer is
`classifier.dense`; its classifier holds no pooler, even when the checkpoint had one.
"""

import dataclasses

import jax.numpy as jnp

from attn.encoders import heads
from attn.encoders.bert.model import Config

__all__ = ["HEAD"]

_MODULES = {
    "bert": ("bert", "Bert", "bert."),
    "roberta": ("roberta", "Roberta", "roberta."),
    "xlm-roberta": ("xlm_roberta", "XLMRoberta", "roberta."),
}


def _classes(cfg: Config) -> heads.Classes:
    module, name, prefix = _MODULES[cfg.model_type]
    return heads.Classes(
        classifier=f"{name}ForSequenceClassification",
        prefix=prefix,
        module=f"transformers.models.{module}.modeling_{module}",
        base=f"{name}Model",
        pretrained=f"{name}PreTrainedModel",
        no_pooler=True,
    )


_BERT = heads.pooler_head(_classes, "bert.pooler.dense")
# RobertaForSequenceClassification holds no pooler, even when the checkpoint had one.
_ROBERTA = heads.dense_head(
    _classes,
    "classifier.dense",
    "classifier.out_proj",
    lambda cfg: jnp.tanh,
    drops_input=True,
    encoder=lambda cfg, pooling: dataclasses.replace(cfg, pooler=False),
)


def _head(cfg: Config) -> heads.Head:
    return _BERT if cfg.model_type == "bert" else _ROBERTA


HEAD = heads.Head(
    poolings=("cls",),
    init=lambda key, cfg, pooling: _head(cfg).init(key, cfg, pooling),
    apply=lambda pool, params, cfg, *a, **kw: _head(cfg).apply(pool, params, cfg, *a, **kw),
    classes=_classes,
    rules=lambda cfg, pooling: _head(cfg).rules(cfg, pooling),
    from_hf=heads.fixed_pooling,
    to_hf=lambda cfg, pooling: {},
    encoder=lambda cfg, pooling: _head(cfg).encoder(cfg, pooling),
)
