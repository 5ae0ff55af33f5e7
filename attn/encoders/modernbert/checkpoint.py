"""ModernBERT's Hugging Face checkpoints: config.json -> `model.Config`, and the rule that places
each stored tensor (names after the "model." prefix of task models):

    embeddings.tok_embeddings.weight [V, D]   embed.tokens              as stored
    embeddings.norm.weight [D]                embed.ln.scale            as stored
    layers.N.attn_norm.weight [D]             layer_N.ln_att.scale      (N > 0: layer 0 has none)
    layers.N.attn.Wqkv.weight [3D, D]         layer_N.mha.{q, k, v}.w   rows 0:D, D:2D, 2D:3D,
                                                                        each transposed
    layers.N.attn.Wo.weight [D, D]            layer_N.mha.o.w           transposed
    layers.N.mlp_norm.weight [D]              layer_N.ln_ff.scale       as stored
    layers.N.mlp.Wi.weight [2F, D]            layer_N.ff_in.w, ff_gate.w  rows 0:F (GELU's input)
                                                                        and F:2F (the gate),
                                                                        each transposed
    layers.N.mlp.Wo.weight [D, F]             layer_N.ff_out.w          transposed
    final_norm.weight [D]                     final_ln.scale            as stored

Linear weights are stored [out, in] (PyTorch) and applied here as x @ w with w [in, out]. Within
each of q, k and v, head h is the block of columns h*D/H:(h+1)*D/H, as Hugging Face's
``view(B, L, 3, H, D/H)`` splits Wqkv's output. Skipped and reported: the task heads head.*
(dense and LayerNorm under the classifier and the masked-LM decoder), decoder.* and
classifier.*; a sequence classifier's head.* and classifier.* are its head's (`head`).
"""

from collections.abc import Mapping
from typing import Any

from attn.encoders.fields import built, config_from, config_keys
from attn.encoders.heads import ACTIVATIONS
from attn.encoders.hub import Rule
from attn.encoders.modernbert.model import Config

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "PREFIXES", "from_hf", "rules", "skip", "to_hf"]

MODEL_TYPES = ("modernbert",)
ARCHITECTURES = (
    "ModernBertModel",
    "ModernBertForMaskedLM",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertForQuestionAnswering",
    "ModernBertForMultipleChoice",
)
PREFIXES = ("model.",)
_HEADS = ("head.", "decoder.", "classifier.")


def skip(name: str) -> bool:
    """Task heads: stored, no part of the encoder."""
    return name.startswith(_HEADS)


def _rows(path: tuple[str, ...], parts: tuple[str, ...], width: int) -> tuple[Rule, ...]:
    """A fused [len(parts) * width, in] linear weight -> one transposed param per row block."""
    return tuple(
        Rule((*path, part, "w"), transpose=True, rows=(n * width, (n + 1) * width))
        for n, part in enumerate(parts)
    )


def rules(cfg: Config) -> dict[str, tuple[Rule, ...]]:
    """Stored name (no prefix) -> where it goes, for every parameter."""
    d, f = cfg.d_model, cfg.d_ff
    out = {
        "embeddings.tok_embeddings.weight": (Rule(("embed", "tokens")),),
        "embeddings.norm.weight": (Rule(("embed", "ln", "scale")),),
        "final_norm.weight": (Rule(("final_ln", "scale")),),
    }
    for i in range(cfg.num_layers):
        at, p = f"layers.{i}.", f"layer_{i}"
        if i > 0:
            out[f"{at}attn_norm.weight"] = (Rule((p, "ln_att", "scale")),)
        out[f"{at}attn.Wqkv.weight"] = _rows((p, "mha"), ("q", "k", "v"), d)
        out[f"{at}attn.Wo.weight"] = (Rule((p, "mha", "o", "w"), transpose=True),)
        out[f"{at}mlp_norm.weight"] = (Rule((p, "ln_ff", "scale")),)
        out[f"{at}mlp.Wi.weight"] = _rows((p,), ("ff_in", "ff_gate"), f)
        out[f"{at}mlp.Wo.weight"] = (Rule((p, "ff_out", "w"), transpose=True),)
    return out


_CONFIG_KEYS = {  # Config field -> (config.json key, default when absent: None = required)
    "vocab_size": ("vocab_size", None),
    "d_model": ("hidden_size", None),
    "num_layers": ("num_hidden_layers", None),
    "num_heads": ("num_attention_heads", None),
    "d_ff": ("intermediate_size", None),
    "max_positions": ("max_position_embeddings", 8192),
    "global_every": ("global_attn_every_n_layers", 3),
    "local_window": ("local_attention", 128),
    "global_theta": ("global_rope_theta", 160000.0),
    "norm_eps": ("norm_eps", 1e-5),
    "embedding_dropout": ("embedding_dropout", 0.0),
    "dropout": ("mlp_dropout", 0.0),
    "attention_dropout": ("attention_dropout", 0.0),
    "pad_id": ("pad_token_id", 50283),
    "initializer_range": ("initializer_range", 0.02),
}
# Options this encoder does not compute: config.json key -> the value it computes.
_FIXED = {
    "hidden_activation": "gelu",
    "attention_bias": False,
    "mlp_bias": False,
    "norm_bias": False,
}


def from_hf(hf: Mapping[str, Any], names: frozenset[str], where: str) -> Config:
    """config.json -> Config; CheckpointError in one line for what this encoder does not
    compute: another activation than exact GELU, biases in the attention, feed-forward or
    LayerNorms, scaled rotary positions (rope_scaling)."""
    del names
    faults = []
    for key, wanted in _FIXED.items():
        if key in hf and hf[key] != wanted:
            why = "only 'gelu', the exact erf form" if key == "hidden_activation" else "no biases"
            faults.append(f"{key} {hf[key]!r} ({why})")
    scaling = hf.get("rope_scaling")
    if scaling is not None and (
        not isinstance(scaling, dict)
        or scaling.get("rope_type", scaling.get("type")) not in (None, "default")
    ):
        faults.append(f"rope_scaling {scaling!r} (only plain rotary positions)")
    act = hf.get("classifier_activation", "gelu")
    if act not in ACTIVATIONS:
        faults.append(f"classifier_activation {act!r} (one of {', '.join(ACTIVATIONS)})")
    kw = config_from(hf, _CONFIG_KEYS, where, faults)
    kw["classifier_bias"] = hf.get("classifier_bias", False)
    kw["classifier_act"] = act
    local_theta = hf.get("local_rope_theta", 10000.0)
    kw["local_theta"] = kw["global_theta"] if local_theta is None else local_theta
    return built(Config, where, **kw)


def to_hf(cfg: Config) -> dict:
    """config.json's keys of `cfg` (from_hf's inverse), the fixed options included."""
    return {
        **config_keys(cfg, _CONFIG_KEYS),
        **_FIXED,
        "local_rope_theta": cfg.local_theta,
        "classifier_bias": cfg.classifier_bias,
        "classifier_activation": cfg.classifier_act,
    }
