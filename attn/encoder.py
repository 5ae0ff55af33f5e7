"""Pre-LayerNorm Transformer encoder block over one sequence.

    x = x + Dropout(MHA(LN(x)))
    x = x + Dropout(W2 GELU(W1 LN(x)))

Params: {"ln1", "ln2": layer norm, "mha": multihead params, "ff1": dense D->F, "ff2": dense F->D}.
"""

import jax
import jax.numpy as jnp

from attn import layers, masks, multihead, scores
from attn.attention import attention

__all__ = ["apply", "init"]


def init(
    key: jax.Array,
    d_model: int,
    num_heads: int,
    d_ff: int,
    *,
    score: str | scores.Score = "scaled_dot",
    dtype=jnp.float32,
) -> dict:
    k_att, k1, k2 = jax.random.split(key, 3)
    return {
        "ln1": layers.layer_norm_init(d_model, dtype),
        "mha": multihead.init(k_att, d_model, num_heads, score=score, dtype=dtype),
        "ln2": layers.layer_norm_init(d_model, dtype),
        "ff1": layers.dense_init(k1, d_model, d_ff, dtype=dtype),
        "ff2": layers.dense_init(k2, d_ff, d_model, dtype=dtype),
    }


def apply(
    params: dict,
    x_LxD: jax.Array,
    mask: masks.Mask | None,
    *,
    num_heads: int,
    attend: multihead.Attend = attention,
    dropout: float = 0.0,
    train: bool = False,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """x [L, D] -> (y [L, D] in x's dtype, attention weights [H, L, L] or None).

    mask and attend are those of `multihead.apply`. train=True with dropout > 0 needs rng
    (ValueError otherwise).
    """
    if train and dropout > 0.0 and rng is None:
        raise ValueError("encoder.apply: train=True with dropout > 0 needs an rng key, got None")
    r_att, r_ff = jax.random.split(rng) if rng is not None else (None, None)

    a_LxD, w_HxLxL = multihead.apply(
        params["mha"],
        layers.layer_norm(params["ln1"], x_LxD),
        mask,
        num_heads=num_heads,
        attend=attend,
    )
    x_LxD = x_LxD + layers.dropout(a_LxD, dropout, train=train, rng=r_att)

    h_LxF = jax.nn.gelu(layers.dense(params["ff1"], layers.layer_norm(params["ln2"], x_LxD)))
    f_LxD = layers.dense(params["ff2"], h_LxF)
    return x_LxD + layers.dropout(f_LxD, dropout, train=train, rng=r_ff), w_HxLxL
