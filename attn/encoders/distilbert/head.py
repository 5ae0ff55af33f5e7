"""DistilBERT's sequence-classification head (DistilBertForSequenceClassification):

    v = ReLU(pre_classifier(h[:, 0]))         [B, D]

then Dropout and the final linear layer `classifier` (`attn.head`). No dropout comes before
pre_classifier; the class's one dropout rate (seq_classif_dropout) is the classifier's.
"""

import jax

from attn.encoders import heads

__all__ = ["HEAD"]

_CLASSES = heads.Classes(
    classifier="DistilBertForSequenceClassification",
    prefix="distilbert.",
    module="transformers.models.distilbert.modeling_distilbert",
    base="DistilBertModel",
    pretrained="DistilBertPreTrainedModel",
)

HEAD = heads.dense_head(
    lambda cfg: _CLASSES, "pre_classifier", "classifier", lambda cfg: jax.nn.relu
)
