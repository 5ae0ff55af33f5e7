"""The weight files of a Hugging Face model directory, in the three formats hub checkpoints ship,
read without the framework that wrote them and without running anything from the file.

In the order a directory's files are preferred:
  safetensors  model.safetensors, or the shards model.safetensors.index.json names (safetensors'
               numpy reader);
  msgpack      flax_model.msgpack (or its index's shards): the Flax layout transformers <= 4.x
               wrote, read with flax's msgpack reader, its names and layouts turned into
               PyTorch's (a Dense `kernel` [in, out] becomes `weight` [out, in], LayerNorm's
               `scale` and an Embed's `embedding` become `weight`), so that one family's rules
               read every format; only for families transformers had a Flax class for;
  pytorch      pytorch_model.bin (or its index's shards): torch's zip format, a pickle that names
               each tensor's storage, dtype, offset, shape and strides, and the raw storages. The
               pickle is read by an unpickler that resolves only the globals a plain state dict
               names (torch's tensor rebuild function, its storage types and OrderedDict) to
               functions of this module; any other global is refused before anything is called.
               float32, float16, bfloat16 and float64 storages are read; a tensor that reaches
               outside its storage is refused. The legacy (pre-zip, torch < 1.6) format is
               refused with how to convert it.

`find(directory, msgpack=...)` picks the files; `open_file(path)` reads one of them: its tensor
names, each one's shape and dtype name (safetensors' names: "F32", "BF16", "I64", ...), and the
values as numpy arrays in PyTorch's layout.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import pickle
import zipfile
from collections.abc import Iterator
from typing import Protocol

import ml_dtypes
import numpy as np

__all__ = ["FORMATS", "Format", "WeightError", "WeightFile", "find", "open_file"]


class WeightError(ValueError):
    """A weight file that cannot be read; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Format:
    """One format: its name, its single file's name and its sharded index's name."""

    name: str
    single: str
    index: str

    @property
    def suffix(self) -> str:
        return pathlib.Path(self.single).suffix


FORMATS = (
    Format("safetensors", "model.safetensors", "model.safetensors.index.json"),
    Format("msgpack", "flax_model.msgpack", "flax_model.msgpack.index.json"),
    Format("pytorch", "pytorch_model.bin", "pytorch_model.bin.index.json"),
)
_BY_SUFFIX = {f.suffix: f for f in FORMATS}
# Named in messages about a directory with none of the formats above.
_UNREAD = ("tf_model.h5", "model.ckpt.index", "consolidated.pth")


def find(directory: pathlib.Path, msgpack: bool = True) -> tuple[Format, list[pathlib.Path]]:
    """The first format in FORMATS that `directory` holds, and its files (one, or the shards its
    index names); `msgpack=False` passes over the Flax layout (a family transformers had no Flax
    class for). WeightError naming the files looked for when there are none, or an index that is
    unreadable or names missing shards."""
    for fmt in FORMATS:
        if fmt.name == "msgpack" and not msgpack:
            continue
        if (directory / fmt.single).is_file():
            return fmt, [directory / fmt.single]
        index = directory / fmt.index
        if index.is_file():
            return fmt, _shards(directory, index)
    flax_only = not msgpack and (directory / FORMATS[1].single).is_file()
    looked = [n for f in FORMATS if msgpack or f.name != "msgpack" for n in (f.single, f.index)]
    other = [n for n in _UNREAD if (directory / n).exists()]
    raise WeightError(
        f"{directory} has no weights attn reads: looked for {', '.join(looked)}"
        + (
            "; its flax_model.msgpack is the Flax layout, which this model type never had"
            if flax_only
            else ""
        )
        + (f" (it has {', '.join(other)}, which attn does not read)" if other else "")
    )


def _shards(directory: pathlib.Path, index: pathlib.Path) -> list[pathlib.Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise WeightError(f"{index} is not a weight index: {e}") from None
    missing = [s for s in shards if not (directory / s).is_file()]
    if missing:
        raise WeightError(f"{directory}: shards named by its index are missing: {missing}")
    return [directory / s for s in shards]


class WeightFile(Protocol):
    """One weight file's tensors: their names, each one's shape and dtype (safetensors' dtype
    names), and its values (a numpy array in PyTorch's layout)."""

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def dtype(self, name: str) -> str: ...

    def get(self, name: str) -> np.ndarray: ...


@contextlib.contextmanager
def open_file(path: pathlib.Path) -> Iterator[WeightFile]:
    """The file read in the format its suffix names (.safetensors, .msgpack, .bin)."""
    fmt = _BY_SUFFIX.get(path.suffix)
    if fmt is None:
        raise WeightError(f"{path}: not a weight file attn reads ({', '.join(_BY_SUFFIX)})")
    if fmt.name == "safetensors":
        with _safetensors(path) as f:
            yield f
    elif fmt.name == "msgpack":
        yield _FlaxFile(path)
    else:
        with _TorchZip(path) as f:
            yield f


# ---- safetensors ----------------------------------------------------------------------------


class _SafetensorsFile:
    def __init__(self, handle):
        self._f = handle

    def names(self) -> list[str]:
        return list(self._f.keys())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._f.get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._f.get_slice(name).get_dtype()

    def get(self, name: str) -> np.ndarray:
        return self._f.get_tensor(name)


@contextlib.contextmanager
def _safetensors(path: pathlib.Path) -> Iterator[WeightFile]:
    try:
        from safetensors import safe_open
    except ImportError:
        raise WeightError(
            f"reading {path.name} needs safetensors: pip install safetensors (or attn[bert])"
        ) from None
    try:
        handle = safe_open(os.fspath(path), framework="numpy")
    except (OSError, ValueError, RuntimeError) as e:  # safetensors raises its own errors
        raise WeightError(f"{path} is not a readable safetensors file: {_first(e)}") from None
    with handle as f:
        yield _SafetensorsFile(f)


# ---- Flax msgpack ---------------------------------------------------------------------------

# A Flax leaf name -> PyTorch's, and whether the array is a Dense kernel to transpose.
_FLAX_LEAVES = {
    "kernel": ("weight", True),
    "scale": ("weight", False),
    "embedding": ("weight", False),
}


class _FlaxFile:
    def __init__(self, path: pathlib.Path):
        stat = path.stat()
        self._tensors = _flax_tensors(path, stat.st_size, stat.st_mtime_ns)

    def names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def dtype(self, name: str) -> str:
        return _dtype_name(self._tensors[name].dtype)

    def get(self, name: str) -> np.ndarray:
        return self._tensors[name]


@functools.lru_cache(maxsize=1)  # the headers and then the values: one read of the file
def _flax_tensors(path: pathlib.Path, size: int, mtime_ns: int) -> dict[str, np.ndarray]:
    """The file's arrays by PyTorch name, in PyTorch's layout (size and mtime key the cache)."""
    del size, mtime_ns
    try:
        from flax import serialization
    except ImportError:
        raise WeightError(
            f"reading {path.name} needs flax's msgpack reader: pip install flax (or attn[flax])"
        ) from None
    try:
        tree = serialization.msgpack_restore(path.read_bytes())
    except Exception as e:  # noqa: BLE001 (msgpack raises many kinds; all are one line here)
        raise WeightError(f"{path} is not a readable Flax msgpack file: {_first(e)}") from None
    if not isinstance(tree, dict):
        raise WeightError(f"{path} holds no Flax params tree (a {type(tree).__name__})")
    out: dict[str, np.ndarray] = {}
    for keys, x in _leaves(tree, ()):
        if not isinstance(x, np.ndarray):
            raise WeightError(f"{path}: {'/'.join(keys)} is not an array")
        leaf, transpose = _FLAX_LEAVES.get(keys[-1], (keys[-1], False))
        if transpose and x.ndim == 2:
            x = x.T
        out[".".join((*keys[:-1], leaf))] = np.ascontiguousarray(x)
    return out


def _leaves(tree: dict, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], object]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, str(key)))
        else:
            yield (*prefix, str(key)), value


# ---- PyTorch zip ----------------------------------------------------------------------------

# torch's storage types by the name its pickle gives them -> numpy dtype.
_STORAGES = {
    "FloatStorage": np.dtype(np.float32),
    "HalfStorage": np.dtype(np.float16),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "DoubleStorage": np.dtype(np.float64),
    "LongStorage": np.dtype(np.int64),
    "IntStorage": np.dtype(np.int32),
    "ShortStorage": np.dtype(np.int16),
    "CharStorage": np.dtype(np.int8),
    "ByteStorage": np.dtype(np.uint8),
    "BoolStorage": np.dtype(np.bool_),
}
# The first bytes of torch's legacy format: pickle protocol 2, then its magic number as a long.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"


@dataclasses.dataclass(frozen=True)
class _Storage:
    """A storage the pickle refers to by key: its dtype and length in elements."""

    key: str
    dtype: np.dtype
    numel: int


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """A tensor as the pickle describes it: a view of a storage."""

    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(storage, offset, shape, stride, *_):  # noqa: ANN001, ANN002
    """torch._utils._rebuild_tensor_v2's arguments kept as a record (requires_grad, hooks and
    metadata, the rest, mean nothing to a state dict's values)."""
    return _Tensor(
        storage, int(offset), tuple(int(n) for n in shape), tuple(int(s) for s in stride)
    )


class _StorageType:
    """What `torch.FloatStorage` and the like resolve to: only ever named in a persistent id."""

    def __init__(self, name: str):
        self.dtype = _STORAGES[name]


class _StateDictUnpickler(pickle.Unpickler):
    """Resolves only the globals a plain state dict names; anything else is refused by name,
    before it could be called."""

    def __init__(self, file, path: pathlib.Path):  # noqa: ANN001
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str):  # noqa: ANN201
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        raise WeightError(
            f"{self._path}: refused the global {module}.{name} in its pickle (a state dict names "
            "only torch's tensor rebuild, its storage types and OrderedDict); nothing was run"
        )

    def persistent_load(self, pid):  # noqa: ANN001, ANN201
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise WeightError(f"{self._path}: a storage reference of an unknown kind: {pid!r}")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType):
            raise WeightError(f"{self._path}: storage {key} names no storage type")
        return _Storage(str(key), kind.dtype, int(numel))


class _TorchZip:
    def __init__(self, path: pathlib.Path):
        self._path = path
        _check_zip(path)
        try:
            self._zip = zipfile.ZipFile(path)
            pkl = [n for n in self._zip.namelist() if n.endswith("data.pkl")]
            if len(pkl) != 1:
                raise WeightError(f"{path}: a PyTorch zip checkpoint holds one data.pkl")
            self._root = pkl[0][: -len("data.pkl")]
            # Files written before torch recorded it are little-endian.
            order = self._read(f"{self._root}byteorder", b"little").decode().strip()
            self._little = order == "little"
            with self._zip.open(pkl[0]) as f:
                state = _StateDictUnpickler(f, path).load()
        except WeightError:
            raise
        except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, OSError) as e:
            raise WeightError(f"{path} is damaged: {_first(e)}") from None
        except Exception as e:  # noqa: BLE001 (a malformed pickle can raise anything)
            raise WeightError(f"{path}: its pickle is no state dict: {_first(e)}") from None
        if not isinstance(state, dict):
            raise WeightError(f"{path} holds a {type(state).__name__}, not a state dict")
        bad = [k for k, v in state.items() if not isinstance(v, _Tensor)]
        if bad:
            raise WeightError(f"{path}: entry {bad[0]!r} of its state dict is not a tensor")
        self._tensors: dict[str, _Tensor] = state
        self._storages: dict[str, np.ndarray] = {}

    def _read(self, name: str, default: bytes | None = None) -> bytes:
        try:
            return self._zip.read(name)
        except KeyError:
            if default is not None:
                return default
            raise WeightError(f"{self._path}: its storage {name} is missing") from None

    def names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._tensors[name].shape

    def dtype(self, name: str) -> str:
        return _dtype_name(self._tensors[name].storage.dtype)

    def get(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        s = t.storage
        if s.key not in self._storages:  # tied tensors share a storage: read it once
            try:
                raw = self._read(f"{self._root}data/{s.key}")
            except (zipfile.BadZipFile, OSError) as e:
                raise WeightError(f"{self._path} is damaged: {_first(e)}") from None
            if len(raw) != s.numel * s.dtype.itemsize:
                raise WeightError(
                    f"{self._path}: storage {s.key} has {len(raw)} bytes where its "
                    f"{s.numel} elements need {s.numel * s.dtype.itemsize}"
                )
            data = np.frombuffer(raw, s.dtype)
            self._storages[s.key] = data if self._little else data.byteswap()
        data = self._storages[s.key]
        last = t.offset + sum((n - 1) * st for n, st in zip(t.shape, t.stride, strict=True))
        if (
            min(t.stride, default=0) < 0
            or t.offset < 0
            or (min(t.shape, default=1) and last >= s.numel)
        ):
            raise WeightError(f"{self._path}: tensor {name} reaches outside its storage")
        if not min(t.shape, default=1):
            return np.zeros(t.shape, s.dtype)
        view = np.lib.stride_tricks.as_strided(
            data[t.offset :],
            shape=t.shape,
            strides=tuple(st * s.dtype.itemsize for st in t.stride),
            writeable=False,
        )
        return np.array(view)

    def __enter__(self) -> _TorchZip:
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        self._zip.close()


def _check_zip(path: pathlib.Path) -> None:
    """One line for a .bin that is not a zip: torch's legacy format, a cut download, other."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_LEGACY_MAGIC))
        is_zip = zipfile.is_zipfile(path)
    except OSError as e:
        raise WeightError(f"cannot read {path}: {_first(e)}") from None
    if is_zip:
        return
    if head.startswith(_LEGACY_MAGIC):
        raise WeightError(
            f"{path} is in torch's legacy format (saved before torch 1.6), which attn does not "
            "read: convert it once where torch is installed, e.g. with transformers "
            "AutoModel.from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)"
        )
    if head.startswith(b"PK\x03\x04"):
        raise WeightError(f"{path} is a truncated zip (its directory at the end is missing)")
    raise WeightError(f"{path} is not a PyTorch zip checkpoint (nor torch's legacy format)")


# ---- shared ---------------------------------------------------------------------------------

_DTYPE_NAMES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float64): "F64",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}


def _dtype_name(dtype: np.dtype) -> str:
    return _DTYPE_NAMES.get(np.dtype(dtype), str(dtype))


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
