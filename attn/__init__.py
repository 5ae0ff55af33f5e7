"""attn: self-attention for sentiment classification as pure, jit/vmap-able JAX functions."""
