"""DeBERTa-v2's sequence-classification head (DebertaV2ForSequenceClassification: its
ContextPooler, then dropout and `classifier`):

    v = act(pooler.dense(h[:, 0]))            [B, D]    act: pooler_hidden_act (GELU)

then Dropout and the final linear layer `classifier` (`attn.head`). pooler.* and classifier.* sit
at the top level, beside the encoder's deberta.*. The ContextPooler's own dropout
(pooler_dropout) is left out: 0 in the released configs.
"""

from collections.abc import Mapping
from typing import Any

from attn.encoders import heads
from attn.encoders.hub import CheckpointError

__all__ = ["HEAD"]

_CLASSES = heads.Classes(
    classifier="DebertaV2ForSequenceClassification",
    prefix="deberta.",
    module="transformers.models.deberta_v2.modeling_deberta_v2",
    base="DebertaV2Model",
    pretrained="DebertaV2PreTrainedModel",
)


def _from_hf(hf: Mapping[str, Any], where: str) -> str:
    """ "cls"; CheckpointError when the pooler is not D -> D (pooler_hidden_size)."""
    d = hf.get("hidden_size")
    if hf.get("pooler_hidden_size", d) != d:
        raise CheckpointError(
            f"{where}: config.json is not supported: pooler_hidden_size "
            f"{hf['pooler_hidden_size']!r} (only hidden_size, {d})"
        )
    return "cls"


HEAD = heads.dense_head(
    lambda cfg: _CLASSES,
    "pooler.dense",
    "classifier",
    lambda cfg: heads.activation(cfg.pooler_act),
    from_hf=_from_hf,
    to_hf=lambda cfg, pooling: {"pooler_hidden_size": cfg.d_model, "pooler_dropout": 0.0},
)
