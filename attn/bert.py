"""The BERT encoder (BERT, RoBERTa, XLM-RoBERTa) under the name earlier code imports: its model
functions are `attn.encoders.bert.model`'s, its checkpoint rules `attn.encoders.bert.checkpoint`'s,
and `load` is `attn.encoders.load` for these three model types. Other families:
`attn.encoders`."""

from __future__ import annotations

import os

from attn import encoders
from attn.encoders.bert.checkpoint import ARCHITECTURES
from attn.encoders.bert.model import (
    Config,
    attention_steps,
    embed,
    encode,
    init,
    input_embeddings,
    pool,
    positions,
)
from attn.encoders.family import first_layers
from attn.encoders.hub import CheckpointError, param_count

__all__ = [
    "ARCHITECTURES",
    "CheckpointError",
    "Config",
    "attention_steps",
    "embed",
    "encode",
    "first_layers",
    "init",
    "input_embeddings",
    "load",
    "param_count",
    "pool",
    "positions",
]


def load(path: str | os.PathLike) -> tuple[dict, Config]:
    """(params, cfg) of a BERT, RoBERTa or XLM-RoBERTa directory or hub id
    (`attn.encoders.load`); CheckpointError for another family's checkpoint."""
    params, cfg = encoders.load(path)
    if not isinstance(cfg, Config):
        name = encoders.family(cfg).name
        raise CheckpointError(f"{path} is a {name} checkpoint; read it with attn.encoders.load")
    return params, cfg
