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

import jax
import jax.numpy as jnp

from attn.encoders import heads
from attn.encoders.bert import model
from attn.encoders.bert.checkpoint import linear
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


def _roberta(cfg: Config) -> bool:
    return cfg.model_type != "bert"


def _own_pooler(cfg: Config) -> bool:
    """Whether the head holds BERT's pooler itself (the checkpoint had none)."""
    return not _roberta(cfg) and not cfg.pooler


def _init(key: jax.Array, cfg: Config, pooling: str) -> dict:
    del pooling
    if _roberta(cfg) or _own_pooler(cfg):
        return {"dense": heads.dense_init(key, cfg.d_model, cfg.initializer_range)}
    return {}


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
    del mask_BxL, pooling
    if _roberta(cfg):
        return heads.first_token_dense(
            pool["dense"], h_BxLxD, act=jnp.tanh, dropout=dropout, train=train, rng=rng
        )
    pooler = pool["dense"] if _own_pooler(cfg) else encoder["pooler"]
    return model.pool({"pooler": pooler}, h_BxLxD)


def _rules(cfg: Config, pooling: str) -> dict:
    del pooling
    if _roberta(cfg):
        return {
            **linear("classifier.dense", ("pool", "dense")),
            **heads.final_linear("classifier.out_proj"),
        }
    own = linear("bert.pooler.dense", ("pool", "dense")) if _own_pooler(cfg) else {}
    return {**own, **heads.final_linear("classifier")}


def _encoder(cfg: Config, pooling: str) -> Config:
    """RobertaForSequenceClassification has no pooler; BERT's classifier reads its own (the
    head's when the checkpoint had none); a mean-pooled classifier reads none."""
    if _roberta(cfg) or pooling != "cls":
        return dataclasses.replace(cfg, pooler=False)
    return cfg


HEAD = heads.Head(
    poolings=("cls",),
    init=_init,
    apply=_apply,
    classes=_classes,
    rules=_rules,
    from_hf=heads.fixed_pooling,
    to_hf=lambda cfg, pooling: {},
    encoder=_encoder,
)
