"""attn: self-attention for sentiment classification as pure, jit/vmap-able JAX functions.

`attn.attention(q, k, v, mask)` is single-sequence attention; batch and heads come from vmap.
Submodules: scores, masks, chunked, reference, multihead, encoder, positions, pooling, layers,
classifier, and flax_interop (import it explicitly; it pulls in Flax).
"""

from attn import (
    chunked,
    classifier,
    encoder,
    layers,
    masks,
    multihead,
    pooling,
    positions,
    reference,
    scores,
)
from attn.attention import IMPLEMENTATIONS, attention

__all__ = [
    "IMPLEMENTATIONS",
    "attention",
    "chunked",
    "classifier",
    "encoder",
    "layers",
    "masks",
    "multihead",
    "pooling",
    "positions",
    "reference",
    "scores",
]
