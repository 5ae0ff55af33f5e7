"""A distillation run's transfer set: the texts a student learns its teacher's answers on
(Tang et al. 2019). The training split's texts, then `distill.augment` augmented copies of each,
then, with a teacher to label them, the texts of `data.unlabeled` (read as pretraining reads
them, `unlabeled.read`).

An augmented copy of a text is made of its units, characters for a text in a character script
(Chinese, Japanese: `chosen.cjk_share` over 30%, the tokenizer rule) and words (whitespace
apart) otherwise:
  masking   each unit, with probability distill.mask_rate, becomes MASK, a character no text
            has: the student's tokenizer reads it as unknown, the teacher as its own mask token
  n-grams   then, with probability distill.ngram_rate, the copy is cut to a random n-gram of it,
            n uniform in 1 to 5 words, or 1 to 10 characters (a Chinese word is about two)
Tang et al. also swap words for others of their part of speech; without a tagger that reads
every language, this does not.

Copy j of text i is drawn from its own generator, seeded by (SEED, j, i): it does not depend on
the student's seed, so every seed's transfer set is the same (one teacher labelling serves
them), and a set of k copies is the first part of a set of more. A text that is blank, repeats
one already in the set, or occurs in the validation or test split is left out (texts compared as
`splits.normalize` makes them): the student is chosen and scored on texts it was never taught.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np

from experiments.data import chosen, unlabeled
from experiments.data.splits import normalize

MASK = "\ue000"  # a private-use character: in no text, so in no vocabulary built from texts
SEED = 0
NGRAM_MAX = {"word": 5, "char": 10}


def unit_of(texts: Sequence[str]) -> str:
    """ "char" for texts mostly in a character script, else "word"."""
    return "char" if chosen.cjk_share(list(texts[:: max(1, len(texts) // 5000)])) > 0.3 else "word"


def augmented(
    text: str, rng: np.random.Generator, *, unit: str, mask_rate: float, ngram_rate: float
) -> str:
    """One augmented copy of `text` (see the module docstring)."""
    units = list(text) if unit == "char" else text.split()
    if not units:
        return ""
    units = [MASK if not u.isspace() and rng.random() < mask_rate else u for u in units]
    if rng.random() < ngram_rate:
        n = int(rng.integers(1, min(NGRAM_MAX[unit], len(units)) + 1))
        start = int(rng.integers(0, len(units) - n + 1))
        units = units[start : start + n]
    return ("" if unit == "char" else " ").join(units)


@dataclasses.dataclass(frozen=True)
class Transfer:
    texts: list[str]  # the training texts first, in split order, then augmented, then unlabeled
    labels: np.ndarray  # int32 [N]: a training text's label, a copy's its text's; -1: unlabeled
    labelled: np.ndarray  # bool [N]: True for a training text itself, whose label is its own
    summary: str  # one line for the user: how many texts came from where


def build(
    train_texts: Sequence[str],
    train_labels: np.ndarray,
    held: Sequence[str],
    *,
    copies: int,
    mask_rate: float,
    ngram_rate: float,
    sources: Sequence[str] = (),
    text_field: str = "text",
    data_dir: str | None = None,
    convert: str = "",
) -> Transfer:
    """The transfer set of the training split (`train_texts`, `train_labels` int32 [N]):
    `copies` augmented copies of each, and the texts of `sources` (data.unlabeled entries,
    converted by `convert`);
    `held` are the validation and test texts, which it never holds."""
    unit = unit_of(train_texts)
    banned = {normalize(t) for t in held}
    seen = {normalize(t) for t in train_texts}
    texts, labels = list(train_texts), [int(y) for y in train_labels]
    parts = [f"{len(texts):,} training texts"]
    dropped = 0

    def add(text: str, label: int) -> bool:
        nonlocal dropped
        key = normalize(text)
        if not key or key in seen:
            return False
        if key in banned:
            dropped += 1
            return False
        seen.add(key)
        texts.append(text)
        labels.append(label)
        return True

    made = 0
    for j in range(copies):
        for i, (text, label) in enumerate(zip(train_texts, train_labels, strict=True)):
            rng = np.random.default_rng([SEED, j, i])
            copy = augmented(text, rng, unit=unit, mask_rate=mask_rate, ngram_rate=ngram_rate)
            made += add(copy, int(label))
    if copies:
        parts.append(f"{made:,} augmented ({copies} a text, {unit}s masked and cut to n-grams)")
    for source in sources:
        added = sum(add(t, -1) for t in unlabeled.read(source, text_field, data_dir, convert))
        parts.append(f"{added:,} from {source}")
    summary = f"transfer set: {len(texts):,} texts: {', '.join(parts)}"
    if dropped:
        summary += f"; {dropped:,} left out because they occur in validation or test"
    labelled = np.zeros(len(texts), bool)
    labelled[: len(train_texts)] = True
    return Transfer(texts, np.asarray(labels, np.int32), labelled, summary)
