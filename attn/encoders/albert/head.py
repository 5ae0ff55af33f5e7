"""ALBERT's sequence-classification head (AlbertForSequenceClassification):

    v = tanh(pooler(h[:, 0]))                 [B, D]

then Dropout (the class's classifier_dropout_prob; here the classifier's rate) and the final
linear layer `classifier` (`attn.head`). The pooler is AlbertModel's (`pooler`, a plain Linear):
the encoder's params hold it when the checkpoint has one; over one without it (the masked-LM
checkpoints) the head draws its own, stored back as albert.pooler.
"""

from attn.encoders import heads

__all__ = ["HEAD"]

_CLASSES = heads.Classes(
    classifier="AlbertForSequenceClassification",
    prefix="albert.",
    module="transformers.models.albert.modeling_albert",
    base="AlbertModel",
    pretrained="AlbertPreTrainedModel",
    no_pooler=True,
)

HEAD = heads.pooler_head(lambda cfg: _CLASSES, "albert.pooler")
