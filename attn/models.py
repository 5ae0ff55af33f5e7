"""attn's two classifiers behind one dispatch: its own self-attention model (`attn.classifier`)
and a classifier over a pretrained encoder (`attn.encoder_classifier`). Both modules have `init`,
`apply`, `embed`, `bag_ids` and `attention_steps` with the same signatures; this is the one
place that tells which a config belongs to.

A saved run records `family(cfg)` ("attn", or the encoder family's name, e.g. "bert") and its
config's fields; `config(family, fields)` builds the config again.
"""

import dataclasses
from types import ModuleType
from typing import NamedTuple

from attn import classifier, encoder_classifier, encoders
from attn.encoders.family import PROJECTED_QK

__all__ = [
    "OWN",
    "PROJECTED_QK",
    "AnyConfig",
    "Layout",
    "config",
    "defaults",
    "exact_vocabulary",
    "family",
    "layout",
    "module",
    "steps_input",
    "steps_qk",
    "vocab_rows",
]

OWN = "attn"  # the family name of attn's own model
AnyConfig = classifier.ModelConfig | encoder_classifier.Config


def _pretrained(cfg: AnyConfig) -> bool:
    return isinstance(cfg, encoder_classifier.Config)


def module(cfg: AnyConfig) -> ModuleType:
    """The module whose init, apply, embed, bag_ids and attention_steps serve `cfg`."""
    return encoder_classifier if _pretrained(cfg) else classifier


def family(cfg: AnyConfig) -> str:
    """ "attn" for attn's own model, else the pretrained encoder's family name."""
    return encoders.family(cfg.encoder).name if _pretrained(cfg) else OWN


def config(family_name: str, fields: dict) -> AnyConfig:
    """The config `fields` (a config's `dataclasses.asdict`, as JSON holds it) describe for a
    model of `family_name`; TypeError, ValueError or KeyError when they describe none."""
    tuples = {k: tuple(v) for k, v in fields.items() if k.endswith("_orders")}  # JSON: lists
    if family_name == OWN:
        return classifier.ModelConfig(**{**fields, **tuples})
    enc = encoders.family(family_name).config(**fields["encoder"])
    return encoder_classifier.Config(**{**fields, **tuples, "encoder": enc})


def defaults(family_name: str) -> dict:
    """The default of every config field that has one, for a model of `family_name`: what a
    field missing from an older record stood for."""
    config_type = classifier.ModelConfig if family_name == OWN else encoder_classifier.Config
    return {
        f.name: f.default
        for f in dataclasses.fields(config_type)
        if f.default is not dataclasses.MISSING
    }


class Layout(NamedTuple):
    """A model's attention: layers, heads per layer, and its score in attn's terms."""

    num_layers: int
    num_heads: int
    score: str


def layout(cfg: AnyConfig) -> Layout:
    """(layers, heads, score) of either classifier: attn's own, or the encoder's (the score its
    family's checkpoints compute, `attn.encoders.Family.score`)."""
    if _pretrained(cfg):
        e = cfg.encoder
        return Layout(e.num_layers, e.num_heads, encoders.family(e).score)
    return Layout(cfg.num_layers, cfg.num_heads, cfg.score)


def steps_input(cfg: AnyConfig, layer: int) -> str:
    """What X is in the step-by-step figure of `layer`."""
    if _pretrained(cfg):
        return encoders.family(cfg.encoder).steps_input(cfg.encoder, layer)
    if layer > 0:
        return f"X: layer {layer - 1}'s output after LayerNorm"
    parts = ["token"] + (["n-gram"] if cfg.ngram_buckets else [])
    parts += [] if cfg.positions == "none" else ["position"]
    return f"X: {' + '.join(parts)} embeddings after LayerNorm"


def steps_qk(cfg: AnyConfig, layer: int) -> tuple[str, str]:
    """The titles of Q and K in the step-by-step figure of `layer`: X's projections for attn's
    own model, what the family's layer computes for a pretrained encoder (e.g. rotated)."""
    if _pretrained(cfg):
        return encoders.family(cfg.encoder).steps_qk(cfg.encoder, layer)
    return PROJECTED_QK


def vocab_rows(cfg: AnyConfig) -> int:
    """The rows of the model's token table: ids a tokenizer may give it."""
    return cfg.encoder.vocab_size if _pretrained(cfg) else cfg.vocab_size


def exact_vocabulary(cfg: AnyConfig) -> bool:
    """Whether the tokenizer must have exactly `vocab_rows` ids (attn's own model, built from its
    tokenizer) rather than at most (a checkpoint's table may have spare rows)."""
    return not _pretrained(cfg)
