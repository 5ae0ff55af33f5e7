"""Reading a Hugging Face model directory (config.json + weight files in any format
`attn.encoders.weights` reads) into a params tree, by
explicit rules: the part of checkpoint loading that every encoder family shares.

A family's rules map each stored tensor name (its prefix stripped) to where its values go:
``Rule(path, transpose, rows)``: the params path, whether the stored tensor is PyTorch's [out,
in] linear weight to transpose, and for a fused tensor (one stored matrix holding several params,
e.g. q, k and v) which rows of its first axis are this param's. `read` checks every name, shape
and dtype against the family's `init` (traced only), collects every fault and raises them
together in one line: a missing tensor, an unknown one, a wrong shape or a non-float parameter
is never a warning. What a family says to skip (buffers, task heads) is skipped by name and
reported. The loaded values are counted against the stored ones. `tensors` applies the same
rules backwards: the tensors a checkpoint of given params stores.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn.encoders import weights

__all__ = [
    "TOKENIZER_FILES",
    "CheckpointError",
    "Rule",
    "Stored",
    "config_json",
    "files_read",
    "local_dir",
    "param_count",
    "read",
    "stored",
    "tensors",
]

_log = logging.getLogger("attn.encoders")
# Downloaded with a hub id's weights, so that one download also serves its tokenizer: the files
# the families ship (tokenizers' tokenizer.json, WordPiece vocab.txt, DeBERTa-v3's spm.model) and
# the two that say how to read them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "spm.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


_FLOATS = ("F16", "F32", "F64", "BF16")


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message is one line naming every fault."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """Where one stored tensor's values go: params `path`; `transpose` for a PyTorch linear
    weight [out, in] applied here as x @ w with w [in, out]; `rows` (start, stop) of the stored
    tensor's first axis when one stored tensor holds several params."""

    path: tuple[str, ...]
    transpose: bool = False
    rows: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class Stored:
    """A stored tensor's file, shape and dtype, named as safetensors names them ("F32", "BF16",
    "I64", ...) whatever the file's format."""

    file: pathlib.Path
    shape: tuple[int, ...]
    dtype: str


def param_count(params: Any) -> int:
    """Number of values in a params tree."""
    return sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(params))


def local_dir(path: str | os.PathLike, patterns: Iterable[str] = ()) -> pathlib.Path:
    """A local directory as is; a path that looks local (absolute, ./ or ../, ~, or an existing
    file) and is not a directory says so; anything else is a Hugging Face hub id, downloaded
    with huggingface_hub when it is installed (config.json, the tokenizer files, `patterns` and
    the weights of the first format `weights.FORMATS` lists that the repository has)."""
    name = os.fspath(path)
    if os.path.isdir(name):
        return pathlib.Path(name)
    if os.path.exists(name):
        raise CheckpointError(f"{name} is a file; pass the model directory that holds it")
    if _looks_local(name):
        raise CheckpointError(f"{name}: no such directory")
    try:
        import huggingface_hub
    except ImportError:
        raise CheckpointError(
            f"{name} is not a local directory, and huggingface_hub is not installed to download "
            "it from the hub: pip install huggingface_hub, or pass a directory"
        ) from None
    # One format's files, in weights.FORMATS' order: a hub repository often holds several.
    first, *rest = weights.FORMATS
    try:
        local = pathlib.Path(
            huggingface_hub.snapshot_download(
                repo_id=name,
                allow_patterns=["config.json", *_patterns(first), *TOKENIZER_FILES, *patterns],
            )
        )
        for fmt in rest:
            if _has_weights(local):
                break
            huggingface_hub.snapshot_download(repo_id=name, allow_patterns=_patterns(fmt))
    except Exception as e:  # noqa: BLE001 (network, auth, a bad id: all one line here)
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{name} is no local directory, and as a hub id its download failed ({first_line}); "
            "pass a directory holding the model's files instead"
        ) from None
    return local


def _patterns(fmt: weights.Format) -> list[str]:
    """A format's file names on the hub: the single file, its shards and their index."""
    stem, suffix = fmt.single.rsplit(".", 1)
    return [f"{stem}*.{suffix}", fmt.index]


def _has_weights(directory: pathlib.Path) -> bool:
    try:
        weights.find(directory)
    except weights.WeightError:
        return False
    return True


def _looks_local(name: str) -> bool:
    """A hub id is "name" or "owner/name" of letters, digits and -_.; anything else is a path."""
    if name.startswith(("/", ".", "~")) or "\\" in name:
        return True
    parts = name.split("/")
    ok = all(p and all(c.isalnum() or c in "-_." for c in p) for p in parts)
    return len(parts) > 2 or not ok


def config_json(directory: pathlib.Path) -> dict:
    """config.json of a model directory; CheckpointError when it is missing or unreadable."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no config.json (a Hugging Face model directory)")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(hf, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return hf


def stored(directory: pathlib.Path, msgpack: bool = True) -> dict[str, Stored]:
    """Every tensor's name, file, shape and dtype, from the weight files' headers (the first
    format of `weights.FORMATS` the directory holds; `msgpack=False` passes over the Flax
    layout): nothing loaded but a .bin's pickle or a msgpack file."""
    out: dict[str, Stored] = {}
    try:
        _, files = weights.find(directory, msgpack=msgpack)
        for file in files:
            with weights.open_file(file) as f:
                for key in f.names():
                    out[key] = Stored(file, f.shape(key), f.dtype(key))
    except weights.WeightError as e:
        raise CheckpointError(str(e)) from None
    return out


def files_read(tensors: Mapping[str, Stored]) -> str:
    """The weight files `tensors` come from, for messages: "pytorch_model.bin", or the first
    shard's name and how many there are."""
    files = sorted({t.file.name for t in tensors.values()})
    return files[0] if len(files) == 1 else f"{files[0]} and {len(files) - 1} more shards"


@functools.lru_cache(maxsize=32)
def _shapes(init: Callable, cfg: Any) -> dict[tuple[str, ...], tuple[int, ...]]:
    """params path -> shape of `init(key, cfg)`, traced only."""
    tree = jax.eval_shape(functools.partial(init, cfg=cfg), jax.random.key(0))
    return {
        tuple(p.key for p in path): tuple(x.shape)
        for path, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def _stored_shape(
    parts: tuple[Rule, ...], shapes: Mapping[tuple[str, ...], tuple[int, ...]]
) -> tuple[int, ...] | None:
    """The stored shape the rules of one tensor imply (None when a path is not a param)."""
    wanted = []
    for r in parts:
        if r.path not in shapes:
            return None
        shape = shapes[r.path][::-1] if r.transpose else shapes[r.path]
        if r.rows is not None and shape[0] != r.rows[1] - r.rows[0]:
            return None
        wanted.append(shape)
    if len(wanted) == 1 and parts[0].rows is None:
        return wanted[0]
    return (parts[-1].rows[1], *wanted[0][1:])


def read(
    directory: pathlib.Path,
    tensors: Mapping[str, Stored],
    names: Mapping[str, str],
    rules: Mapping[str, tuple[Rule, ...]],
    skipped: Iterable[str],
    init: Callable,
    cfg: Any,
) -> dict:
    """The params tree `init(key, cfg)` describes, filled from the stored tensors.

    names: canonical name (the rules' key) -> stored name, for every stored tensor; skipped: the
    canonical names to leave out (buffers, task heads). CheckpointError naming every fault.
    """
    where = str(directory)
    skipped = set(skipped)
    shapes = _shapes(init, cfg)
    problems = []
    for name in sorted(set(rules) - set(names)):
        paths = ", ".join(".".join(r.path) for r in rules[name])
        problems.append(f"missing tensor {name} (for params {paths})")
    for name, key in sorted(names.items()):
        if name in skipped:
            continue
        if name not in rules:
            problems.append(f"unknown tensor {key}")
            continue
        t = tensors[key]
        want = _stored_shape(rules[name], shapes)
        if t.shape != want:
            problems.append(f"tensor {key} has shape {t.shape} where config.json implies {want}")
        if t.dtype not in _FLOATS:
            problems.append(f"tensor {key} has dtype {t.dtype}, not a float parameter")
    covered = {r.path for parts in rules.values() for r in parts}
    problems += [f"no rule fills params {'.'.join(p)}" for p in sorted(set(shapes) - covered)]
    if problems:
        raise CheckpointError(f"cannot load {where}: {'; '.join(problems)}")

    params: dict[str, Any] = {}
    by_file: dict[pathlib.Path, list[str]] = {}
    for name in rules:
        by_file.setdefault(tensors[names[name]].file, []).append(name)
    stored_values = 0
    try:
        for file, file_names in by_file.items():
            with weights.open_file(file) as f:
                for name in file_names:
                    x = np.asarray(f.get(names[name]), np.float32)
                    stored_values += x.size
                    for r in rules[name]:
                        part = x if r.rows is None else x[r.rows[0] : r.rows[1]]
                        node = params
                        for key in r.path[:-1]:
                            node = node.setdefault(key, {})
                        node[r.path[-1]] = jnp.asarray(part.T if r.transpose else part)
    except weights.WeightError as e:
        raise CheckpointError(str(e)) from None
    count = param_count(params)
    if count != stored_values or count != sum(int(np.prod(s)) for s in shapes.values()):
        raise CheckpointError(f"{where}: loaded {count} values, stored {stored_values}")
    left = sorted(names[n] for n in skipped if n in names)
    left_values = sum(int(np.prod(tensors[k].shape)) for k in left)
    _log.info(
        "%s: %s parameters in %d tensors of %s, the stored count; skipped %s",
        where,
        f"{count:,}",
        len(rules),
        files_read(tensors),
        f"{', '.join(left)} ({left_values:,} values)" if left else "nothing",
    )
    return params


def tensors(params: Any, rules: Mapping[str, tuple[Rule, ...]]) -> dict[str, np.ndarray]:
    """The float32 tensors [as stored: PyTorch's layout] that `rules` read into `params`: `read`
    backwards (transposed back, row blocks concatenated in order). KeyError naming a params path
    that `params` lacks."""
    out = {}
    for name, parts in rules.items():
        pieces = []
        for r in sorted(parts, key=lambda r: r.rows or (0, 0)):
            node = params
            for key in r.path:
                if not isinstance(node, Mapping) or key not in node:
                    raise KeyError(f"params have no {'.'.join(r.path)} (for tensor {name})")
                node = node[key]
            x = np.asarray(node, np.float32)
            pieces.append(x.T if r.transpose else x)
        whole = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)
        out[name] = np.ascontiguousarray(whole)
    return out
