"""SST-2 (TFDS `glue/sst2`), word tokens, 2 layers of self-attention.

Run (on Colab or any machine that can download GLUE; this repo's CI cannot):
  python -m experiments.train --config=configs/sst2.py --workdir=runs/sst2

SST-2's test labels are hidden, so test here is GLUE's validation split (872 sentences) and
validation is a fixed hash-based 10% of train. Not yet run by us: no result is claimed.
"""

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = default.get_config(arg if arg == "tiny" else None)
    with config.unlocked():
        config.data.dataset = "glue/sst2"
        config.data.tokenizer = "word"
        config.data.min_freq = 1
        config.data.max_vocab = 20000
        if arg != "tiny":
            config.data.max_len = 64
            config.data.buckets = (16, 32, 48, 64)
            config.model.d_model = 128
            config.model.num_layers = 2
            config.model.d_ff = 512
            config.model.ngram_buckets = 0
            config.optim.adversarial_eps = 0.0  # tuned only on chinese_reviews
            config.model.dropout = 0.2
            config.model.embed_dropout = 0.3
            config.train.num_epochs = 3
            config.train.eval_every_steps = 500
            config.train.checkpoint_every_steps = 500
    return config
