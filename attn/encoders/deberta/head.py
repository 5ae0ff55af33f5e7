"""DeBERTa-v2's sequence-classification head (DebertaV2ForSequenceClassification: its
ContextPooler, then dropout and `classifier`):

    v = act(pooler.dense(h[:, 0]))            [B, D]    act: pooler_hidden_act (GELU)

then Dropout and the final linear layer `classifier` (`attn.head`). pooler.* and classifier.* sit
at the top level, beside the encoder's deberta.*. The ContextPooler's own dropout
(pooler_dropout) is left out: 0 in the released configs.
"""

import jax

from attn.encoders import heads
from attn.encoders.bert.checkpoint import linear
from attn.encoders.deberta.model import Config
from attn.encoders.hub import CheckpointError

__all__ = ["HEAD"]

_CLASSES = heads.Classes(
    classifier="DebertaV2ForSequenceClassification",
    prefix="deberta.",
    module="transformers.models.deberta_v2.modeling_deberta_v2",
    base="DebertaV2Model",
    pretrained="DebertaV2PreTrainedModel",
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
    del encoder, mask_BxL, pooling, dropout
    act = heads.activation(cfg.pooler_act)
    return heads.first_token_dense(
        pool["dense"], h_BxLxD, act=act, dropout=0.0, train=train, rng=rng
    )


def _from_hf(hf: dict, where: str) -> str:
    """ "cls"; CheckpointError when the pooler is not D -> D (pooler_hidden_size)."""
    d = hf.get("hidden_size")
    if hf.get("pooler_hidden_size", d) != d:
        raise CheckpointError(
            f"{where}: config.json is not supported: pooler_hidden_size "
            f"{hf['pooler_hidden_size']!r} (only hidden_size, {d})"
        )
    return "cls"


HEAD = heads.Head(
    poolings=("cls",),
    init=_init,
    apply=_apply,
    classes=lambda cfg: _CLASSES,
    rules=lambda cfg, pooling: {
        **linear("pooler.dense", ("pool", "dense")),
        **heads.final_linear("classifier"),
    },
    from_hf=_from_hf,
    to_hf=lambda cfg, pooling: {"pooler_hidden_size": cfg.d_model, "pooler_dropout": 0.0},
)
