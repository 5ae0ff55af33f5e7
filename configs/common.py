"""What several config files share; not a config itself (it has no get_config)."""

import os

import ml_collections


def check_variant(arg: str | None, valid: tuple[str, ...], config_file: str) -> None:
    """Refuses a variant (`configs/<file>.py:<arg>`) that `config_file` does not define."""
    if arg is not None and arg not in valid:
        name = os.path.basename(config_file)
        raise ValueError(f"unknown variant {arg!r} of configs/{name}; valid: {', '.join(valid)}")


def word_model(config: ml_collections.ConfigDict) -> None:
    """A word-level model for short English sentences (sst2.py): 2 layers of d=128, no hashed
    n-grams and no adversarial loss (both tuned only on chinese_reviews)."""
    config.data.tokenizer = "word"
    config.model.d_model = 128
    config.model.num_layers = 2
    config.model.d_ff = 512
    config.model.ngram_buckets = 0
    config.model.embed_dropout = 0.3
    config.optim.adversarial_eps = 0.0
    config.train.eval_every_steps = 500
    config.train.checkpoint_every_steps = 500
