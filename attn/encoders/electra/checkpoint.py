"""ELECTRA's Hugging Face checkpoints: config.json -> `model.Config`, and the rule that places each
stored tensor (names after the "electra." prefix of task models; X = embedding_size):

    embeddings.word_embeddings.weight [V, X]        embed.tokens            as stored
    embeddings.position_embeddings.weight [P, X]    embed.positions         as stored
    embeddings.token_type_embeddings.weight [T, X]  embed.types             as stored
    embeddings.LayerNorm.{weight, bias} [X]         embed.ln.{scale, bias}  as stored
    embeddings_project.{weight [D, X], bias [D]}    embed.project.{w [X, D] (transposed), b}
                                                    (only when X != D, as transformers has it)
    encoder.layer.N.*                               layer_N: BERT's blocks under BERT's names
                                                    (`attn.encoders.rules.BERT_LINEARS`)

Skipped and reported: the buffers embeddings.position_ids and embeddings.token_type_ids, and the
task heads discriminator_predictions.* (ElectraForPreTraining: the discriminator checkpoints),
generator_predictions.* and generator_lm_head.* (ElectraForMaskedLM: the generators), and
classifier.* (ElectraForSequenceClassification, whose head `head` reads for a classifier;
...ForTokenClassification).
"""

from collections.abc import Mapping
from typing import Any

from attn.encoders.electra.model import Config
from attn.encoders.fields import built, config_from, config_keys
from attn.encoders.hub import Rule
from attn.encoders.rules import BERT_LINEARS, BERT_NORMS, block, linear

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "PREFIXES", "from_hf", "rules", "skip", "to_hf"]

MODEL_TYPES = ("electra",)
# The architectures whose checkpoints hold this encoder (their heads skipped).
ARCHITECTURES = (
    "ElectraModel",
    "ElectraForPreTraining",
    "ElectraForMaskedLM",
    "ElectraForSequenceClassification",
    "ElectraForTokenClassification",
)
PREFIXES = ("electra.",)
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_HEADS = (
    "discriminator_predictions.",
    "generator_predictions.",
    "generator_lm_head.",
    "classifier.",
)


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
    if cfg.projected:
        out.update(linear("embeddings_project", ("embed", "project")))
    for i in range(cfg.num_layers):
        out.update(block(f"encoder.layer.{i}", (f"layer_{i}",), BERT_LINEARS, BERT_NORMS))
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
    "dropout": ("hidden_dropout_prob", 0.1),
    "attention_dropout": ("attention_probs_dropout_prob", 0.1),
    "initializer_range": ("initializer_range", 0.02),
}


def from_hf(hf: Mapping[str, Any], names: frozenset[str], where: str) -> Config:
    """config.json -> Config; CheckpointError for what this encoder does not compute (`names`,
    the stored tensors, is not needed: embedding_size says whether embeddings_project exists)."""
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
    pad = hf.get("pad_token_id")
    kw["pad_id"] = 0 if pad is None else pad
    return built(Config, where, **kw)


def to_hf(cfg: Config) -> dict:
    """config.json's keys of `cfg` (from_hf's inverse)."""
    return {**config_keys(cfg, _CONFIG_KEYS), "pad_token_id": cfg.pad_id}
