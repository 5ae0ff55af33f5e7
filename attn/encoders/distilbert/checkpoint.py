"""DistilBERT's Hugging Face checkpoints: config.json -> `model.Config`, and the rule that places
each stored tensor (names after the "distilbert." prefix of task models):

    embeddings.word_embeddings.weight [V, D]        embed.tokens            as stored
    embeddings.position_embeddings.weight [P, D]    embed.positions         as stored
    embeddings.LayerNorm.{weight, bias} [D]         embed.ln.{scale, bias}  as stored
    transformer.layer.N.attention.{q_lin, k_lin, v_lin, out_lin}.{weight [D, D], bias [D]}
                                                    layer_N.mha.{q, k, v, o}.{w (transposed), b}
    transformer.layer.N.sa_layer_norm.*             layer_N.ln_att
    transformer.layer.N.ffn.lin1.{weight [F, D], bias [F]}
                                                    layer_N.ff1.{w [D, F] (transposed), b}
    transformer.layer.N.ffn.lin2.{weight [D, F], bias [D]}
                                                    layer_N.ff2.{w [F, D] (transposed), b}
    transformer.layer.N.output_layer_norm.*         layer_N.ln_ff

Linear weights are stored [out, in] (`attn.encoders.rules`) and heads are contiguous column
blocks, as in BERT. Skipped and reported: the buffer embeddings.position_ids, and
the task heads vocab_transform.*, vocab_layer_norm.*, vocab_projector.* (DistilBertForMaskedLM),
pre_classifier.* and classifier.* (DistilBertForSequenceClassification; classifier.* also
DistilBertForTokenClassification's; a sequence classifier's are its head's, `head`).
"""

from collections.abc import Mapping
from typing import Any

from attn.encoders.distilbert.model import Config
from attn.encoders.fields import built, config_from, config_keys
from attn.encoders.hub import Rule
from attn.encoders.rules import block

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "PREFIXES", "from_hf", "rules", "skip", "to_hf"]

MODEL_TYPES = ("distilbert",)
# The architectures whose checkpoints hold this encoder (their heads skipped).
ARCHITECTURES = (
    "DistilBertModel",
    "DistilBertForMaskedLM",
    "DistilBertForSequenceClassification",
    "DistilBertForTokenClassification",
)
PREFIXES = ("distilbert.",)
_BUFFERS = ("embeddings.position_ids",)
_HEADS = (
    "vocab_transform.",
    "vocab_layer_norm.",
    "vocab_projector.",
    "pre_classifier.",
    "classifier.",
)


def skip(name: str) -> bool:
    """Buffers and task heads: stored, no part of the encoder."""
    return name in _BUFFERS or name.startswith(_HEADS)


_EMBED = {
    "embeddings.word_embeddings.weight": ("embed", "tokens"),
    "embeddings.position_embeddings.weight": ("embed", "positions"),
    "embeddings.LayerNorm.weight": ("embed", "ln", "scale"),
    "embeddings.LayerNorm.bias": ("embed", "ln", "bias"),
}
_LINEAR = {  # under transformer.layer.N.: the weight transposed, the bias as stored
    "attention.q_lin": ("mha", "q"),
    "attention.k_lin": ("mha", "k"),
    "attention.v_lin": ("mha", "v"),
    "attention.out_lin": ("mha", "o"),
    "ffn.lin1": ("ff1",),
    "ffn.lin2": ("ff2",),
}
_NORMS = {"sa_layer_norm": "ln_att", "output_layer_norm": "ln_ff"}


def rules(cfg: Config) -> dict[str, tuple[Rule, ...]]:
    """Stored name (no prefix) -> where it goes, for every parameter."""
    out = {name: (Rule(path),) for name, path in _EMBED.items()}
    for i in range(cfg.num_layers):
        out.update(block(f"transformer.layer.{i}", (f"layer_{i}",), _LINEAR, _NORMS))
    return out


_CONFIG_KEYS = {  # Config field -> (config.json key, default when absent: None = required)
    "vocab_size": ("vocab_size", None),
    "d_model": ("dim", None),
    "num_layers": ("n_layers", None),
    "num_heads": ("n_heads", None),
    "d_ff": ("hidden_dim", None),
    "max_positions": ("max_position_embeddings", None),
    "dropout": ("dropout", 0.1),
    "attention_dropout": ("attention_dropout", 0.1),
    "initializer_range": ("initializer_range", 0.02),
}


def from_hf(hf: Mapping[str, Any], names: frozenset[str], where: str) -> Config:
    """config.json -> Config; CheckpointError for what this encoder does not compute (`names`,
    the stored tensors, is not needed: every DistilBERT has the same tensors)."""
    faults = []
    if hf.get("activation", "gelu") != "gelu":
        faults.append(f"activation {hf['activation']!r} (only 'gelu', the exact erf form)")
    if hf.get("sinusoidal_pos_embds", False):
        # transformers keeps that table fixed in training; attn would train it like a learned one.
        faults.append(
            f"sinusoidal_pos_embds {hf['sinusoidal_pos_embds']!r} (only learned positions, false)"
        )
    kw = config_from(hf, _CONFIG_KEYS, where, faults)
    pad = hf.get("pad_token_id")
    kw["pad_id"] = 0 if pad is None else pad
    return built(Config, where, **kw)


def to_hf(cfg: Config) -> dict:
    """config.json's keys of `cfg` (from_hf's inverse)."""
    return {**config_keys(cfg, _CONFIG_KEYS), "pad_token_id": cfg.pad_id}
