"""DeBERTa-v2 and -v3 (model_type "deberta-v2"): post-LayerNorm blocks whose attention is the
disentangled score (content, content-to-position and position-to-content terms over log-bucketed
relative positions, `score`), its computation in `model` and its checkpoints' rules in
`checkpoint`."""

from attn.encoders.deberta import checkpoint, model, score
from attn.encoders.family import Family

__all__ = ["FAMILY", "checkpoint", "model", "score"]

FAMILY = Family(
    name="deberta-v2",
    model_types=checkpoint.MODEL_TYPES,
    architectures=checkpoint.ARCHITECTURES,
    config=model.Config,
    from_hf=checkpoint.from_hf,
    prefixes=checkpoint.PREFIXES,
    rules=checkpoint.rules,
    skip=checkpoint.skip,
    init=model.init,
    encode=model.encode,
    input_embeddings=model.input_embeddings,
    attention_steps=model.attention_steps,
    pool=model.first_token,
    score="disentangled",
    steps_input=model.steps_input,
    unsupported=model.UNSUPPORTED,
)
