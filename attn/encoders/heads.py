"""A family's sequence-classification head: what its ...ForSequenceClassification computes
between the encoder's last hidden states and the final dropout + linear layer (`attn.head`), and
the names that class stores its tensors under. Each family's `head` module builds its `Head`:
most from one of the two builders here, `dense_head` (a dense layer and its activation on the
first token) and `pooler_head` (the base model's own pooler).

    h = encode(ids)                           [B, L, D]
    v = head.apply(pool, encoder, h, mask)    [B, D]    e.g. tanh(W h[:, 0] + b) (BERT's pooler),
                                                        W2 GELU(W1 Dropout(h[:, 0])) ... (ELECTRA)
    logits = W Dropout(v) + b                 [B, C]    attn.head: the class's final layer

The head's own params are the classifier's "pool" entry (none when it has none of its own:
BERT's pooler is part of the encoder when the checkpoint has one). A checkpoint that stores them
(a classifier, or ModernBERT's masked-LM head, which has the same names) gives them to a
fine-tune, as transformers keeps them; otherwise they are drawn afresh, as transformers draws
them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from attn import layers
from attn.encoders.hub import Rule
from attn.encoders.rules import linear

__all__ = [
    "ACTIVATIONS",
    "MEAN_POOLED",
    "Classes",
    "Head",
    "activation",
    "dense_head",
    "final_linear",
    "fixed_pooling",
    "pooler_head",
    "under",
]

# The transformers class attn writes (as code beside the checkpoint) for a classifier that
# mean-pools over a family whose own class does not: base model, masked mean, dropout and a
# linear layer `classifier`.
MEAN_POOLED = "MeanPooledForSequenceClassification"

# Hugging Face's names of the activations a head may apply (config.json's pooler_hidden_act,
# classifier_activation) -> the function: "gelu" is the exact (erf) form, as transformers has it.
ACTIVATIONS: Mapping[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """The activation named as config.json names it; ValueError naming the ones attn computes."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not one attn computes ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


@dataclasses.dataclass(frozen=True)
class Classes:
    """The transformers classes of a family's classifier, by name (attn never imports them):
    `classifier`, its standard ...ForSequenceClassification; `prefix`, what that class puts
    before its encoder's tensor names (its base_model_prefix and a dot); `module`, `base` and
    `pretrained`, the module, base model and PreTrainedModel a class of another pooling
    subclasses; `no_pooler`, whether the base model takes add_pooling_layer=False."""

    classifier: str
    prefix: str
    module: str
    base: str
    pretrained: str
    no_pooler: bool = False


@dataclasses.dataclass(frozen=True)
class Head:
    """One family's sequence-classification head.

    poolings: the classifier poolings this head computes ("cls": the class's own reading of the
      first token; ModernBERT's "mean" too, its classifier_pooling). Another pooling is attn's
      plain mean over real tokens, with no head of the family's.
    init(key, config, pooling) -> the head's params (the classifier's "pool"; {} for none),
      drawn as transformers draws a fresh head.
    apply(pool, encoder, config, h_BxLxD, mask_BxL, pooling, *, dropout, train, rng) -> [B, D]:
      pool, encoder: the head's and the encoder's params; dropout: the classifier's rate, for the
      dropouts inside the head (RoBERTa's, ELECTRA's: the class uses one rate for both);
      rng: the classifier's dropout key (the head derives its own from it).
    classes(config) -> `Classes`: the transformers classes of this config's model type.
    encoder(config, pooling) -> the encoder config as the classifier of `pooling` holds it
      (RoBERTa's has no pooler; nor has a mean-pooled BERT's).
    rules(config, pooling) -> {stored name: (Rule, ...)}: the class's tensors that are not its
      encoder's, paths into the classifier's params: ("pool", ...) and the final linear layer
      ("head", "w" | "b").
    from_hf(config.json, where) -> the pooling a classifier checkpoint computes; CheckpointError
      in one line for a head attn does not compute.
    to_hf(config, pooling) -> the config.json keys that make transformers build this head.
    """

    poolings: tuple[str, ...]
    init: Callable[[jax.Array, Any, str], dict]
    apply: Callable[..., jax.Array]
    classes: Callable[[Any], Classes]
    rules: Callable[[Any, str], dict[str, tuple[Rule, ...]]]
    from_hf: Callable[[Mapping[str, Any], str], str]
    to_hf: Callable[[Any, str], dict]
    encoder: Callable[[Any, str], Any] = lambda config, pooling: config


def under(prefix: str, rules: Mapping[str, tuple[Rule, ...]]) -> dict[str, tuple[Rule, ...]]:
    """An encoder's rules inside a task model: names after `prefix`, paths under "encoder"."""
    return {
        prefix + name: tuple(dataclasses.replace(r, path=("encoder", *r.path)) for r in parts)
        for name, parts in rules.items()
    }


def final_linear(name: str) -> dict[str, tuple[Rule, ...]]:
    """The class's last linear layer `name` ([C, D] weight and [C] bias) -> attn.head's params."""
    return {
        f"{name}.weight": (Rule(("head", "w"), transpose=True),),
        f"{name}.bias": (Rule(("head", "b")),),
    }


def fixed_pooling(hf: Mapping[str, Any], where: str) -> str:
    """from_hf of a head that always reads the first token: "cls"."""
    del hf, where
    return "cls"


def _dense_init(key: jax.Array, cfg: Any) -> dict:
    """{"dense": a D -> D linear layer as transformers draws one}: w ~ N(0, initializer_range²)
    [D, D], bias 0."""
    w = cfg.initializer_range * jax.random.normal(key, (cfg.d_model, cfg.d_model), jnp.float32)
    return {"dense": {"w": w, "b": jnp.zeros((cfg.d_model,), jnp.float32)}}


def dense_head(
    classes: Callable[[Any], Classes],
    dense: str,
    final: str,
    act: Callable[[Any], Callable[[jax.Array], jax.Array]],
    *,
    drops_input: bool = False,
    from_hf: Callable[[Mapping[str, Any], str], str] | None = None,
    to_hf: Callable[[Any, str], dict] | None = None,
    encoder: Callable[[Any, str], Any] | None = None,
) -> Head:
    """The head that reads the first token through its own D -> D linear layer `dense` (the
    stored name) and act(config), then the final linear layer `final`:

        v = act(dense(Dropout(h[:, 0])))          [B, D]

    the first token dropped out at the classifier's rate only with drops_input (RoBERTa's and
    ELECTRA's classification heads; DistilBERT's pre_classifier and DeBERTa's ContextPooler
    drop nothing there). Its params: {"dense": {"w", "b"}}, drawn as transformers draws them.
    from_hf, to_hf and encoder as `Head` has them (by default: always "cls", no config.json
    keys, the encoder as it is)."""

    def init(key: jax.Array, cfg: Any, pooling: str) -> dict:
        del pooling
        return _dense_init(key, cfg)

    def apply(
        pool: dict,
        params: dict,
        cfg: Any,
        h_BxLxD: jax.Array,
        mask_BxL: jax.Array,
        pooling: str,
        *,
        dropout: float,
        train: bool,
        rng: jax.Array | None,
    ) -> jax.Array:
        del params, mask_BxL, pooling
        rng = None if rng is None else jax.random.fold_in(rng, 1)  # rng itself drops v
        rate = dropout if drops_input else 0.0
        x_BxD = layers.dropout(h_BxLxD[:, 0], rate, train=train, rng=rng)
        return act(cfg)(layers.dense(pool["dense"], x_BxD))

    def rules(cfg: Any, pooling: str) -> dict[str, tuple[Rule, ...]]:
        del cfg, pooling
        return {**linear(dense, ("pool", "dense")), **final_linear(final)}

    return Head(
        poolings=("cls",),
        init=init,
        apply=apply,
        classes=classes,
        rules=rules,
        from_hf=fixed_pooling if from_hf is None else from_hf,
        to_hf=(lambda cfg, pooling: {}) if to_hf is None else to_hf,
        encoder=(lambda cfg, pooling: cfg) if encoder is None else encoder,
    )


def pooler_head(classes: Callable[[Any], Classes], own: str) -> Head:
    """The head of a base model with a pooler (BERT's, ALBERT's): tanh(W h[:, 0] + b), then the
    final linear layer `classifier`. The pooler is the base model's, so the encoder's params hold
    it ("pooler") when the checkpoint has one (the config's `pooler`) and the head has no params;
    over a checkpoint without one the head draws its own, stored back as `own` (the pooler's
    name in the class). A classifier of another pooling holds no pooler."""

    def init(key: jax.Array, cfg: Any, pooling: str) -> dict:
        del pooling
        return {} if cfg.pooler else _dense_init(key, cfg)

    def apply(
        pool: dict,
        params: dict,
        cfg: Any,
        h_BxLxD: jax.Array,
        mask_BxL: jax.Array,
        pooling: str,
        *,
        dropout: float,
        train: bool,
        rng: jax.Array | None,
    ) -> jax.Array:
        del mask_BxL, pooling, dropout, train, rng
        pooler = params["pooler"] if cfg.pooler else pool["dense"]
        return jnp.tanh(layers.dense(pooler, h_BxLxD[:, 0]))

    def rules(cfg: Any, pooling: str) -> dict[str, tuple[Rule, ...]]:
        del pooling
        return {
            **({} if cfg.pooler else linear(own, ("pool", "dense"))),
            **final_linear("classifier"),
        }

    def encoder(cfg: Any, pooling: str) -> Any:
        return cfg if pooling == "cls" else dataclasses.replace(cfg, pooler=False)

    return Head(
        poolings=("cls",),
        init=init,
        apply=apply,
        classes=classes,
        rules=rules,
        from_hf=fixed_pooling,
        to_hf=lambda cfg, pooling: {},
        encoder=encoder,
    )
