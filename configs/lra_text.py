"""Long Range Arena text task: IMDB as UTF-8 bytes, sequences of 1000 to 4000 bytes.

Run (on a GPU/TPU; needs IMDB from TFDS):
  python -m experiments.train --config=configs/lra_text.py --workdir=runs/lra1k
  python -m experiments.train --config=configs/lra_text.py:4k --workdir=runs/lra4k

Variants: (none) = 1000 bytes as in LRA; `4k` = 4000 bytes with chunked (memory-efficient)
attention; `tiny` for tests. Not yet run by us: no result is claimed.
"""

import ml_collections

from configs import common, default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("4k", "tiny"), __file__)
    config = default.get_config("tiny" if arg == "tiny" else None)
    with config.unlocked():
        config.data.dataset = "imdb_reviews"
        config.data.tokenizer = "byte"
        config.data.lowercase = False
        if arg != "tiny":
            config.data.max_len = 4000 if arg == "4k" else 1000
            step = config.data.max_len // 4
            config.data.buckets = tuple(step * i for i in range(1, 5))
            config.data.batch_size = 32
            config.data.eval_batch_size = 64
            config.model.d_model = 256
            config.model.num_heads = 4
            config.model.num_layers = 4
            config.model.d_ff = 1024
            config.model.pooling = "cls"
            config.model.ngram_buckets = 0
            config.model.dropout = 0.3  # the default's 0.15 goes with its adversarial loss
            config.model.embed_dropout = 0.3
            config.optim.adversarial_eps = 0.0  # tuned only on chinese_reviews
            config.model.implementation = "chunked" if arg == "4k" else "matrix"
            config.model.q_chunk = 512
            config.model.k_chunk = 512
            config.optim.learning_rate = 5e-4
            config.optim.warmup_steps = 1000
            config.train.num_epochs = 10
            config.train.eval_every_steps = 1000
            config.train.checkpoint_every_steps = 1000
    return config
