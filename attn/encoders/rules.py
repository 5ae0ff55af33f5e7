"""Builders of a family's checkpoint rules (`attn.encoders.hub.Rule`): the PyTorch modules the
families store, each mapped to where its tensors go in attn's params.

PyTorch stores a Linear's weight [out, in] and attn applies x @ w with w [in, out], so a linear
layer's weight is transposed and its bias read as stored; a LayerNorm's weight is attn's scale.
"""

from __future__ import annotations

from collections.abc import Mapping

from attn.encoders.hub import Rule

__all__ = ["BERT_LINEARS", "BERT_NORMS", "block", "layer_norm", "linear"]

Rules = dict[str, tuple[Rule, ...]]

# BertLayer's modules (ELECTRA's layers keep the names) -> a post-LayerNorm block's params
# (`attn.encoders.blocks`).
BERT_LINEARS = {
    "attention.self.query": ("mha", "q"),
    "attention.self.key": ("mha", "k"),
    "attention.self.value": ("mha", "v"),
    "attention.output.dense": ("mha", "o"),
    "intermediate.dense": ("ff1",),
    "output.dense": ("ff2",),
}
BERT_NORMS = {"attention.output.LayerNorm": "ln_att", "output.LayerNorm": "ln_ff"}


def linear(name: str, path: tuple[str, ...]) -> Rules:
    """A PyTorch Linear `name` -> params `path` {"w": transposed, "b": as stored}."""
    return {
        f"{name}.weight": (Rule((*path, "w"), transpose=True),),
        f"{name}.bias": (Rule((*path, "b")),),
    }


def layer_norm(name: str, path: tuple[str, ...]) -> Rules:
    """A PyTorch LayerNorm `name` -> params `path` {"scale", "bias"}."""
    return {f"{name}.weight": (Rule((*path, "scale")),), f"{name}.bias": (Rule((*path, "bias")),)}


def block(
    name: str,
    path: tuple[str, ...],
    linears: Mapping[str, tuple[str, ...]],
    norms: Mapping[str, str],
) -> Rules:
    """One block's modules under `name`: each of `linears` (its name under `name` -> its path
    under `path`) and each of `norms` (likewise, one params entry)."""
    out: Rules = {}
    for sub, to in linears.items():
        out.update(linear(f"{name}.{sub}", (*path, *to)))
    for sub, to in norms.items():
        out.update(layer_norm(f"{name}.{sub}", (*path, to)))
    return out
