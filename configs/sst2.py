"""SST-2 (TFDS `glue/sst2`), word tokens, 2 layers of self-attention.

Run (on Colab or any machine that can download GLUE; this repo's CI cannot):
  python -m experiments.train --config=configs/sst2.py --workdir=runs/sst2

SST-2's test labels are hidden, so test here is GLUE's validation split (872 sentences) and
validation is a fixed hash-based 10% of train. Not yet run by us: no result is claimed.

Variants: (none) = the config below; `tiny` = the default config's tiny model on SST-2, for tests.
"""

import ml_collections

from configs import common, default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("tiny",), __file__)
    config = default.get_config(arg)
    with config.unlocked():
        config.data.dataset = "glue/sst2"
        config.data.tokenizer = "word"
        config.data.min_freq = 1
        config.data.max_vocab = 20000
        if arg != "tiny":
            common.word_model(config)
            config.data.max_len = 64
            config.data.buckets = (16, 32, 48, 64)
            config.model.dropout = 0.2
            config.train.num_epochs = 3
    return config
