"""ALBERT's Hugging Face checkpoints: config.json -> `model.Config`, and the rule that places each
stored tensor (names after the "albert." prefix of task models; X = embedding_size, and G. =
encoder.albert_layer_groups.0.albert_layers.0., the one layer every depth runs):

    embeddings.word_embeddings.weight [V, X]        embed.tokens            as stored
    embeddings.position_embeddings.weight [P, X]    embed.positions         as stored
    embeddings.token_type_embeddings.weight [T, X]  embed.types             as stored
    embeddings.LayerNorm.{weight, bias} [X]         embed.ln.{scale, bias}  as stored
    encoder.embedding_hidden_mapping_in.{weight [D, X], bias [D]}
                                                    embed.project.{w [X, D] (transposed), b}
    G.attention.{query, key, value, dense}.{weight [D, D], bias [D]}
                                                    layer_0.mha.{q, k, v, o}.{w (transposed), b}
    G.attention.LayerNorm.*                         layer_0.ln_att
    G.ffn.{weight [F, D], bias [F]}                 layer_0.ff1.{w [D, F] (transposed), b}
    G.ffn_output.{weight [D, F], bias [D]}          layer_0.ff2.{w [F, D] (transposed), b}
    G.full_layer_layer_norm.*                       layer_0.ln_ff
    pooler.{weight [D, D], bias [D]}                pooler.{w (transposed), b}

Linear weights are stored [out, in] (`attn.encoders.rules`) and heads are contiguous column
blocks, as in BERT. attn reads one group of one layer (num_hidden_groups = inner_group_num = 1,
as every released ALBERT has it) and refuses others in one line. Skipped and reported: the
buffers embeddings.position_ids and embeddings.token_type_ids, and the task heads predictions.*
(AlbertForMaskedLM, AlbertForPreTraining), sop_classifier.* (AlbertForPreTraining), classifier.*
(...ForSequenceClassification, whose head `head` reads for a classifier; ...ForTokenClassification,
...ForMultipleChoice) and qa_outputs.* (...ForQuestionAnswering).
"""

from collections.abc import Mapping
from typing import Any

from attn.encoders.albert.model import Config, layer_keys
from attn.encoders.fields import built, config_from, config_keys
from attn.encoders.heads import ACTIVATIONS
from attn.encoders.hub import Rule
from attn.encoders.rules import block, linear

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "PREFIXES", "from_hf", "rules", "skip", "to_hf"]

MODEL_TYPES = ("albert",)
# The architectures whose checkpoints hold this encoder (their heads skipped).
ARCHITECTURES = (
    "AlbertModel",
    "AlbertForPreTraining",
    "AlbertForMaskedLM",
    "AlbertForSequenceClassification",
    "AlbertForTokenClassification",
    "AlbertForQuestionAnswering",
    "AlbertForMultipleChoice",
)
PREFIXES = ("albert.",)
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_HEADS = ("predictions.", "sop_classifier.", "classifier.", "qa_outputs.")


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
_LAYER = "encoder.albert_layer_groups.0.albert_layers.0"
_LINEAR = {  # under _LAYER: the weight transposed, the bias as stored
    "attention.query": ("mha", "q"),
    "attention.key": ("mha", "k"),
    "attention.value": ("mha", "v"),
    "attention.dense": ("mha", "o"),
    "ffn": ("ff1",),
    "ffn_output": ("ff2",),
}
_NORMS = {"attention.LayerNorm": "ln_att", "full_layer_layer_norm": "ln_ff"}


def rules(cfg: Config) -> dict[str, tuple[Rule, ...]]:
    """Stored name (no prefix) -> where it goes, for every parameter."""
    out = {name: (Rule(path),) for name, path in _EMBED.items()}
    out.update(linear("encoder.embedding_hidden_mapping_in", ("embed", "project")))
    for key in dict.fromkeys(layer_keys(cfg)):  # the shared layer (none at 0 layers)
        out.update(block(_LAYER, (key,), _LINEAR, _NORMS))
    if cfg.pooler:
        out.update(linear("pooler", ("pooler",)))
    return out


_CONFIG_KEYS = {  # Config field -> (config.json key, default when absent: None = required)
    "vocab_size": ("vocab_size", None),
    "d_model": ("hidden_size", None),
    "embedding_size": ("embedding_size", None),
    "num_layers": ("num_hidden_layers", None),
    "num_heads": ("num_attention_heads", None),
    "d_ff": ("intermediate_size", None),
    "max_positions": ("max_position_embeddings", None),
    "type_vocab_size": ("type_vocab_size", 2),
    "layer_norm_eps": ("layer_norm_eps", 1e-12),
    "dropout": ("hidden_dropout_prob", 0.0),
    "attention_dropout": ("attention_probs_dropout_prob", 0.0),
    "act": ("hidden_act", "gelu_new"),
    "initializer_range": ("initializer_range", 0.02),
}
# Layer sharing other than one group of one layer: config.json key -> the value attn computes.
_ONE_LAYER = {"num_hidden_groups": 1, "inner_group_num": 1}


def from_hf(hf: Mapping[str, Any], names: frozenset[str], where: str) -> Config:
    """config.json -> Config; CheckpointError for what this encoder does not compute. `names`:
    the stored tensors (prefixes stripped): a checkpoint without pooler.* has no pooler."""
    faults = []
    act = hf.get("hidden_act", "gelu_new")
    if act not in ACTIVATIONS:
        faults.append(f"hidden_act {act!r} (one of {', '.join(ACTIVATIONS)})")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        faults.append(
            f"position_embedding_type {hf['position_embedding_type']!r} (only 'absolute')"
        )
    for key, wanted in _ONE_LAYER.items():
        if hf.get(key, wanted) != wanted:
            faults.append(f"{key} {hf[key]!r} (only 1: one layer shared by every depth)")
    kw = config_from(hf, _CONFIG_KEYS, where, faults)
    pad = hf.get("pad_token_id")
    kw["pad_id"] = 0 if pad is None else pad
    kw["pooler"] = any(n.startswith("pooler.") for n in names)
    return built(Config, where, **kw)


def to_hf(cfg: Config) -> dict:
    """config.json's keys of `cfg` (from_hf's inverse; the pooler is its tensors')."""
    return {**config_keys(cfg, _CONFIG_KEYS), **_ONE_LAYER, "pad_token_id": cfg.pad_id}
