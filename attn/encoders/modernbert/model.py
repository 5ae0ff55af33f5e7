"""The ModernBERT encoder (Warner et al. 2024) as pure functions; its checkpoint rules are
`attn.encoders.modernbert.checkpoint`.

    x = LN(token[ids])                                   embeddings (no positions added)
    x = x + Dropout(MHA_i(LN_att(x)))                    each of num_layers pre-LayerNorm blocks;
    x = x + W_out Dropout(GELU(W_in LN_ff(x)) * W_gate LN_ff(x))   block 0 has no LN_att
    h = LN_final(x)                                      the last hidden states

No linear layer or LayerNorm has a bias (the checkpoints attn reads have none), GELU is the exact
(erf) form, and the feed-forward is a GeGLU. MHA_i is `attn.multihead.apply` with rotary positions
(`attn.positions.rotary`) as its q/k transform and the scaled dot product as its score, under one
of two masks that alternate with depth: layer i is global when i % global_every == 0 (every
real key; rotary theta global_theta), else local (query i sees key j only when
|i - j| <= local_window // 2 and j is real; theta local_theta). The local mask is
``attn.masks.all_of(attn.masks.sliding_window(w, w), key padding)``, a function of positions, so
implementation "chunked" evaluates it one block at a time in memory linear in L. Positions are
0..L-1 whatever the padding, as in Hugging Face's ModernBertModel (padded, not unpadded, input).
A padding query that sees no real key gets attention output 0 (attn's convention) where Hugging
Face gives the mean of the values; real positions never differ.

Params (plain dicts, float32):
    {"embed": {"tokens": [V, D], "ln": {"scale": [D]}},
     "layer_0" ... "layer_{n-1}": {"mha": {"q", "k", "v", "o": {"w": [D, D]}},
                                   "ln_att": {"scale": [D]} (not in layer_0),
                                   "ln_ff": {"scale": [D]}, "ff_in", "ff_gate": {"w": [D, F]},
                                   "ff_out": {"w": [F, D]}},
     "final_ln": {"scale": [D]}}
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn import layers, masks, multihead, positions
from attn.attention import attention
from attn.classifier import DTYPES
from attn.encoders import fields
from attn.encoders.family import checked_inputs, lookup
from attn.encoders.heads import ACTIVATIONS

__all__ = [
    "Config",
    "attention_steps",
    "embed",
    "encode",
    "init",
    "input_embeddings",
    "is_global",
    "layer_mask",
    "steps_input",
    "steps_qk",
]


@dataclasses.dataclass(frozen=True)
class Config:
    """The encoder's sizes (config.json's names in comments); frozen and hashable, so it can be
    a jit static argument. Defaults are ModernBERT-base's."""

    vocab_size: int = 50368
    d_model: int = 768  # hidden_size
    num_layers: int = 22  # num_hidden_layers
    num_heads: int = 12  # num_attention_heads
    d_ff: int = 1152  # intermediate_size: the GeGLU's width (mlp.Wi holds input and gate)
    max_positions: int = 8192  # max_position_embeddings: the length it was trained to read
    global_every: int = 3  # global_attn_every_n_layers
    local_window: int = 128  # local_attention: a local query sees local_window // 2 each side
    global_theta: float = 160000.0  # global_rope_theta
    local_theta: float = 10000.0  # local_rope_theta (global_rope_theta when null)
    norm_eps: float = 1e-5
    embedding_dropout: float = 0.0  # after the embeddings' LayerNorm
    dropout: float = 0.0  # mlp_dropout: on GELU(input) * gate, inside the feed-forward
    attention_dropout: float = 0.0  # on the attention weights and on the attention's output
    pad_id: int = 50283  # pad_token_id
    initializer_range: float = 0.02  # init's stddev
    dtype: str = "float32"  # compute dtype: "float32" | "bfloat16"; params stay float32
    # The classification head's (`attn.encoders.modernbert.head`): its dense layer's bias and
    # its activation, config.json's classifier_bias and classifier_activation.
    classifier_bias: bool = False
    classifier_act: str = "gelu"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_positions"):
            fields.integer(self, name, 1)
        for name in ("num_layers", "pad_id", "local_window"):
            fields.integer(self, name, 0)
        fields.integer(self, "global_every", 1)
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"modernbert.Config.d_model={self.d_model} must be num_heads={self.num_heads} "
                "heads of an even width (rotary turns a head's channels in pairs)"
            )
        fields.real(self, "global_theta", 0.0, math.inf, closed=False)
        fields.real(self, "local_theta", 0.0, math.inf, closed=False)
        fields.real(self, "norm_eps", 0.0, math.inf)
        fields.real(self, "embedding_dropout", 0.0, 1.0)
        fields.real(self, "dropout", 0.0, 1.0)
        fields.real(self, "attention_dropout", 0.0, 1.0)
        fields.real(self, "initializer_range", 0.0, math.inf)
        fields.choice(self, "dtype", sorted(DTYPES))
        fields.flag(self, "classifier_bias")
        fields.choice(self, "classifier_act", tuple(ACTIVATIONS))

    @property
    def max_length(self) -> int:
        """The longest input: max_position_embeddings, the length the checkpoint was trained to
        read (rotary positions have no table, so nothing longer would fail, only go untrained)."""
        return self.max_positions


def is_global(cfg: Config, layer: int) -> bool:
    """Whether `layer` attends to every real key (else a sliding window)."""
    return layer % cfg.global_every == 0


def _theta(cfg: Config, layer: int) -> float:
    return cfg.global_theta if is_global(cfg, layer) else cfg.local_theta


def layer_mask(cfg: Config, layer: int, mask_L: jax.Array) -> masks.Mask:
    """The mask of `layer` for one sequence with key padding mask_L [L] (True = real token):
    mask_L itself in a global layer; in a local one, that and |i - j| <= local_window // 2."""
    if is_global(cfg, layer):
        return mask_L
    half = cfg.local_window // 2
    return masks.all_of(masks.sliding_window(half, half), mask_L)


def init(key: jax.Array, cfg: Config) -> dict:
    """Random float32 params (layout in the module docstring), drawn as ModernBERT draws them:
    normals cut at 2 standard deviations, initializer_range for the embeddings and the input
    projections, initializer_range / sqrt(2 num_layers) for the two output projections of each
    block; LayerNorm scales 1."""
    d, f = cfg.d_model, cfg.d_ff
    std_in = cfg.initializer_range
    std_out = cfg.initializer_range / math.sqrt(2.0 * max(cfg.num_layers, 1))

    def normal(k: jax.Array, std: float, *shape: int) -> jax.Array:
        return std * jax.random.truncated_normal(k, -2.0, 2.0, shape, jnp.float32)

    def norm() -> dict:
        return {"scale": jnp.ones((d,), jnp.float32)}

    k_tok, k_layers = jax.random.split(key)
    params: dict[str, Any] = {"embed": {"tokens": normal(k_tok, std_in, cfg.vocab_size, d)}}
    params["embed"]["ln"] = norm()
    for i, k in enumerate(jax.random.split(k_layers, cfg.num_layers)):
        k_q, k_k, k_v, k_o, k_in, k_gate, k_out = jax.random.split(k, 7)
        layer = {
            "mha": {
                "q": {"w": normal(k_q, std_in, d, d)},
                "k": {"w": normal(k_k, std_in, d, d)},
                "v": {"w": normal(k_v, std_in, d, d)},
                "o": {"w": normal(k_o, std_out, d, d)},
            },
            "ln_ff": norm(),
            "ff_in": {"w": normal(k_in, std_in, d, f)},
            "ff_gate": {"w": normal(k_gate, std_in, d, f)},
            "ff_out": {"w": normal(k_out, std_out, f, d)},
        }
        if i > 0:  # layer 0's attention reads the embeddings' LayerNorm as it is
            layer["ln_att"] = norm()
        params[f"layer_{i}"] = layer
    params["final_ln"] = norm()
    return params


def _norm(p: dict, x_xD: jax.Array, cfg: Config) -> jax.Array:
    """A LayerNorm without bias, statistics in float32 (`attn.layers.layer_norm`'s forward),
    differentiated by `_layer_norm`'s own backward."""
    return _layer_norm(x_xD, p["scale"], cfg.norm_eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _layer_norm(x_xD: jax.Array, scale_D: jax.Array, eps: float) -> jax.Array:
    return _layer_norm_fwd(x_xD, scale_D, eps)[0]


def _layer_norm_fwd(x_xD: jax.Array, scale_D: jax.Array, eps: float) -> tuple:
    """(x's LayerNorm in x's dtype, what the backward reads: x normalised [..., D] float32, its
    1 / standard deviation [..., 1], scale [D])."""
    x32 = x_xD.astype(jnp.float32)
    centred = x32 - x32.mean(-1, keepdims=True)
    inv_std = jax.lax.rsqrt(jnp.square(centred).mean(-1, keepdims=True) + eps)
    xhat_xD = centred * inv_std
    return (xhat_xD * scale_D).astype(x_xD.dtype), (xhat_xD, inv_std, scale_D)


def _layer_norm_bwd(eps: float, res: tuple, g_xD: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The cotangents of x and scale, x's in one expression: autodiff's sums it from x's three
    uses (the mean, the centring, the residual stream) and ends on the mean's broadcast term,
    an add XLA counts as unary and so copies into every consumer; on CPU each block's residual
    cotangent then recomputed the chain through every later block's LayerNorms (a step
    quadratic in depth)."""
    del eps
    xhat_xD, inv_std, scale_D = res
    gs_xD = g_xD.astype(jnp.float32) * scale_D
    dx_xD = inv_std * (
        gs_xD - gs_xD.mean(-1, keepdims=True) - xhat_xD * (gs_xD * xhat_xD).mean(-1, keepdims=True)
    )
    dscale_D = (g_xD.astype(jnp.float32) * xhat_xD).reshape(-1, xhat_xD.shape[-1]).sum(0)
    return dx_xD.astype(g_xD.dtype), dscale_D


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def _check_inputs(
    params: dict, cfg: Config, ids_BxL: Any, mask_BxL: Any, types_BxL: Any
) -> tuple[jax.Array, jax.Array]:
    """The inputs as arrays (`family.checked_inputs`), and params that fit cfg; ValueError in
    one line for what cannot work (at trace time). ModernBERT has no token types: concrete
    nonzero ones are refused."""
    ids_BxL, mask_BxL, types_BxL = checked_inputs(cfg, ids_BxL, mask_BxL, types_BxL)
    if not isinstance(types_BxL, jax.core.Tracer) and np.any(np.asarray(types_BxL)):
        raise ValueError("ModernBERT has no token types: pass types_BxL=None (or zeros)")
    table = params["embed"]["tokens"].shape
    layers_ = sum(k.startswith("layer_") for k in params)
    if table != (cfg.vocab_size, cfg.d_model) or layers_ != cfg.num_layers:
        raise ValueError(
            f"params do not fit the config: embed.tokens is {table}, config says "
            f"({cfg.vocab_size}, {cfg.d_model}) and {cfg.num_layers} layers (params have "
            f"{layers_})"
        )
    return ids_BxL, mask_BxL


def input_embeddings(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
) -> jax.Array:
    """LN(token embeddings) [B, L, D] float32: the first block's input before dropout, what gradient
    × input attributes to (taken before the normalisation it would be 0: a LayerNorm ignores its
    input's scale). An id outside [0, vocab_size) is refused when concrete and gives NaN under jit
    (`family.lookup`)."""
    ids_BxL, _ = _check_inputs(params, cfg, ids_BxL, mask_BxL, types_BxL)
    return _norm(params["embed"]["ln"], lookup(params["embed"]["tokens"], ids_BxL), cfg)


def embed(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    delta_BxLxD: jax.Array | None = None,
) -> jax.Array:
    """`input_embeddings` (+ delta_BxLxD, if given) -> [B, L, D] in cfg.dtype (normalised in
    float32), then embedding dropout in training."""
    x_BxLxD = input_embeddings(params, cfg, ids_BxL, mask_BxL, types_BxL)
    if delta_BxLxD is not None:
        x_BxLxD = x_BxLxD + delta_BxLxD
    x_BxLxD = x_BxLxD.astype(DTYPES[cfg.dtype])
    return layers.dropout(x_BxLxD, cfg.embedding_dropout, train=train, rng=rng)


def _attention_input(p: dict, x_LxD: jax.Array, cfg: Config) -> jax.Array:
    """What a block's attention reads: LN_att(x), or x itself in layer 0 (which has none)."""
    return _norm(p["ln_att"], x_LxD, cfg) if "ln_att" in p else x_LxD


def _block(
    p: dict,
    x_LxD: jax.Array,
    mask_L: jax.Array,
    rng: jax.Array | None,
    *,
    cfg: Config,
    layer: int,
    attend: multihead.Attend,
    train: bool,
) -> tuple[jax.Array, jax.Array | None]:
    """One pre-LayerNorm block on one sequence [L, D] -> (output [L, D], the attention weights
    [H, L, L] before dropout, or None when the implementation does not form them)."""
    r_w, r_att, r_ff = jax.random.split(rng, 3) if rng is not None else (None, None, None)
    a_LxD, w_HxLxL = multihead.apply(
        p["mha"],
        _attention_input(p, x_LxD, cfg),
        layer_mask(cfg, layer, mask_L),
        num_heads=cfg.num_heads,
        attend=attend,
        dropout_rate=cfg.attention_dropout if train else 0.0,
        dropout_rng=r_w,
        qk_transform=functools.partial(positions.rotary, theta=_theta(cfg, layer)),
    )
    x_LxD = x_LxD + layers.dropout(a_LxD, cfg.attention_dropout, train=train, rng=r_att)
    h_LxD = _norm(p["ln_ff"], x_LxD, cfg)
    in_LxF = jax.nn.gelu(layers.dense(p["ff_in"], h_LxD), approximate=False)
    gated_LxF = in_LxF * layers.dense(p["ff_gate"], h_LxD)  # GeGLU
    gated_LxF = layers.dropout(gated_LxF, cfg.dropout, train=train, rng=r_ff)
    return x_LxD + layers.dense(p["ff_out"], gated_LxF), w_HxLxL


def _blocks(
    params: dict,
    cfg: Config,
    x_BxLxD: jax.Array,
    mask_BxL: jax.Array,
    *,
    attend: multihead.Attend,
    train: bool,
    rng: jax.Array | None,
    stop: int,
) -> tuple[jax.Array, list]:
    """Blocks 0 .. stop-1 on a batch: (the residual stream after them [B, L, D], each block's
    weights [B, H, L, L] or None)."""
    batch = x_BxLxD.shape[0]
    weights = []
    for i in range(stop):
        # One key per example and layer, so examples get independent dropout masks.
        r_B = jax.random.split(jax.random.fold_in(rng, i), batch) if rng is not None else None
        block = functools.partial(_block, cfg=cfg, layer=i, attend=attend, train=train)
        x_BxLxD, w_BxHxLxL = jax.vmap(block, in_axes=(None, 0, 0, None if r_B is None else 0))(
            params[f"layer_{i}"], x_BxLxD, mask_BxL, r_B
        )
        weights.append(w_BxHxLxL)
    return x_BxLxD, weights


def encode(
    params: dict,
    cfg: Config,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
    *,
    attend: multihead.Attend = attention,
    train: bool = False,
    rng: jax.Array | None = None,
    return_weights: bool = False,
    embed_delta_BxLxD: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, list]:
    """Token ids [B, L] and mask [B, L] (bool, True = real token; token types, which ModernBERT
    has not, None or zeros) -> the last hidden states [B, L, D] in cfg.dtype (after the final
    LayerNorm); with return_weights, (those states, each layer's attention weights [B, H, L, L]
    float32 before dropout, or None per layer when the implementation does not form them).

    attend: the attention each head runs (`attn.multihead.apply`'s) on the rotated q and k, under
    the layer's mask: ``attn.attention`` by default; ``attn.Attention(implementation="chunked")``
    for memory linear in L (the local window included), or "xla" (which forms the [L, L] mask).
    train=True applies the embedding, attention and feed-forward dropout and needs rng
    (attention dropout needs the "matrix" implementation; use
    ``dataclasses.replace(cfg, attention_dropout=0.0)`` with another one). embed_delta_BxLxD, if
    given, is added to the token embeddings after their LayerNorm (`embed`).
    """
    rates = (cfg.embedding_dropout, cfg.dropout, cfg.attention_dropout)
    if train and rng is None and any(r > 0.0 for r in rates):
        raise ValueError(
            "modernbert.encode: train=True with dropout > 0 needs an rng key; got None"
        )
    r_embed, r_layers = jax.random.split(rng) if train and rng is not None else (None, None)
    x_BxLxD = embed(
        params,
        cfg,
        ids_BxL,
        mask_BxL,
        types_BxL,
        train=train,
        rng=r_embed,
        delta_BxLxD=embed_delta_BxLxD,
    )
    x_BxLxD, weights = _blocks(
        params,
        cfg,
        x_BxLxD,
        jnp.asarray(mask_BxL),
        attend=attend,
        train=train,
        rng=r_layers,
        stop=cfg.num_layers,
    )
    h_BxLxD = _norm(params["final_ln"], x_BxLxD, cfg)
    return (h_BxLxD, weights) if return_weights else h_BxLxD


def attention_steps(
    params: dict, cfg: Config, ids_L: jax.Array, mask_L: jax.Array, *, layer: int = 0
) -> multihead.Steps:
    """Step-by-step values of global layer `layer`'s self-attention on one sequence of ids [L]
    with bool mask [L], as in evaluation (no dropout), in the matrix form: X is what the
    attention reads (the layer's LN_att of the residual stream; the embeddings' LayerNorm in
    layer 0), Q and K are rotated (those the scores are computed from). A local layer is refused
    in one line: its sliding window masks keys per query, and the figure marks padded keys only.
    """
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise TypeError(f"layer must be an int; got {layer!r}")
    if not 0 <= layer < cfg.num_layers:
        raise ValueError(f"layer must be in [0, {cfg.num_layers}); got {layer}")
    if not is_global(cfg, layer):
        drawable = [i for i in range(cfg.num_layers) if is_global(cfg, i)]
        raise ValueError(
            f"layer {layer} is a local layer (each token sees {cfg.local_window // 2} tokens on "
            f"either side), and the step-by-step figure marks padded keys, not a sliding window; "
            f"draw a global layer: {', '.join(map(str, drawable))}"
        )
    ids_L, mask_L = jnp.asarray(ids_L), jnp.asarray(mask_L)
    if ids_L.ndim != 1:
        raise ValueError(f"token ids must be one sequence [L]; got shape {ids_L.shape}")
    x_1xLxD = embed(params, cfg, ids_L[None], mask_L[None])
    x_1xLxD, _ = _blocks(
        params, cfg, x_1xLxD, mask_L[None], attend=attention, train=False, rng=None, stop=layer
    )
    p = params[f"layer_{layer}"]
    return multihead.steps(
        p["mha"],
        _attention_input(p, x_1xLxD[0], cfg),
        layer_mask(cfg, layer, mask_L),
        num_heads=cfg.num_heads,
        qk_transform=functools.partial(positions.rotary, theta=_theta(cfg, layer)),
    )


def steps_input(cfg: Config, layer: int) -> str:
    """What X is in layer `layer`'s step-by-step figure: what its attention reads."""
    if layer == 0:
        return "X: token embeddings after LayerNorm (layer 0 has no attention LayerNorm)"
    return f"X: LayerNorm of the residual stream after layer {layer - 1}"


def steps_qk(cfg: Config, layer: int) -> tuple[str, str]:
    """Q and K in that figure: the projections, rotated by position (rotary, theta of `layer`)."""
    theta = f"{_theta(cfg, layer):g}"
    return f"Q = rotary(X Wq), θ={theta}", f"K = rotary(X Wk), θ={theta}"
