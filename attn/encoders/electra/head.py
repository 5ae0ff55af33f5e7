"""ELECTRA's sequence-classification head (ElectraClassificationHead):

    v = GELU(dense(Dropout(h[:, 0])))         [B, D]    exact (erf) GELU, as transformers has it

then Dropout and the final linear layer `classifier.out_proj` (`attn.head`); the dense layer is
`classifier.dense`. Both dropouts take the classifier's rate, as the class's one rate
(classifier_dropout, else hidden_dropout_prob) serves both.
"""

from attn.encoders import heads

__all__ = ["HEAD"]

_CLASSES = heads.Classes(
    classifier="ElectraForSequenceClassification",
    prefix="electra.",
    module="transformers.models.electra.modeling_electra",
    base="ElectraModel",
    pretrained="ElectraPreTrainedModel",
)
_GELU = heads.activation("gelu")

HEAD = heads.dense_head(
    lambda cfg: _CLASSES,
    "classifier.dense",
    "classifier.out_proj",
    lambda cfg: _GELU,
    drops_input=True,
)
