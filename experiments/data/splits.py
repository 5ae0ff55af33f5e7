"""The stable hash split every dataset uses: a text's split is a pure function of the text.

A text's identity is NFKC(strip(text)) (`normalize`), so width variants ("ＧＯＯＤ！", "GOOD!") are
one text. Its sha1 gives a number in [0, 1) (`hash_fraction`): below 0.8 train, below 0.9
validation, else test. A dataset with its own train/test split but no validation split holds out
the texts of its train split whose number is >= 0.9 (`held_out`). No text can be in two splits,
adding or removing other texts never moves it, and the split is the same on every machine.
"""

import hashlib
import unicodedata

SPLITS = ("train", "validation", "test")
_TRAIN_END, _VALIDATION_END = 0.8, 0.9


def normalize(text: str) -> str:
    """The identity of a text for deduplication and splitting: NFKC of the stripped text."""
    return unicodedata.normalize("NFKC", text.strip()).strip()


def hash_fraction(text: str) -> float:
    """A stable pseudo-random number in [0, 1) for `text` (sha1 of its normal form).

    Python's hash() is salted per process, so it cannot define a split.
    """
    digest = hashlib.sha1(normalize(text).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_of(text: str) -> str:
    """ "train" | "validation" | "test" in proportions 80/10/10, a pure function of the text."""
    u = hash_fraction(text)
    return "train" if u < _TRAIN_END else "validation" if u < _VALIDATION_END else "test"


def held_out(text: str) -> bool:
    """True for the 10% of a dataset's train split that becomes validation when it has none."""
    return hash_fraction(text) >= _VALIDATION_END
