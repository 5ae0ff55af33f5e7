"""A flax.linen twin of `attn.classifier` built from `nn.MultiHeadDotProductAttention`.

The train benchmark times it against our pure-function classifier: same embedding (tokens, hashed
n-grams, learned or sinusoidal positions), pre-LN blocks, final LayerNorm, pooling and linear head,
so the two have exactly the same parameter count and the same FLOPs; only the code differs.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from attn import bag, classifier, positions


class Block(nn.Module):
    """x = x + Dropout(MHA(LN(x))); x = x + Dropout(W2 GELU(W1 LN(x))). x [B, L, D]."""

    num_heads: int
    d_ff: int
    dropout: float

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, train: bool) -> jax.Array:
        d = x_BxLxD.shape[-1]
        h = nn.LayerNorm(epsilon=1e-6)(x_BxLxD)
        # Key padding mask only, as in attn.multihead: padding queries still attend to real keys.
        a = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, deterministic=True)(
            h, mask=mask_BxL[:, None, None, :]
        )
        x_BxLxD = x_BxLxD + nn.Dropout(self.dropout, deterministic=not train)(a)
        h = nn.gelu(nn.Dense(self.d_ff)(nn.LayerNorm(epsilon=1e-6)(x_BxLxD)))
        return x_BxLxD + nn.Dropout(self.dropout, deterministic=not train)(nn.Dense(d)(h))


class Classifier(nn.Module):
    """tokens int [B, L] (0 = PAD) -> (logits [B, C] float32, pooling penalty float32 scalar)."""

    cfg: classifier.ModelConfig

    @nn.compact
    def __call__(self, tokens_BxL: jax.Array, train: bool = False):
        cfg = self.cfg
        length = tokens_BxL.shape[1]
        mask_BxL = tokens_BxL != classifier.PAD
        x = nn.Embed(cfg.vocab_size, cfg.d_model, name="tokens")(tokens_BxL)
        if cfg.ngram_buckets:
            ids_OxBxL = classifier.ngram_buckets(tokens_BxL, cfg.ngram_orders, cfg.ngram_buckets)
            g = nn.Embed(cfg.ngram_buckets, cfg.d_model, name="ngrams")(ids_OxBxL).sum(0)
            x = x + jnp.where(mask_BxL[..., None], g, 0.0)
        if cfg.positions == "learned":
            init = nn.initializers.normal(0.02)
            x = x + self.param("positions", init, (cfg.max_len, cfg.d_model))[:length]
        elif cfg.positions == "sinusoidal":
            x = x + positions.sinusoidal(length, cfg.d_model)
        x = nn.Dropout(cfg.embed_dropout, deterministic=not train)(x)
        for _ in range(cfg.num_layers):
            x = Block(cfg.num_heads, cfg.d_ff, cfg.dropout)(x, mask_BxL, train)
        h = nn.LayerNorm(epsilon=1e-6)(x)
        m = mask_BxL[..., None].astype(jnp.float32)
        penalty = jnp.zeros((), jnp.float32)
        if cfg.pooling == "mean":
            pooled = (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
        elif cfg.pooling == "max":
            pooled = jnp.where(m > 0, h, jnp.finfo(h.dtype).min).max(1)
            pooled = jnp.where(m.sum(1) > 0, pooled, 0.0)
        elif cfg.pooling == "cls":
            pooled = h[:, 0] * m[:, 0]
        else:  # structured (Lin et al. 2017)
            s = jnp.tanh(nn.Dense(cfg.pool_hidden, use_bias=False)(h))
            e_BxLxR = nn.Dense(cfg.pool_hops, use_bias=False)(s)
            a_BxRxL = nn.softmax(jnp.where(m > 0, e_BxLxR, -1e30), axis=1).swapaxes(1, 2)
            a_BxRxL = a_BxRxL * mask_BxL[:, None, :]
            pooled = jnp.einsum("brl,bld->brd", a_BxRxL, h).reshape(h.shape[0], -1)
            g_BxRxR = a_BxRxL @ a_BxRxL.swapaxes(1, 2)
            eye = jnp.eye(cfg.pool_hops, dtype=jnp.float32)
            penalty = jnp.square(g_BxRxR - eye).sum((1, 2)).mean()
        pooled = nn.Dropout(cfg.dropout, deterministic=not train)(pooled)
        logits = nn.Dense(cfg.num_classes, name="head")(pooled)
        if cfg.bag_buckets:  # a linear model, not attention: the same function as ours
            table = self.param("bag", nn.initializers.zeros, (cfg.bag_buckets, cfg.num_classes))
            ids = classifier.ngram_buckets(tokens_BxL, cfg.bag_orders, cfg.bag_buckets)
            drop = cfg.bag_dropout if train else 0.0
            rng = self.make_rng("dropout") if drop else None
            logits = logits + bag.logits(table, ids, mask_BxL, dropout=drop, train=train, rng=rng)
        return logits, penalty


def init_state(key: jax.Array, cfg: classifier.ModelConfig, tx: optax.GradientTransformation, L):
    """{"params", "opt_state", "step", "rng"} like `experiments.training.optim.init_state`."""
    init_key, dropout_key = jax.random.split(key)
    params = Classifier(cfg).init(init_key, jnp.ones((1, L), jnp.int32))["params"]
    return {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.zeros([], jnp.int32),
        "rng": dropout_key,
    }


def train_step(state, batch, *, cfg, tx, penalty_weight: float):
    """One AdamW step on weighted cross-entropy (+ penalty); jit it over a functools.partial."""
    rng = jax.random.fold_in(state["rng"], state["step"])

    def loss_fn(params):
        logits_BxC, penalty = Classifier(cfg).apply(
            {"params": params}, batch["tokens"], train=True, rngs={"dropout": rng}
        )
        onehot_BxC = jax.nn.one_hot(batch["label"], cfg.num_classes)
        ce_B = optax.softmax_cross_entropy(logits_BxC, onehot_BxC)
        w_B = batch["weight"]
        return (ce_B * w_B).sum() / jnp.maximum(w_B.sum(), 1.0) + penalty_weight * penalty

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {**state, "params": params, "opt_state": opt_state, "step": state["step"] + 1}, loss
