"""Unlabeled texts for pretraining: the training split's texts, plus what `data.unlabeled` names.

Each entry of `data.unlabeled` is one source:
  a .txt file                   one text per line (blank lines skipped)
  a .csv/.tsv/.jsonl file       the column (or JSON key) data.text_field; labels are not read
  a folder                      aclImdb's unlabeled reviews when it has train/unsup/ or unsup/
                                (an aclImdb root, or its train/), else every *.txt below it
  tfds:<name>:<split>           a TFDS split's texts, e.g. tfds:imdb_reviews:unsupervised (Colab)

Texts that also occur in the validation or test split are dropped (and counted), so pretraining
never sees what the fine-tuned model is chosen and scored on; so are repeats. A text's identity
is the one the splits use (`splits.normalize`).
"""

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.data import conversion, datasets, user_files
from experiments.data.splits import normalize
from experiments.errors import UserError


@dataclasses.dataclass(frozen=True)
class Texts:
    train: list[str]  # what pretraining reads: the training split's texts, then the sources'
    validation: list[str]  # the validation split's, to measure masked-token accuracy on
    summary: str  # one line for the user: how many texts came from where


def load(data: Any) -> Texts:
    """The pretraining texts of config.data `data` (see the module docstring)."""
    splits = datasets.load_splits(data, ("train", "validation", "test"))
    train, validation, test = (splits[s][0] for s in ("train", "validation", "test"))
    held = {normalize(t) for t in (*validation, *test)}
    seen = {normalize(t) for t in train}
    texts, parts, dropped = list(train), [f"{len(train):,} from the training split"], 0
    for source in sources(data):
        added = 0
        field, data_dir = data.get("text_field", "text"), data.get("data_dir") or None
        for text in read(source, field, data_dir, data.get("convert", "")):
            k = normalize(text)
            if k in held:
                dropped += 1
            elif k not in seen:
                seen.add(k)
                texts.append(text)
                added += 1
        parts.append(f"{added:,} from {source}")
    summary = f"pretraining on {len(texts):,} texts: {', '.join(parts)}"
    if dropped:
        summary += f"; {dropped:,} dropped because they occur in validation or test"
    return Texts(texts, list(validation), summary)


def sources(data: Any) -> Sequence[str]:
    """The entries of config.data `data`'s data.unlabeled, a tuple whatever it was given as."""
    given = data.get("unlabeled", ())
    if isinstance(given, str):  # one path given without a tuple
        given = (given,) if given else ()
    return tuple(given)


def read(
    source: str, text_field: str = "text", data_dir: str | None = None, convert: str = ""
) -> list[str]:
    """The texts of one `data.unlabeled` entry, converted by `convert` (data.convert, as the
    splits are); UserError naming the entry when it has none or cannot be read."""
    named = f"data.unlabeled entry {source!r}"
    if source.startswith("tfds:"):
        return _tfds(source, named, data_dir)
    p = Path(source)
    if not p.exists():
        raise UserError(f"{named} does not exist")
    if p.is_dir():
        texts = _folder(p)
    elif p.suffix.lower() == ".txt":
        texts = [line.strip() for line in user_files.read_text(p, named).splitlines()]
    elif p.suffix.lower() in user_files.FILE_SUFFIXES:
        texts = user_files.texts(p, named, text_field)
    else:
        raise UserError(
            f"{named}: unknown file type {p.suffix!r}; expected .txt (a text per line), "
            f"{', '.join(user_files.FILE_SUFFIXES)}, a folder or tfds:<name>:<split>"
        )
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UserError(f"{named} holds no text")
    return conversion.convert_all(convert, texts)[0]


def _folder(root: Path) -> list[str]:
    for unsup in (root / "train" / "unsup", root / "unsup"):
        if unsup.is_dir():
            root = unsup
            break
    files = sorted(root.rglob("*.txt"))
    print(f"reading {len(files):,} .txt files under {root}", file=sys.stderr)
    return [user_files.read_text(f, str(f)).strip() for f in files]


def _tfds(source: str, named: str, data_dir: str | None) -> list[str]:
    _, name, split = (source.split(":") + ["", ""])[:3]
    if not (name and split):
        raise UserError(
            f"{named}: expected tfds:<name>:<split>, e.g. tfds:imdb_reviews:unsupervised"
        )
    field = datasets.text_feature(name)
    texts = []
    for ex in datasets.tfds_source(name, split, data_dir):
        text = ex[field]
        texts.append(text.decode("utf-8") if isinstance(text, bytes) else str(text))
    return texts
