"""IMDB reviews (Maas et al. 2011): `configs/csv.py`'s recipe on TFDS `imdb_reviews`.

Run on TFDS `imdb_reviews` (Colab, or any machine that can download it):
  python -m experiments.train --config=configs/imdb.py --workdir=runs/imdb
or on a local copy of Stanford's aclImdb_v1.tar.gz, unpacked:
  python -m experiments.train --config=configs/imdb.py --workdir=runs/imdb \
      --config.data.path=/path/to/aclImdb

The model is one layer of self-attention over word tokens with hashed word 2-3-grams, plus a linear
model on the bag of word 1-2-grams whose table starts from naive Bayes log-count ratios; the
adversarial eps is relative to each review's embedding norm. The length, the tail kept, the bag's
length, the epochs and the intervals are chosen from the training split as for any user's data
(on IMDB: max_len 512, the first 128 and last 384 words of a longer review, the bag reads 2,048
words, 2 epochs), printed when the run starts and recorded in the workdir's config.json.

Validation is a fixed hash-based 10% of IMDB's train split; test is IMDB's test split.
Results on 2 CPU cores: `python -m benchmarks imdb --imdb_path=/path/to/aclImdb` (REPORT.md).

Variants: (none) = the recipe above; `tiny` = the default config's tiny model on IMDB, for tests;
`pretrained` = 2 epochs (1,406 steps) of masked-token pretraining on the training texts first,
into WORKDIR/pretrain, its head over the 8,192 most frequent words, then the recipe above:
  python -m experiments.train --config=configs/imdb.py:pretrained --workdir=runs/imdb_spt \
      --config.data.path=/path/to/aclImdb
56 min on 2 CPU cores shared with another run, the pretraining 25 of them; what it reaches
against the recipe without pretraining: benchmarks/analysis.md, section "Priors".
"""

import ml_collections

from configs import common, csv, default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("tiny", "pretrained"), __file__)
    # IMDB is English reviews of known shape, so it takes the recipe tuned for a user's own data
    # (chosen on IMDB's validation split among others) rather than one of its own.
    config = default.get_config(arg) if arg == "tiny" else csv.get_config()
    with config.unlocked():
        config.data.dataset = "imdb_reviews"
        config.data.tokenizer = "word"
        config.data.max_vocab = 30000
        if arg != "tiny":
            # csv.py lets attention read at most 256 tokens of a long text when its bag reads the
            # rest; on IMDB 512 words were chosen on validation (with 2,048 for the bag).
            config.data.max_len = 512
            config.data.buckets = (128, 256, 384, 512)
        if arg == "pretrained":
            config.pretrain.num_epochs = 2
            # The vocabulary softmax over 30,000 words was three quarters of a step.
            config.pretrain.head_vocab = 8192
    return config
