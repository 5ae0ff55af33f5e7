"""A sequence classifier that mean-pools its encoder's last hidden states over the real tokens:

    h = encoder(input_ids, attention_mask)            [B, L, D]
    logits = classifier(dropout(sum(h * mask) / sum(mask)))   [B, C]

what attn fine-tunes with model.pooling="mean", which no transformers class of these encoders
computes. Exported beside the weights, config.json's auto_map names it, and
AutoModelForSequenceClassification.from_pretrained(DIR, trust_remote_code=True) builds it. The
two imports below name the family's base model and pretrained class; the exporter writes the
family's own in their place. Needs torch and transformers, as any transformers model does.
"""

import inspect

import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
from transformers.models.bert.modeling_bert import BertModel as BaseModel
from transformers.models.bert.modeling_bert import BertPreTrainedModel as PretrainedBase


class MeanPooledForSequenceClassification(PretrainedBase):
    """The family's base model under its usual attribute (base_model_prefix, so the checkpoint's
    names are the family's), no pooler, then the masked mean, dropout (config.classifier_dropout)
    and the linear layer `classifier`."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        takes = inspect.signature(BaseModel.__init__).parameters
        extra = {"add_pooling_layer": False} if "add_pooling_layer" in takes else {}
        setattr(self, self.base_model_prefix, BaseModel(config, **extra))
        rate = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(0.0 if rate is None else rate)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs
    ):
        encoder = getattr(self, self.base_model_prefix)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, **kwargs}
        if token_type_ids is not None:  # DistilBERT's base model takes none
            inputs["token_type_ids"] = token_type_ids
        h = encoder(**inputs).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1))
        return SequenceClassifierOutput(loss=loss, logits=logits)


# pipeline("text-classification") looks a model's class name up in transformers' own list of
# sequence classifiers and logs an error (with the whole list) for any other, though it runs it:
# this class is one, so it joins the list, under a key that is no model type (the auto classes
# pair that list with model types, so they never see it).
MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.setdefault(
    "attn_mean_pooled", MeanPooledForSequenceClassification.__name__
)
