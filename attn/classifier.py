"""Self-attention sentence classifier: embed -> encoder blocks -> final LN -> pool -> linear head.

Params tree (plain dicts, float32):
    {"embed": {"tokens": [V, D], "ngrams": [ngram_buckets, D] if ngram_buckets,
               "positions": [max_len, D] if learned},
     "layer_0" ... "layer_{n-1}": encoder params, "final_ln": layer norm,
     "pool": {"w1": [D, d_a], "w2": [d_a, r]} if structured, "head": dense [D or r*D] -> C,
     "bag": [bag_buckets, C] if bag_buckets}
"""

import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp

from attn import bag, encoder, head, layers, multihead, pooling, positions, scores
from attn.attention import IMPLEMENTATIONS, attention

__all__ = [
    "DTYPES",
    "PAD",
    "POOLINGS",
    "POSITIONS",
    "UNK",
    "ModelConfig",
    "apply",
    "attend",
    "attention_steps",
    "bag_ids",
    "embed",
    "encode",
    "init",
    "ngram_buckets",
]

PAD, UNK = 0, 1
ngram_buckets = bag.ngram_buckets  # the hashing of the n-gram embeddings and of the bag
POSITIONS = ("learned", "sinusoidal", "none")
POOLINGS = ("cls", "mean", "max", "structured")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Model hyperparameters; frozen and hashable so it can be a jit static argument."""

    vocab_size: int
    num_classes: int = 2
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 1
    d_ff: int = 256
    max_len: int = 256  # positions table size; longer input is a ValueError at trace time
    positions: str = "learned"  # "learned" | "sinusoidal" | "none"
    pooling: str = "mean"  # "cls" | "mean" | "max" | "structured"
    pool_hops: int = 4  # r in Lin et al. 2017 (structured pooling)
    pool_hidden: int = 64  # d_a in Lin et al. 2017
    dropout: float = 0.1  # residual and pooled-vector dropout
    embed_dropout: float = 0.1  # on the summed input embeddings
    score: str = "scaled_dot"  # a name in attn.scores.SCORES; an alias becomes its score's name
    implementation: str = "matrix"  # attn.IMPLEMENTATIONS; "cudnn" takes dtype "bfloat16"
    q_chunk: int = 128
    k_chunk: int = 128
    ngram_buckets: int = 0  # >0 adds hashed n-gram embeddings of the token ids (fastText-style)
    ngram_orders: tuple[int, ...] = (2, 3)
    bag_buckets: int = 0  # >0 adds the logits of a linear model on the bag of hashed n-grams
    bag_orders: tuple[int, ...] = (1, 2)
    bag_dropout: float = 0.0  # drops whole n-grams from the bag in training
    dtype: str = "float32"  # compute dtype: "float32" | "bfloat16"; params stay float32

    def __post_init__(self):
        def integer(name: str, lo: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
                raise ValueError(f"ModelConfig.{name} must be an integer >= {lo}; got {v!r}")
            object.__setattr__(self, name, int(v))  # numpy ints -> int keeps hashing uniform

        def choice(name: str, options) -> None:
            v = getattr(self, name)
            if not isinstance(v, str) or v not in options:
                raise ValueError(f"ModelConfig.{name} must be one of {sorted(options)}; got {v!r}")

        def rate(name: str) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0.0 <= v < 1.0:
                raise ValueError(f"ModelConfig.{name} must be a float in [0, 1); got {v!r}")
            object.__setattr__(self, name, float(v))

        # PAD, UNK and CLS take ids 0-2, so a usable vocabulary has at least one more id.
        integer("vocab_size", 4)
        integer("num_classes", 2)
        integer("d_model", 1)
        integer("num_heads", 1)
        if self.d_model % self.num_heads:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} must be divisible by "
                f"ModelConfig.num_heads={self.num_heads}"
            )
        integer("num_layers", 0)
        integer("d_ff", 1)
        integer("max_len", 1)
        choice("positions", POSITIONS)
        choice("pooling", POOLINGS)
        integer("pool_hops", 1)
        integer("pool_hidden", 1)
        rate("dropout")
        rate("embed_dropout")
        choice("score", [*scores.SCORES, *scores.ALIASES])
        object.__setattr__(self, "score", scores.get_score(self.score).name)  # alias -> name
        choice("implementation", IMPLEMENTATIONS)
        if self.implementation not in ("matrix", "chunked") and self.score != "scaled_dot":
            raise ValueError(
                f"ModelConfig.implementation={self.implementation!r} supports only "
                f"score='scaled_dot'; got ModelConfig.score={self.score!r}"
            )
        integer("q_chunk", 1)
        integer("k_chunk", 1)

        def orders(name: str, buckets: str) -> None:
            needed = getattr(self, buckets) > 0
            v = bag.checked_orders(getattr(self, name), f"ModelConfig.{name}", needed)
            object.__setattr__(self, name, v)

        integer("ngram_buckets", 0)
        orders("ngram_orders", "ngram_buckets")
        integer("bag_buckets", 0)
        orders("bag_orders", "bag_buckets")
        rate("bag_dropout")
        choice("dtype", DTYPES)

    @property
    def pooled_dim(self) -> int:
        return self.d_model * (self.pool_hops if self.pooling == "structured" else 1)


@functools.lru_cache(maxsize=64)
def attend(cfg: ModelConfig) -> multihead.Attend:
    """The attention every layer runs: `attn.attention` with cfg's score and implementation.

    Cached, so equal configs give the same object (a stable `jit` static argument).
    """
    return functools.partial(
        attention,
        score=cfg.score,
        implementation=cfg.implementation,
        q_chunk=cfg.q_chunk,
        k_chunk=cfg.k_chunk,
    )


def init(key: jax.Array, cfg: ModelConfig) -> dict:
    """Random float32 params for `apply` (layout in the module docstring)."""
    k_tok, k_pos, k_layers, k_pool, k_head = jax.random.split(key, 5)
    embed = {"tokens": layers.embed_init(k_tok, cfg.vocab_size, cfg.d_model)}
    if cfg.ngram_buckets:
        # Zeros, not random rows: most test n-grams never occur in training, and a random row
        # would add fixed noise to them; a zero row only moves once its n-gram is seen.
        embed["ngrams"] = jnp.zeros((cfg.ngram_buckets, cfg.d_model), jnp.float32)
    if cfg.positions == "learned":
        embed["positions"] = positions.learned_init(k_pos, cfg.max_len, cfg.d_model)
    params = {"embed": embed}
    for i, k in enumerate(jax.random.split(k_layers, cfg.num_layers)):
        params[f"layer_{i}"] = encoder.init(
            k, cfg.d_model, cfg.num_heads, cfg.d_ff, score=cfg.score
        )
    params["final_ln"] = layers.layer_norm_init(cfg.d_model)
    if cfg.pooling == "structured":
        params["pool"] = pooling.structured_init(
            k_pool, cfg.d_model, cfg.pool_hidden, cfg.pool_hops
        )
    params.update(head.init(k_head, cfg.pooled_dim, cfg.num_classes, bag_buckets=cfg.bag_buckets))
    return params


def bag_ids(tokens_BxL: jax.Array, cfg: ModelConfig) -> jax.Array:
    """The bag's bucket ids [len(bag_orders), B, L] of token ids [B, L]."""
    return ngram_buckets(_known(tokens_BxL, cfg), cfg.bag_orders, cfg.bag_buckets)


def _known(tokens_BxL: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Ids outside [0, vocab_size) replaced by UNK."""
    return jnp.where((tokens_BxL < 0) | (tokens_BxL >= cfg.vocab_size), UNK, tokens_BxL)


def embed(params: dict, tokens_BxL: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Token (+ hashed n-gram) (+ position) embeddings -> [B, L, D] float32; no n-grams on pads.

    Ids outside [0, vocab_size) are read as UNK: values cannot be checked under jit, and an
    unknown token is what such an id means (indexing would clamp or wrap it silently).
    """
    length = tokens_BxL.shape[1]
    tokens_BxL = _known(tokens_BxL, cfg)
    x_BxLxD = params["embed"]["tokens"][tokens_BxL]
    if cfg.ngram_buckets:
        ids_OxBxL = ngram_buckets(tokens_BxL, cfg.ngram_orders, cfg.ngram_buckets)
        g_BxLxD = params["embed"]["ngrams"][ids_OxBxL].sum(0)
        x_BxLxD = x_BxLxD + jnp.where((tokens_BxL != PAD)[..., None], g_BxLxD, 0.0)
    if cfg.positions == "learned":
        x_BxLxD = x_BxLxD + positions.learned(params["embed"]["positions"], length)
    elif cfg.positions == "sinusoidal":
        x_BxLxD = x_BxLxD + positions.sinusoidal(length, cfg.d_model)
    return x_BxLxD


_SIMPLE_POOLS = {"cls": pooling.cls_pool, "mean": pooling.mean_pool, "max": pooling.max_pool}


@functools.lru_cache(maxsize=32)
def _param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    tree = jax.eval_shape(functools.partial(init, cfg=cfg), jax.random.key(0))
    return {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _check_params(params: dict, cfg: ModelConfig) -> None:
    """ValueError naming every leaf that `init(key, cfg)` would not have built (at trace time)."""
    expected = _param_shapes(cfg)
    got = {
        jax.tree_util.keystr(p): jnp.shape(x)
        for p, x in jax.tree_util.tree_leaves_with_path(params)
    }
    if got == expected:
        return
    problems = [f"missing {k}" for k in expected if k not in got]
    problems += [f"unexpected {k}" for k in got if k not in expected]
    problems += [
        f"{k} has shape {got[k]}, cfg expects {v}"
        for k, v in expected.items()
        if k in got and got[k] != v
    ]
    raise ValueError(f"params do not match the ModelConfig: {'; '.join(problems)}")


def _check_inputs(params: dict, tokens_BxL, cfg: ModelConfig, train: bool, rng) -> jax.Array:
    """The tokens as an array; ValueError for tokens not int [B, L], params not built for cfg,
    or train without rng."""
    _check_params(params, cfg)
    tokens_BxL = jnp.asarray(tokens_BxL)
    if tokens_BxL.ndim != 2 or not jnp.issubdtype(tokens_BxL.dtype, jnp.integer):
        raise ValueError(
            f"tokens must be an integer array [batch, length]; got {tokens_BxL.dtype}"
            f"{list(tokens_BxL.shape)}"
        )
    if train and rng is None:
        raise ValueError("classifier: train=True needs an rng key for dropout; got rng=None")
    return tokens_BxL


def encode(
    params: dict,
    tokens_BxL: jax.Array,
    cfg: ModelConfig,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    embed_delta_BxLxD: jax.Array | None = None,
) -> tuple[jax.Array, list]:
    """Int token ids [B, L] -> (final-LayerNorm'd states [B, L, D], per-layer attention weights
    [B, H, L, L] or None each): the model up to pooling, for objectives on per-token states.

    embed_delta_BxLxD, if given, is added to the input embeddings (adversarial training).
    """
    tokens_BxL = _check_inputs(params, tokens_BxL, cfg, train, rng)
    batch = tokens_BxL.shape[0]
    mask_BxL = tokens_BxL != PAD
    r_embed, r_layers = jax.random.split(rng) if train else (None, None)
    x_BxLxD = embed(params, tokens_BxL, cfg)
    if embed_delta_BxLxD is not None:
        x_BxLxD = x_BxLxD + embed_delta_BxLxD
    x_BxLxD = x_BxLxD.astype(DTYPES[cfg.dtype])
    x_BxLxD = layers.dropout(x_BxLxD, cfg.embed_dropout, train=train, rng=r_embed)
    block = functools.partial(
        encoder.apply, num_heads=cfg.num_heads, attend=attend(cfg), dropout=cfg.dropout, train=train
    )

    weights = []
    layer_rngs = jax.random.split(r_layers, cfg.num_layers) if train else [None] * cfg.num_layers
    for i in range(cfg.num_layers):
        # One dropout key per example so examples get independent masks under vmap.
        r_B = jax.random.split(layer_rngs[i], batch) if train else None
        x_BxLxD, w_BxHxLxL = jax.vmap(
            lambda p, x, m, r: block(p, x, m, rng=r), in_axes=(None, 0, 0, 0 if train else None)
        )(params[f"layer_{i}"], x_BxLxD, mask_BxL, r_B)
        weights.append(w_BxHxLxL)
    return layers.layer_norm(params["final_ln"], x_BxLxD), weights


def apply(
    params: dict,
    tokens_BxL: jax.Array,
    cfg: ModelConfig,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    embed_delta_BxLxD: jax.Array | None = None,
    bag_tokens_BxG: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
    """Classify int token ids [B, L] (0 = PAD) -> (logits [B, C] float32, aux).

    embed_delta_BxLxD, if given, is added to the input embeddings (adversarial training).
    bag_tokens_BxG, if given, is what the bag reads instead of tokens_BxL: more of each text
    (G >= L), since the bag costs little per token and attention much.

    aux = {"attention": tuple of per-layer [B, H, L, L] float32, or None when the implementation
    does not materialise weights ("chunked", "xla"); "pool_weights": [B, r, L] or None;
    "penalty": float32 scalar ‖AAᵀ − I‖²_F averaged over non-empty sequences (0 unless structured)}.
    """
    tokens_BxL = _check_inputs(params, tokens_BxL, cfg, train, rng)
    batch = tokens_BxL.shape[0]
    mask_BxL = tokens_BxL != PAD
    r_encode, r_pool = jax.random.split(rng) if train else (None, None)
    h_BxLxD, weights = encode(
        params, tokens_BxL, cfg, train=train, rng=r_encode, embed_delta_BxLxD=embed_delta_BxLxD
    )

    if cfg.pooling == "structured":
        structured = jax.vmap(pooling.structured, in_axes=(None, 0, 0))
        pooled_BxX, a_BxRxL, pen_B = structured(params["pool"], h_BxLxD, mask_BxL)
    else:
        pooled_BxX = jax.vmap(_SIMPLE_POOLS[cfg.pooling])(h_BxLxD, mask_BxL)  # X = D, or R*D
        a_BxRxL, pen_B = None, jnp.zeros((batch,), jnp.float32)
    read_BxG = tokens_BxL if bag_tokens_BxG is None else bag_tokens_BxG
    logits_BxC = head.logits(
        params,
        pooled_BxX,
        dropout=cfg.dropout,
        train=train,
        rng_pool=r_pool,
        bag_ids_OxBxG=bag_ids(read_BxG, cfg) if cfg.bag_buckets else None,
        bag_mask_BxG=read_BxG != PAD,
        bag_dropout=cfg.bag_dropout,
        rng_bag=rng,
    )
    nonempty_B = mask_BxL.any(-1).astype(jnp.float32)
    penalty = (pen_B * nonempty_B).sum() / jnp.maximum(nonempty_B.sum(), 1.0)
    return logits_BxC, head.aux(weights, a_BxRxL, penalty)


def attention_steps(
    params: dict, tokens_L: jax.Array, cfg: ModelConfig, *, layer: int = 0
) -> multihead.Steps:
    """Step-by-step values of layer `layer`'s self-attention on one sequence of ids [L], as in
    evaluation (no dropout), with the matrix form of cfg.score (`multihead.steps`).

    The blocks are pre-LayerNorm, so X is the layer's input after its first LayerNorm: the
    matrix that Wq, Wk and Wv multiply.
    """
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise TypeError(f"layer must be an int; got {layer!r}")
    if not 0 <= layer < cfg.num_layers:
        raise ValueError(f"layer must be in [0, {cfg.num_layers}); got {layer}")
    tokens_L = jnp.asarray(tokens_L)
    if tokens_L.ndim != 1:
        raise ValueError(f"tokens must be one sequence of ids [L]; got shape {tokens_L.shape}")
    tokens_1xL = _check_inputs(params, tokens_L[None], cfg, False, None)
    mask_L = tokens_1xL[0] != PAD
    x_LxD = embed(params, tokens_1xL, cfg)[0].astype(DTYPES[cfg.dtype])
    for i in range(layer):
        x_LxD, _ = encoder.apply(
            params[f"layer_{i}"], x_LxD, mask_L, num_heads=cfg.num_heads, attend=attend(cfg)
        )
    p = params[f"layer_{layer}"]
    return multihead.steps(
        p["mha"],
        layers.layer_norm(p["ln1"], x_LxD),
        mask_L,
        num_heads=cfg.num_heads,
        score=cfg.score,
    )
