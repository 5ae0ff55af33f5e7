"""Reading a Hugging Face model directory (config.json + safetensors) into a params tree, by
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

__all__ = [
    "TOKENIZER_FILES",
    "CheckpointError",
    "Rule",
    "Stored",
    "config_json",
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
    """A stored tensor's file, shape and safetensors dtype name ("F32", "BF16", "I64", ...)."""

    file: pathlib.Path
    shape: tuple[int, ...]
    dtype: str


def param_count(params: Any) -> int:
    """Number of values in a params tree."""
    return sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(params))


def local_dir(path: str | os.PathLike, patterns: Iterable[str] = ()) -> pathlib.Path:
    """A local directory as is; a path that looks local (absolute, ./ or ../, ~, or an existing
    file) and is not a directory says so; anything else is a Hugging Face hub id, downloaded
    with huggingface_hub when it is installed (config.json, the safetensors files, the
    tokenizer files and `patterns`)."""
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
    wanted = [
        "config.json",
        "*.safetensors",
        "model.safetensors.index.json",
        *TOKENIZER_FILES,
        *patterns,
    ]
    try:
        local = huggingface_hub.snapshot_download(repo_id=name, allow_patterns=wanted)
    except Exception as e:  # noqa: BLE001 (network, auth, a bad id: all one line here)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{name} is no local directory, and as a hub id its download failed ({first}); pass "
            "a directory holding the model's files instead"
        ) from None
    return pathlib.Path(local)


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


def _weight_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The safetensors files of a model directory (one, or the shards an index names)."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a safetensors index: {e}") from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(f"{directory}: shards named by its index are missing: {missing}")
        return [directory / s for s in shards]
    others = [
        n
        for n in ("pytorch_model.bin", "flax_model.msgpack", "tf_model.h5")
        if (directory / n).exists()
    ]
    if others:
        raise CheckpointError(
            f"{directory} has {', '.join(others)} but no model.safetensors, and attn reads only "
            "safetensors (no torch): convert it once with transformers, "
            "AutoModel.from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)"
        )
    raise CheckpointError(f"{directory} has no model.safetensors (nor a sharded index)")


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError:
        raise CheckpointError(
            "reading a checkpoint needs safetensors: pip install safetensors (or attn[bert])"
        ) from None
    return safe_open


def stored(directory: pathlib.Path) -> dict[str, Stored]:
    """Every tensor's name, file, shape and dtype, from the safetensors headers (nothing loaded)."""
    safe_open = _safe_open()
    out: dict[str, Stored] = {}
    for file in _weight_files(directory):
        try:
            with safe_open(os.fspath(file), framework="numpy") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    out[key] = Stored(file, tuple(sl.get_shape()), sl.get_dtype())
        except (OSError, ValueError, RuntimeError) as e:  # safetensors raises its own errors
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"{file} is not a readable safetensors file: {first}") from None
    return out


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
        if t.dtype[0] not in "FB":  # F16, F32, F64, BF16
            problems.append(f"tensor {key} has dtype {t.dtype}, not a float parameter")
    covered = {r.path for parts in rules.values() for r in parts}
    problems += [f"no rule fills params {'.'.join(p)}" for p in sorted(set(shapes) - covered)]
    if problems:
        raise CheckpointError(f"cannot load {where}: {'; '.join(problems)}")

    safe_open = _safe_open()
    params: dict[str, Any] = {}
    by_file: dict[pathlib.Path, list[str]] = {}
    for name in rules:
        by_file.setdefault(tensors[names[name]].file, []).append(name)
    stored_values = 0
    for file, file_names in by_file.items():
        with safe_open(os.fspath(file), framework="numpy") as f:
            for name in file_names:
                x = np.asarray(f.get_tensor(names[name]), np.float32)
                stored_values += x.size
                for r in rules[name]:
                    part = x if r.rows is None else x[r.rows[0] : r.rows[1]]
                    node = params
                    for key in r.path[:-1]:
                        node = node.setdefault(key, {})
                    node[r.path[-1]] = jnp.asarray(part.T if r.transpose else part)
    count = param_count(params)
    if count != stored_values or count != sum(int(np.prod(s)) for s in shapes.values()):
        raise CheckpointError(f"{where}: loaded {count} values, stored {stored_values}")
    left = sorted(names[n] for n in skipped if n in names)
    left_values = sum(int(np.prod(tensors[k].shape)) for k in left)
    _log.info(
        "%s: %s parameters in %d tensors, the stored count; skipped %s",
        where,
        f"{count:,}",
        len(rules),
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
