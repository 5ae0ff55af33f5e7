"""IMDB reviews (TFDS `imdb_reviews`), word tokens, 2 layers of self-attention.

Run (on Colab or any machine that can download IMDB; this repo's CI cannot):
  python -m experiments.train --config=configs/imdb.py --workdir=runs/imdb

Validation is a fixed hash-based 10% of IMDB's train split; test is IMDB's 25,000-review test
split. Not yet run by us: no result is claimed.
"""

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = default.get_config(arg if arg == "tiny" else None)
    with config.unlocked():
        config.data.dataset = "imdb_reviews"
        config.data.tokenizer = "word"
        config.data.min_freq = 2
        config.data.max_vocab = 30000
        if arg != "tiny":
            config.data.max_len = 512
            config.data.buckets = (128, 256, 384, 512)
            config.model.d_model = 128
            config.model.num_heads = 4
            config.model.num_layers = 2
            config.model.d_ff = 512
            config.model.ngram_buckets = 0
            config.model.dropout = 0.3  # the default's 0.15 goes with its adversarial loss
            config.model.embed_dropout = 0.3
            config.optim.adversarial_eps = 0.0  # tuned only on chinese_reviews
            config.train.num_epochs = 4
            config.train.eval_every_steps = 500
            config.train.checkpoint_every_steps = 500
    return config
