"""IMDB reviews (Maas et al. 2011): word tokens, one layer of self-attention with hashed word
n-grams, plus a linear model on the bag of word 1-2-grams (`model.bag_buckets`).

Run on TFDS `imdb_reviews` (Colab, or any machine that can download it):
  python -m experiments.train --config=configs/imdb.py --workdir=runs/imdb
or on a local copy of Stanford's aclImdb_v1.tar.gz, unpacked:
  python -m experiments.train --config=configs/imdb.py --workdir=runs/imdb \
      --config.data.path=/path/to/aclImdb

Validation is a fixed hash-based 10% of IMDB's train split; test is IMDB's test split.
Results on 2 CPU cores: `python -m benchmarks imdb --imdb_path=/path/to/aclImdb` (REPORT.md).

Variants: (none) = the config below; `tiny` = the default config's tiny model on IMDB, for tests.
"""

import ml_collections

from configs import common, default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("tiny",), __file__)
    config = default.get_config(arg)  # d=64, 4 heads, adversarial embedding loss
    with config.unlocked():
        config.data.dataset = "imdb_reviews"
        config.data.tokenizer = "word"
        config.data.min_freq = 2
        config.data.max_vocab = 30000
        if arg != "tiny":
            config.data.max_len = 512  # about 85% of reviews fit; longer ones are cut
            config.data.tail_len = 384  # a cut review keeps its first 128 and last 384 words
            config.data.buckets = (64, 128, 192, 256, 384, 512)
            config.data.eval_batch_size = 128
            config.model.ngram_buckets = 1 << 18  # word 2-3-grams added to the token embeddings
            # The bag sees every distinct word and word pair, as TF-IDF + logistic regression
            # does; attention adds what a bag cannot see.
            config.model.bag_buckets = 1 << 20
            config.model.bag_orders = (1, 2)
            # The model fits the training set within two epochs (train loss ~0 in the third).
            config.train.num_epochs = 2
            config.train.eval_every_steps = 250
            config.train.checkpoint_every_steps = 250
    return config
