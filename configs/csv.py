"""Your own labelled texts: a CSV/TSV/JSONL file or an aclImdb-style folder (pos/*.txt, neg/*.txt).

Run:
  python -m experiments.train --config=configs/csv.py --config.data.path=reviews.csv \
      --workdir=runs/mine [--config.data.text_field=review --config.data.label_field=stars]

Splits are 80/10/10 by a stable hash of each text; label names come from the data. Rows with a
missing field, empty text or undecodable bytes are reported with their line numbers, and the run
stops when more than config.data.max_bad_fraction of them are bad.

Variants: (none) = the default config's model; `tiny` for tests.
"""

import ml_collections

from configs import common, default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("tiny",), __file__)
    config = default.get_config(arg)
    with config.unlocked():
        config.data.dataset = "file"
        config.data.tokenizer = "char"
    return config
