"""ModernBERT: pre-LayerNorm blocks without biases, a GeGLU feed-forward, rotary positions, and
attention that alternates between global layers and local ones (a sliding window), computed in
`model`; its checkpoints' rules in `checkpoint`, its classification head in `head`."""

from attn.encoders.family import Family
from attn.encoders.modernbert import checkpoint, head, model

FAMILY = Family(
    name="modernbert",
    model_types=checkpoint.MODEL_TYPES,
    architectures=checkpoint.ARCHITECTURES,
    config=model.Config,
    from_hf=checkpoint.from_hf,
    to_hf=checkpoint.to_hf,
    prefixes=checkpoint.PREFIXES,
    rules=checkpoint.rules,
    skip=checkpoint.skip,
    init=model.init,
    encode=model.encode,
    input_embeddings=model.input_embeddings,
    attention_steps=model.attention_steps,
    head=head.HEAD,
    score="scaled_dot",
    steps_input=model.steps_input,
    steps_qk=model.steps_qk,
)
