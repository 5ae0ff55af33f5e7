"""ALBERT: BERT's embeddings at their own width, projected to the model width, and one
post-LayerNorm block shared by every depth (its params entry read num_layers times); its
computation in `model`, its checkpoints' rules in `checkpoint` and its classification head in
`head`."""

from attn.encoders.albert import checkpoint, head, model
from attn.encoders.family import Family

FAMILY = Family(
    name="albert",
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
    flax_layout=True,  # transformers had a Flax class: flax_model.msgpack maps by its rules
    layer_keys=model.layer_keys,
)
