"""Fine-tuning a pretrained checkpoint of any family attn reads (`model.pretrained`): what the
classification objective (`classify`) needs to train `attn.encoder_classifier` instead of
`attn.classifier`, through the same setup, loop, checkpoints and commands.

`load` reads the checkpoint (`attn.encoders.load`; its first model.pretrained_layers, random
weights with model.pretrained_init=random) and its own tokenizer (`checkpoint_tokenizer`);
`model_config` makes the frozen `encoder_classifier.Config` from it and config.model (pooling,
the head's dropout, the attention implementation, dtype, the bag); `init_params` puts the
checkpoint's encoder, exactly as stored, beside a fresh head (and the bag's starting table);
`warm` marks the encoder for optim.warm_lr_scale and `layer_scales` gives optim.layer_decay's
per-layer factors.
"""

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections

from attn import encoder_classifier, encoders
from experiments.data import checkpoint_tokenizer
from experiments.errors import UserError


def requested(config: ml_collections.ConfigDict) -> bool:
    return bool(config.model.get("pretrained"))


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A checkpoint to fine-tune: its directory, encoder params and config, and tokenizer."""

    directory: str
    params: dict
    encoder: Any  # the family's config (`attn.encoders`)
    tokenizer: checkpoint_tokenizer.CheckpointTokenizer
    weights: str  # the weight file read ("model.safetensors", "pytorch_model.bin", ...)
    random: bool = False  # model.pretrained_init=random: its architecture, random weights

    @property
    def layer_keys(self) -> tuple[str, ...]:
        """The encoder params entry each depth reads, in order (its family's)."""
        return encoders.family(self.encoder).layer_keys(self.encoder)

    def describe(self) -> str:
        e = self.encoder
        start = "training from random weights" if self.random else "fine-tuning"
        return (
            f"{start} {self.directory} ({self.weights}): {encoders.family(e).name}, "
            f"{e.num_layers} layers, "
            f"d_model {e.d_model}, {e.num_heads} heads, "
            f"{encoders.param_count(self.params):,} parameters, vocabulary {e.vocab_size}, "
            f"dropout {e.dropout}/{e.attention_dropout} (its own)"
        )


def load(config: ml_collections.ConfigDict) -> Pretrained:
    """model.pretrained read: UserError in one line when it is not a checkpoint this can tune."""
    tok = checkpoint_tokenizer.for_config(config)
    directory = config.model.pretrained
    try:
        ck = encoders.open_checkpoint(directory)
        params, enc = encoders.read(ck), ck.config
    except encoders.CheckpointError as e:
        raise UserError(f"model.pretrained: {e}") from None
    keep = config.model.pretrained_layers
    if keep > enc.num_layers:
        raise UserError(
            f"model.pretrained_layers={keep}: {directory!r} has {enc.num_layers} layers"
        )
    if keep >= 0:
        params, enc = encoders.first_layers(params, enc, keep)
    if tok.vocab_size > enc.vocab_size:
        raise UserError(
            f"model.pretrained={directory!r}: its tokenizer has {tok.vocab_size} ids but the "
            f"encoder's table only {enc.vocab_size} rows"
        )
    random = config.model.pretrained_init == "random"
    return Pretrained(directory, params, enc, tok, ck.weights, random)


def model_config(
    config: ml_collections.ConfigDict, encoder: Any, num_classes: int
) -> encoder_classifier.Config:
    """The frozen config: the checkpoint's encoder (its dropout; config.model.dtype) and
    config.model's pooling, head dropout, attention implementation and bag; attention dropout is
    dropped (and said) for an implementation that forms no weights."""
    m = config.model
    enc = dataclasses.replace(encoder, dtype=m.dtype)
    if m.implementation != "matrix" and enc.attention_dropout:
        print(
            f"attention dropout {enc.attention_dropout} off: implementation {m.implementation!r} "
            "forms no attention weights to drop",
            file=sys.stderr,
        )
        enc = dataclasses.replace(enc, attention_dropout=0.0)
    try:
        return encoder_classifier.Config(
            encoder=enc,
            num_classes=num_classes,
            max_len=config.data.max_len,
            pooling=m.pooling,
            dropout=m.dropout,
            implementation=m.implementation,
            bag_buckets=m.bag_buckets,
            bag_orders=m.bag_orders,
            bag_dropout=m.bag_dropout,
        )
    except ValueError as e:
        raise UserError(f"model.pretrained: {e}") from None


def init_params(
    pre: Pretrained,
    cfg: encoder_classifier.Config,
    bag_start: Callable[[], jax.Array] | None = None,
) -> Callable[[jax.Array, bool], dict]:
    """(key, fresh) -> params: the checkpoint's encoder as stored (random with pre.random), a
    fresh head, and the bag's table from bag_start() (e.g. `bag_prior.naive_bayes`; zeros
    without it). A resumed run's are overwritten, so it gets random ones of the same shapes and
    counts nothing."""

    def make(key: jax.Array, fresh: bool) -> dict:
        params = encoder_classifier.init(key, cfg)
        if fresh and not pre.random:
            params["encoder"] = pre.params
        if fresh and bag_start is not None:
            params["bag"] = bag_start()
        return params

    return make


def warm(params: Any) -> Any:
    """True on the encoder's params: what the run starts from (optim.warm_lr_scale)."""
    return {k: _filled(v, k == "encoder") for k, v in params.items()}


def _filled(tree: Any, value: Any) -> Any:
    """`tree`'s structure with `value` at every leaf."""
    return jax.tree.map(lambda _: value, tree)


def layer_scales(keys: Sequence[str], decay: float) -> Callable[[Any], Any] | None:
    """params -> each parameter's learning-rate factor under layer-wise decay, for an encoder
    whose depths read the params entries `keys` in order (its family's layer_keys): 1 for the
    head (and the pooler above the layers), decay**(n - i) for the entry depth i of n reads (a
    shared entry: its deepest, so it learns as fast as the top), decay**(n + 1) for the
    embeddings. None at decay 1 (off)."""
    if decay == 1:
        return None
    n = len(keys)
    deepest = {key: i for i, key in enumerate(keys)}

    def depth_factor(name: str) -> float:
        if name == "embed":
            return decay ** (n + 1)
        if name in deepest:
            return decay ** (n - deepest[name])
        return 1.0  # the pooler

    def scales(params: Any) -> Any:
        out = {k: _filled(v, 1.0) for k, v in params.items() if k != "encoder"}
        out["encoder"] = {k: _filled(v, depth_factor(k)) for k, v in params["encoder"].items()}
        return out

    return scales
