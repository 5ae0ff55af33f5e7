"""attn: self-attention for sentiment classification as pure, jit/vmap-able JAX functions.

`attn.attention(q, k, v, mask)` is single-sequence attention, the teaching form; batch and heads
come from vmap. `attn.dot_product_attention` is that vmap done for you, a drop-in for
`jax.nn.dot_product_attention` ([B, T, N, H], its arguments and broadcasting) with attn's scores,
masks and implementations. `attn.Attention(score=..., implementation=...)` binds the static
arguments in a form `jax.jit` and Flax can hold. Submodules: scores, masks, chunked, batched,
reference, bag, multihead, encoder, positions, pooling, layers, classifier, masked_lm (masked-token
pretraining), importance (token importance and erasure), bert (BERT-family encoders and their
Hugging Face checkpoints; reading one needs safetensors), bert_classifier (a classifier over
one, to fine-tune), and flax_interop (import it explicitly;
it pulls in Flax).
"""

from attn import (
    bag,
    batched,
    bert,
    bert_classifier,
    chunked,
    classifier,
    encoder,
    importance,
    layers,
    masked_lm,
    masks,
    multihead,
    pooling,
    positions,
    reference,
    scores,
)
from attn.attention import FULLY_MASKED, IMPLEMENTATIONS, Attention, attention
from attn.batched import dot_product_attention

__all__ = [
    "FULLY_MASKED",
    "IMPLEMENTATIONS",
    "Attention",
    "attention",
    "bag",
    "batched",
    "bert",
    "bert_classifier",
    "chunked",
    "classifier",
    "dot_product_attention",
    "encoder",
    "importance",
    "layers",
    "masked_lm",
    "masks",
    "multihead",
    "pooling",
    "positions",
    "reference",
    "scores",
]
