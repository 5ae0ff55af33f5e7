"""The BERT family's Hugging Face checkpoints: config.json -> `model.Config`, and the rule that
places each stored tensor (names after the "bert." / "roberta." / "xlm-roberta." prefix of task
models; legacy LayerNorm "gamma" / "beta" read as "weight" / "bias"):

    embeddings.word_embeddings.weight [V, D]        embed.tokens            as stored
    embeddings.position_embeddings.weight [P, D]    embed.positions         as stored
    embeddings.token_type_embeddings.weight [T, D]  embed.types             as stored
    embeddings.LayerNorm.{weight, bias} [D]         embed.ln.{scale, bias}  as stored
    encoder.layer.N.attention.self.{query, key, value}.weight [D, D]
                                                    layer_N.mha.{q, k, v}.w transposed
    encoder.layer.N.attention.self.{query, key, value}.bias [D]
                                                    layer_N.mha.{q, k, v}.b as stored
    encoder.layer.N.attention.output.dense.{weight [D, D], bias}
                                                    layer_N.mha.o.{w (transposed), b}
    encoder.layer.N.attention.output.LayerNorm.*    layer_N.ln_att
    encoder.layer.N.intermediate.dense.{weight [F, D], bias [F]}
                                                    layer_N.ff1.{w [D, F] (transposed), b}
    encoder.layer.N.output.dense.{weight [D, F], bias [D]}
                                                    layer_N.ff2.{w [F, D] (transposed), b}
    encoder.layer.N.output.LayerNorm.*              layer_N.ln_ff
    pooler.dense.{weight [D, D], bias}              pooler.{w (transposed), b}

Linear weights are stored [out, in] (PyTorch) and applied here as x @ w with w [in, out]. Heads
need no reshape: both split a projection's D outputs into H contiguous blocks of D / H, head h
taking columns h*D/H:(h+1)*D/H (`attn.multihead`), as `view(B, L, H, D/H)` does.
Skipped and reported: the buffers embeddings.position_ids and embeddings.token_type_ids, and the
task heads cls.* (BertForPreTraining, BertForMaskedLM), lm_head.* (RobertaForMaskedLM) and
classifier.* (...ForSequenceClassification, whose head `head` reads for a classifier).
"""

from collections.abc import Mapping
from typing import Any

from attn.encoders.bert.model import Config
from attn.encoders.fields import built, config_from, config_keys
from attn.encoders.hub import Rule
from attn.encoders.rules import BERT_LINEARS, BERT_NORMS, block, linear

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "PREFIXES", "from_hf", "rules", "skip", "to_hf"]

# model_type -> the architectures whose checkpoints hold this encoder (their heads skipped).
_ARCHITECTURES = {
    "bert": (
        "BertModel",
        "BertForPreTraining",
        "BertForMaskedLM",
        "BertForNextSentencePrediction",
        "BertForSequenceClassification",
        "BertForTokenClassification",
    ),
    "roberta": (
        "RobertaModel",
        "RobertaForMaskedLM",
        "RobertaForSequenceClassification",
        "RobertaForTokenClassification",
    ),
    "xlm-roberta": (
        "XLMRobertaModel",
        "XLMRobertaForMaskedLM",
        "XLMRobertaForSequenceClassification",
        "XLMRobertaForTokenClassification",
    ),
}
MODEL_TYPES = tuple(_ARCHITECTURES)
ARCHITECTURES = tuple(a for archs in _ARCHITECTURES.values() for a in archs)
PREFIXES = ("bert.", "roberta.")  # XLM-R's task models keep the encoder under "roberta." too
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_HEADS = ("cls.", "lm_head.", "classifier.")


def skip(name: str) -> bool:
    """Buffers and task heads: stored, no part of the encoder."""
    return name in _BUFFERS or name.startswith(_HEADS)


_EMBED = {
    "embeddings.word_embeddings.weight": ("embed", "tokens"),
    "embeddings.position_embeddings.weight": ("embed", "positions"),
    "embeddings.token_type_embeddings.weight": ("embed", "types"),
    "embeddings.LayerNorm.weight": ("embed", "ln", "scale"),
    "embeddings.LayerNorm.bias": ("embed", "ln", "bias"),
}


def rules(cfg: Config) -> dict[str, tuple[Rule, ...]]:
    """Stored name (no prefix) -> where it goes, for every parameter."""
    out = {name: (Rule(path),) for name, path in _EMBED.items()}
    for i in range(cfg.num_layers):
        out.update(block(f"encoder.layer.{i}", (f"layer_{i}",), BERT_LINEARS, BERT_NORMS))
    if cfg.pooler:
        out.update(linear("pooler.dense", ("pooler",)))
    return out


_CONFIG_KEYS = {  # Config field -> (config.json key, default when absent: None = required)
    "vocab_size": ("vocab_size", None),
    "d_model": ("hidden_size", None),
    "num_layers": ("num_hidden_layers", None),
    "num_heads": ("num_attention_heads", None),
    "d_ff": ("intermediate_size", None),
    "max_positions": ("max_position_embeddings", None),
    "type_vocab_size": ("type_vocab_size", 2),
    "layer_norm_eps": ("layer_norm_eps", 1e-12),
    "dropout": ("hidden_dropout_prob", 0.1),
    "attention_dropout": ("attention_probs_dropout_prob", 0.1),
    "initializer_range": ("initializer_range", 0.02),
}


def from_hf(hf: Mapping[str, Any], names: frozenset[str], where: str) -> Config:
    """config.json -> Config; CheckpointError for what this encoder does not compute. `names`:
    the stored tensors (prefixes stripped): a checkpoint without pooler.* has no pooler."""
    faults = []
    if hf.get("hidden_act", "gelu") != "gelu":
        faults.append(f"hidden_act {hf['hidden_act']!r} (only 'gelu', the exact erf form)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        faults.append(
            f"position_embedding_type {hf['position_embedding_type']!r} (only 'absolute')"
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        faults.append("a decoder (is_decoder / add_cross_attention; only encoders)")
    kw = config_from(hf, _CONFIG_KEYS, where, faults)
    bert = hf["model_type"] == "bert"
    pad = hf.get("pad_token_id")
    kw["pad_id"] = (0 if bert else 1) if pad is None else pad
    if not bert:  # RoBERTa's positions count real tokens from pad_id + 1
        kw["position_offset"] = kw["pad_id"] + 1
    kw["pooler"] = any(n.startswith("pooler.") for n in names)
    kw["model_type"] = hf["model_type"]
    return built(Config, where, **kw)


def to_hf(cfg: Config) -> dict:
    """config.json's keys of `cfg` (from_hf's inverse; the pooler is its tensors')."""
    return {
        **config_keys(cfg, _CONFIG_KEYS),
        "pad_token_id": cfg.pad_id,
        "model_type": cfg.model_type,
    }
