"""Multi-head self-attention over one sequence: project, split heads, attend per head, merge.

Params: {"q", "k", "v", "o": {"w": [D, D], "b": [D]}} plus, for parameterized scores, "score": the
score's params stacked over heads (leading axis H). Head h uses columns h*Dh:(h+1)*Dh of the q/k/v
projections and rows h*Dh:(h+1)*Dh of the output projection (Dh = D / H).
"""

import jax
import jax.numpy as jnp

from attn import layers, scores
from attn.attention import attention as attend


def _head_dim(d_model: int, num_heads: int) -> int:
    if num_heads <= 0 or d_model % num_heads != 0:
        raise ValueError(
            f"d_model={d_model} must be divisible by num_heads={num_heads} (num_heads > 0)"
        )
    return d_model // num_heads


def init(
    key: jax.Array,
    d_model: int,
    num_heads: int,
    *,
    score: str | scores.Score = "scaled_dot",
    dtype=jnp.float32,
) -> dict:
    """Params for `apply`; per-head score params come from the score's own init."""
    d_head = _head_dim(d_model, num_heads)
    sc = scores.get_score(score)
    kq, kk, kv, ko, ks = jax.random.split(key, 5)
    params = {
        name: layers.dense_init(k, d_model, d_model, dtype=dtype)
        for name, k in (("q", kq), ("k", kk), ("v", kv), ("o", ko))
    }
    if sc.has_params:
        keys_H = jax.random.split(ks, num_heads)
        params["score"] = jax.vmap(lambda k: sc.init(k, d_head, dtype=dtype))(keys_H)
    return params


def apply(
    params: dict,
    x_LxD: jax.Array,
    mask_L: jax.Array | None,
    *,
    num_heads: int,
    score: str | scores.Score = "scaled_dot",
    implementation: str = "matrix",
    q_chunk: int = 128,
    k_chunk: int = 128,
) -> tuple[jax.Array, jax.Array | None]:
    """Self-attention of x [L, D] with key padding mask [L] (True = real token).

    Returns (y [L, D] in x's dtype, weights [H, L, L] float32, or None when the implementation does
    not materialise them). Padding queries still get an output (attending to real keys); callers
    pool with the mask, so it never matters.
    """
    length, d_model = x_LxD.shape
    d_head = _head_dim(d_model, num_heads)
    sc = scores.get_score(score)

    def heads(name: str) -> jax.Array:
        return layers.dense(params[name], x_LxD).reshape(length, num_heads, d_head).swapaxes(0, 1)

    q_HxLxK, k_HxLxK, v_HxLxK = heads("q"), heads("k"), heads("v")
    score_params = params.get("score")

    def one_head(q_LxK, k_LxK, v_LxK, sp):
        return attend(
            q_LxK,
            k_LxK,
            v_LxK,
            mask_L,
            score=sc,
            score_params=sp,
            implementation=implementation,
            q_chunk=q_chunk,
            k_chunk=k_chunk,
        )

    sp_axis = None if score_params is None else 0
    out_HxLxK, w_HxLxL = jax.vmap(one_head, in_axes=(0, 0, 0, sp_axis))(
        q_HxLxK, k_HxLxK, v_HxLxK, score_params
    )
    out_LxD = out_HxLxK.swapaxes(0, 1).reshape(length, d_model).astype(x_LxD.dtype)
    return layers.dense(params["o"], out_LxD), w_HxLxL
