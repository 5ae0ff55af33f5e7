"""IMDB reviews (TFDS `imdb_reviews`), word tokens, 2 layers of self-attention.

Run (on Colab or any machine that can download IMDB; this repo's CI cannot):
  python -m experiments.train --config=configs/imdb.py --workdir=runs/imdb

Validation is a fixed hash-based 10% of IMDB's train split; test is IMDB's 25,000-review test
split. Not yet run by us: no result is claimed.

Variants: (none) = the config below; `tiny` = the default config's tiny model on IMDB, for tests.
"""

import ml_collections

from configs import common, default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("tiny",), __file__)
    config = default.get_config(arg)
    with config.unlocked():
        config.data.dataset = "imdb_reviews"
        config.data.tokenizer = "word"
        config.data.min_freq = 2
        config.data.max_vocab = 30000
        if arg != "tiny":
            common.word_model(config)
            config.data.max_len = 512
            config.data.buckets = (128, 256, 384, 512)
            config.model.dropout = 0.3  # the default's 0.15 goes with its adversarial loss
            config.train.num_epochs = 4
    return config
