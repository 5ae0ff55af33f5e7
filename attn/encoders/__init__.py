"""Pretrained encoder families behind one registry, each computed by attn's own attention.

    params, cfg = attn.encoders.load("path/or/hub-id")        # any family below
    hidden_BxLxD = attn.encoders.encode(params, cfg, ids_BxL, mask_BxL)

Every family is one record (`Family`: its config, init, encode, checkpoint rules, classification
head, ...) in its own subpackage (a `model` module that computes it, a `checkpoint` module that
reads Hugging Face's files, a `head` module for its ...ForSequenceClassification head, read and
served by `attn.encoder_classifier`), named once in _PACKAGES. Code outside a family's modules
asks `family(cfg)` or `family(name)`, never the type of a config. `load` reads config.json's
model_type, picks the family, and maps every stored tensor by the family's rules
(`attn.encoders.hub`).

Token ids are the checkpoint's own; the mask is bool, True on real tokens (an int mask is
refused, as jax.nn refuses it: pass mask != 0).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
from typing import Any

import jax

from attn.attention import attention
from attn.encoders import family as _family
from attn.encoders import heads, hub
from attn.encoders.family import Family
from attn.encoders.hub import CheckpointError, Rule, param_count

__all__ = [
    "FAMILIES",
    "Checkpoint",
    "CheckpointError",
    "Family",
    "Rule",
    "encode",
    "family",
    "first_layers",
    "init",
    "load",
    "model_types",
    "open_checkpoint",
    "param_count",
    "read",
]

# One line per family: its subpackage of attn/encoders, whose FAMILY is its record.
_PACKAGES = (
    "bert",
    "distilbert",
    "electra",
    "modernbert",
    "deberta",
    "albert",
)
FAMILIES: dict[str, Family] = {
    f.name: f for f in (importlib.import_module(f"attn.encoders.{p}").FAMILY for p in _PACKAGES)
}
_BY_CONFIG = {f.config: f for f in FAMILIES.values()}
_BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in f.model_types}
# Legacy LayerNorm names of older checkpoints, read as today's.
_LEGACY = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def family(cfg_or_name: Any) -> Family:
    """The record of an encoder config, or of a family's name; ValueError for anything else."""
    if isinstance(cfg_or_name, str):
        if cfg_or_name not in FAMILIES:
            raise ValueError(
                f"no encoder family {cfg_or_name!r}; attn has {', '.join(sorted(FAMILIES))}"
            )
        return FAMILIES[cfg_or_name]
    found = _BY_CONFIG.get(type(cfg_or_name))
    if found is None:
        raise ValueError(
            f"{cfg_or_name!r} is no encoder config of a family attn has "
            f"({', '.join(sorted(FAMILIES))})"
        )
    return found


def model_types() -> str:
    """The config.json model_type values `load` reads, for messages."""
    return ", ".join(sorted(_BY_MODEL_TYPE))


def first_layers(params: dict, cfg: Any, n: int) -> tuple[dict, Any]:
    """The encoder of `cfg`'s first n depths (`attn.encoders.family.first_layers` with the
    family's layer_keys): (params without what only deeper depths read, cfg with num_layers=n);
    n=0 keeps the embeddings alone."""
    return _family.first_layers(params, cfg, n, family(cfg).layer_keys)


def init(key: jax.Array, cfg: Any) -> dict:
    """Random params of `cfg`'s family and sizes."""
    return family(cfg).init(key, cfg)


def encode(
    params: dict,
    cfg: Any,
    ids_BxL: jax.Array,
    mask_BxL: jax.Array,
    types_BxL: jax.Array | None = None,
    **kw: Any,
) -> Any:
    """The last hidden states [B, L, D] of `cfg`'s family (keywords: the family's encode's, e.g.
    attend=attn.Attention(implementation="chunked"), train=, rng=, return_weights=)."""
    kw.setdefault("attend", attention)
    return family(cfg).encode(params, cfg, ids_BxL, mask_BxL, types_BxL, **kw)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A Hugging Face model directory read as far as its headers (no tensor values): its
    config.json, the family its model_type names, the encoder config, every stored tensor's
    file, shape and dtype, and two maps to the stored names: `names` from the encoder's names
    (the task model's prefix stripped), `full` from the names as stored, each with legacy
    LayerNorm gamma / beta read as weight / bias."""

    directory: pathlib.Path
    hf: dict
    family: Family
    config: Any
    tensors: dict[str, hub.Stored]
    names: dict[str, str]
    full: dict[str, str]

    @property
    def where(self) -> str:
        return str(self.directory)

    @property
    def weights(self) -> str:
        """The weight file read ("pytorch_model.bin", ...), or the first of its shards."""
        return hub.files_read(self.tensors)


def _legacy(name: str) -> str:
    for old, new in _LEGACY.items():
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """A model directory or hub id of any registered family, its headers read; CheckpointError
    in one line for a model_type, architecture or option the family does not compute, or two
    stored tensors that are one parameter."""
    directory = hub.local_dir(path)
    where = str(directory)
    hf = hub.config_json(directory)
    model_type = hf.get("model_type")
    fam = _BY_MODEL_TYPE.get(model_type)
    if fam is None:
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is not supported; attn reads {model_types()}"
        )
    known = (*fam.architectures, heads.MEAN_POOLED)
    other = [a for a in hf.get("architectures") or () if a not in known]
    if other:
        raise CheckpointError(
            f"{where}: architecture {', '.join(other)} is not supported; attn reads "
            f"{', '.join(fam.architectures)} for model_type {model_type!r}"
        )
    tensors = hub.stored(directory, msgpack=fam.flax_layout)
    names: dict[str, str] = {}  # canonical name -> stored name
    full: dict[str, str] = {}
    problems = []
    for key in tensors:
        name = _legacy(next((key[len(p) :] for p in fam.prefixes if key.startswith(p)), key))
        if name in names:
            problems.append(f"tensors {names[name]} and {key} are the same parameter")
        names[name] = key
        full[_legacy(key)] = key
    if problems:
        raise CheckpointError(f"cannot load {where}: {'; '.join(problems)}")
    cfg = fam.from_hf(hf, frozenset(names), where)
    return Checkpoint(directory, hf, fam, cfg, tensors, names, full)


def load(path: str | os.PathLike) -> tuple[dict, Any]:
    """(params, cfg) from a Hugging Face model directory or hub id of any registered family:
    config.json and the weights in the first format the directory holds of model.safetensors,
    flax_model.msgpack (families transformers had a Flax class for) and pytorch_model.bin, single
    or sharded, each read without torch or transformers (`attn.encoders.weights`); float32 params
    whatever the stored float dtype. `read(open_checkpoint(path))`, for a caller that wants the
    checkpoint's record too (which file was read: `Checkpoint.weights`)."""
    ck = open_checkpoint(path)
    return read(ck), ck.config


def read(ck: Checkpoint) -> dict:
    """The encoder's params from an opened checkpoint. Every stored tensor is placed by the
    family's rules or skipped by name (buffers, task heads); a missing, unknown, wrongly shaped or
    non-float tensor is collected and raised together in one `CheckpointError`, as is a file
    that cannot be read. The parameter count is checked against the stored count and logged with
    the file and what was skipped (logger "attn.encoders", INFO). A sequence classifier with its
    head: `attn.encoder_classifier.load`."""
    fam, cfg = ck.family, ck.config
    skipped = [n for n in ck.names if fam.skip(n)]
    return hub.read(ck.directory, ck.tensors, ck.names, fam.rules(cfg), skipped, fam.init, cfg)
