"""attn: self-attention for sentiment classification as pure, jit/vmap-able JAX functions.

`attn.attention(q, k, v, mask)` is single-sequence attention, the teaching form; batch and heads
come from vmap. `attn.dot_product_attention` is that vmap done for you, a drop-in for
`jax.nn.dot_product_attention` ([B, T, N, H], its arguments and broadcasting) with attn's scores,
masks and implementations. `attn.Attention(score=..., implementation=...)` binds the static
arguments in a form `jax.jit` and Flax can hold. Submodules: scores, masks, chunked, batched,
reference, fused (the cuDNN and Pallas TPU kernels), bag, multihead, encoder, positions, pooling,
layers, head (the classifier head both classifiers share), classifier, masked_lm (masked-token
pretraining), distillation (a student's loss against a teacher's logits), importance (token
importance and erasure), encoders (pretrained encoder families behind one registry, and their
Hugging Face checkpoints in safetensors, Flax msgpack or PyTorch .bin files, read without torch),
bert (the BERT family under its earlier name), encoder_classifier (a classifier over a pretrained
encoder, to fine-tune), models (which of the two classifiers a config is), and flax_interop
(import it explicitly; it pulls in Flax).

Names carry their shapes: ``q_LxK`` is [L, K], with einsum subscripts to match. One meaning per
letter, here and in experiments/, benchmarks/ and tests/:

    A  an additive scorer's hidden width: structured pooling's d_a, the additive/mlp scores' hidden
    B  batch: the rows a model reads at once
    C  classes
    D  model width: features per token (attn.attention's and the scores' q and k)
    E  value width (attn.attention's v; = K within multihead)
    F  feed-forward width
    G  tokens the bag reads
    H  heads
    I  queries of one chunk (chunked attention's q_chunk)
    J  keys of one chunk (k_chunk)
    K  query/key width of one head (D / H)
    L  tokens of a text: the queries
    M  keys attended to (= L in self-attention)
    N  examples: what a statistic runs over (texts; the words a vectors file has)
    O  n-gram orders
    P  hidden tokens a masked-token head predicts
    Q  query chunks (how many)
    R  hops of structured pooling
    U  bootstrap resamples
    V  vocabulary: the ids a table has rows for (tokens; the bag's hash buckets)
    W  width of an input from outside the model: cross-attention's keys and values (= D in
       self-attention), a word-vectors file's vectors
    X  a size the function leaves open (whatever it is given; said where it is set)
    Y  erasure sizes: the percents of a text's tokens a faithfulness test erases
    Z  key chunks (how many)

A leading lowercase x is any leading axes (``x_xLxD``), a digit a size (``m_L1`` is [L, 1],
``keep_Bx2YxL``), a lowercase letter a local count (``p_nxC``). S and T are unused:
`attn.dot_product_attention` takes jax.nn's layouts, which jax.nn's docs write [B, T, N, H]
(= B, L, H, K here; keys [B, S, K, H] with K key/value heads). The score params' saved keys
(``wq_DxH``, ``b_H``, ...) keep H for the scores' hidden width, A here.
"""

from attn import (
    bag,
    batched,
    bert,
    chunked,
    classifier,
    distillation,
    encoder,
    encoder_classifier,
    encoders,
    fused,
    head,
    importance,
    layers,
    masked_lm,
    masks,
    models,
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
    "chunked",
    "classifier",
    "distillation",
    "dot_product_attention",
    "encoder",
    "encoder_classifier",
    "encoders",
    "fused",
    "head",
    "importance",
    "layers",
    "masked_lm",
    "masks",
    "models",
    "multihead",
    "pooling",
    "positions",
    "reference",
    "scores",
]
