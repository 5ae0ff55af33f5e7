"""The DeBERTa-v2 family's Hugging Face checkpoints (model_type "deberta-v2": DeBERTa-v2 and -v3):
config.json -> `model.Config`, and the rule that places each stored tensor (names after the
"deberta." prefix of task models):

    embeddings.word_embeddings.weight [V, D]        embed.tokens            as stored
    embeddings.position_embeddings.weight [P, D]    embed.positions         (position_biased_input)
    embeddings.token_type_embeddings.weight [T, D]  embed.types             (type_vocab_size > 0)
    embeddings.LayerNorm.{weight, bias}             embed.ln.{scale, bias}
    encoder.rel_embeddings.weight [2S, D]           embed.relative          as stored
    encoder.LayerNorm.{weight, bias}                embed.relative_ln       (norm_rel_ebd
                                                                             "layer_norm")
    encoder.layer.N.attention.self.{query, key, value}_proj.{weight [D, D], bias}
                                                    layer_N.mha.{q, k, v}.{w (transposed), b}
    encoder.layer.N.attention.self.pos_key_proj.*   layer_N.pos_k           (c2p, not shared)
    encoder.layer.N.attention.self.pos_query_proj.* layer_N.pos_q           (p2c, not shared)
    encoder.layer.N.attention.output.dense.*        layer_N.mha.o
    encoder.layer.N.attention.output.LayerNorm.*    layer_N.ln_att
    encoder.layer.N.intermediate.dense.*            layer_N.ff1
    encoder.layer.N.output.dense.*                  layer_N.ff2
    encoder.layer.N.output.LayerNorm.*              layer_N.ln_ff

Linear weights are stored [out, in] (PyTorch) and applied here as x @ w with w [in, out]; heads
are contiguous column blocks of each projection, as `transpose_for_scores` splits them.
Skipped and reported: the buffer embeddings.position_ids and the task heads: pooler.* and
classifier.* (ForSequenceClassification, ForMultipleChoice: ContextPooler dense + activation on
the first token, then a linear classifier), classifier.* (ForTokenClassification), qa_outputs.*
(ForQuestionAnswering), cls.* / lm_predictions.* / mask_predictions.* (ForMaskedLM). A
sequence classifier's pooler.* and classifier.* are its head's (`head`).
"""

from collections.abc import Mapping
from typing import Any

from attn.encoders.deberta import score
from attn.encoders.deberta.model import NORM_REL_EBD, Config
from attn.encoders.fields import built, config_from, config_keys
from attn.encoders.heads import ACTIVATIONS
from attn.encoders.hub import Rule
from attn.encoders.rules import block, layer_norm, linear

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "PREFIXES", "from_hf", "rules", "skip", "to_hf"]

MODEL_TYPES = ("deberta-v2",)
ARCHITECTURES = (
    "DebertaV2Model",
    "DebertaV2ForMaskedLM",
    "DebertaV2ForSequenceClassification",
    "DebertaV2ForTokenClassification",
    "DebertaV2ForQuestionAnswering",
    "DebertaV2ForMultipleChoice",
)
PREFIXES = ("deberta.",)
_BUFFERS = ("embeddings.position_ids",)
_HEADS = ("pooler.", "classifier.", "qa_outputs.", "cls.", "lm_predictions.", "mask_predictions.")


def skip(name: str) -> bool:
    """Buffers and task heads: stored, no part of the encoder."""
    return name in _BUFFERS or name.startswith(_HEADS)


_LINEAR = {  # under encoder.layer.N.: the weight transposed, the bias as stored
    "attention.self.query_proj": ("mha", "q"),
    "attention.self.key_proj": ("mha", "k"),
    "attention.self.value_proj": ("mha", "v"),
    "attention.output.dense": ("mha", "o"),
    "intermediate.dense": ("ff1",),
    "output.dense": ("ff2",),
}
_NORMS = {"attention.output.LayerNorm": "ln_att", "output.LayerNorm": "ln_ff"}


def rules(cfg: Config) -> dict[str, tuple[Rule, ...]]:
    """Stored name (no prefix) -> where it goes, for every parameter."""
    out = {
        "embeddings.word_embeddings.weight": (Rule(("embed", "tokens")),),
        "encoder.rel_embeddings.weight": (Rule(("embed", "relative")),),
    }
    if cfg.position_biased_input:
        out["embeddings.position_embeddings.weight"] = (Rule(("embed", "positions")),)
    if cfg.type_vocab_size > 0:
        out["embeddings.token_type_embeddings.weight"] = (Rule(("embed", "types")),)
    out.update(layer_norm("embeddings.LayerNorm", ("embed", "ln")))
    if cfg.norm_rel_ebd == "layer_norm":
        out.update(layer_norm("encoder.LayerNorm", ("embed", "relative_ln")))
    for i in range(cfg.num_layers):
        layer = f"encoder.layer.{i}"
        out.update(block(layer, (f"layer_{i}",), _LINEAR, _NORMS))
        if not cfg.share_att_key:
            if "c2p" in cfg.pos_att_type:
                out.update(linear(f"{layer}.attention.self.pos_key_proj", (f"layer_{i}", "pos_k")))
            if "p2c" in cfg.pos_att_type:
                out.update(
                    linear(f"{layer}.attention.self.pos_query_proj", (f"layer_{i}", "pos_q"))
                )
    return out


_CONFIG_KEYS = {  # Config field -> (config.json key, default when absent: None = required)
    "vocab_size": ("vocab_size", None),
    "d_model": ("hidden_size", None),
    "num_layers": ("num_hidden_layers", None),
    "num_heads": ("num_attention_heads", None),
    "d_ff": ("intermediate_size", None),
    "max_positions": ("max_position_embeddings", None),
    "type_vocab_size": ("type_vocab_size", 0),
    "layer_norm_eps": ("layer_norm_eps", 1e-7),
    "dropout": ("hidden_dropout_prob", 0.1),
    "attention_dropout": ("attention_probs_dropout_prob", 0.1),
    "pad_id": ("pad_token_id", 0),
    "position_buckets": ("position_buckets", -1),
    "max_relative_positions": ("max_relative_positions", -1),
    "share_att_key": ("share_att_key", False),
    "position_biased_input": ("position_biased_input", True),
    "initializer_range": ("initializer_range", 0.02),
}


def _pos_att_type(value: Any) -> tuple[tuple[str, ...], list[str]]:
    """config.json's pos_att_type (a list, or "p2c|c2p" as older configs write it) -> (the
    terms, the faults)."""
    if value is None:
        return (), []
    if isinstance(value, str):
        value = [t.strip() for t in value.lower().split("|") if t.strip()]
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        return (), [f"pos_att_type {value!r} (a list of c2p and p2c)"]
    other = [t for t in value if t not in score.TERMS]
    if other:
        return (), [f"pos_att_type {other[0]!r} (only c2p and p2c)"]
    return tuple(value), []


def _norm_rel_ebd(value: Any) -> tuple[str, list[str]]:
    """config.json's norm_rel_ebd ("layer_norm", "none", or "|"-joined) -> (one of NORM_REL_EBD,
    the faults)."""
    parts = [p.strip() for p in value.lower().split("|")] if isinstance(value, str) else None
    if parts is None or not set(parts) <= set(NORM_REL_EBD):
        return "none", [f"norm_rel_ebd {value!r} (only 'layer_norm' or 'none')"]
    return ("layer_norm" if "layer_norm" in parts else "none"), []


def from_hf(hf: Mapping[str, Any], names: frozenset[str], where: str) -> Config:
    """config.json -> Config; CheckpointError naming every option this encoder does not compute
    (transformers' defaults for absent keys)."""
    del names
    faults = []
    if hf.get("hidden_act", "gelu") != "gelu":
        faults.append(f"hidden_act {hf['hidden_act']!r} (only 'gelu', the exact erf form)")
    if not hf.get("relative_attention", False):
        faults.append(
            f"relative_attention {hf.get('relative_attention')!r} (only true: attn computes "
            "DeBERTa's disentangled attention)"
        )
    if hf.get("conv_kernel_size", 0):
        faults.append(f"conv_kernel_size {hf['conv_kernel_size']!r} (no convolution layer, only 0)")
    d, heads = hf.get("hidden_size"), hf.get("num_attention_heads")
    if hf.get("embedding_size", d) != d:
        faults.append(f"embedding_size {hf['embedding_size']!r} (only hidden_size, {d})")
    if isinstance(d, int) and isinstance(heads, int) and heads > 0:
        if hf.get("attention_head_size", d // heads) != d // heads:
            faults.append(
                f"attention_head_size {hf['attention_head_size']!r} (only hidden_size / "
                f"num_attention_heads, {d // heads})"
            )
    terms, wrong = _pos_att_type(hf.get("pos_att_type"))
    faults += wrong
    norm, wrong = _norm_rel_ebd(hf.get("norm_rel_ebd", "none"))
    faults += wrong
    act = hf.get("pooler_hidden_act", "gelu")
    if act not in ACTIVATIONS:
        faults.append(f"pooler_hidden_act {act!r} (one of {', '.join(ACTIVATIONS)})")
    kw = config_from(hf, _CONFIG_KEYS, where, faults)
    if kw["pad_id"] is None:
        kw["pad_id"] = 0
    return built(Config, where, **kw, pos_att_type=terms, norm_rel_ebd=norm, pooler_act=act)


def to_hf(cfg: Config) -> dict:
    """config.json's keys of `cfg` (from_hf's inverse)."""
    return {
        **config_keys(cfg, _CONFIG_KEYS),
        "relative_attention": True,
        "pos_att_type": list(cfg.pos_att_type),
        "norm_rel_ebd": cfg.norm_rel_ebd,
        "pooler_hidden_act": cfg.pooler_act,
    }
