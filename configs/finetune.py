"""Fine-tuning a pretrained encoder (a Hugging Face model directory or hub id, of any family
`attn.encoders` reads) on your labelled texts: the checkpoint's encoder and tokenizer, mean
pooling, dropout and a linear head, through the same train loop, checkpoints, evaluate and predict
as attn's own models.

Run:
  python -m experiments.train --config=configs/finetune.py --workdir=runs/ft \
      --config.model.pretrained=/path/to/all-MiniLM-L6-v2 --config.data.path=reviews.csv
  python -m experiments.evaluate --workdir=runs/ft
  python -m experiments.predict --workdir=runs/ft "a moving, funny film"

The directory needs config.json, its weights (model.safetensors, flax_model.msgpack or
pytorch_model.bin, single or sharded, read without torch) and its tokenizer's files (tokenizer.json,
vocab.txt or spm.model) of a BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ModernBERT or
DeBERTa-v2/v3 encoder; a hub id is downloaded with huggingface_hub. Its config.json decides the
sizes, positions, embedding dropout and score, so overriding model.num_layers and the like is
refused (model.pretrained_layers=N keeps the first N layers). The length (the 95th percentile in
the checkpoint's tokens, [CLS] and [SEP] included), the tail a longer text keeps (3/4), the epochs
(about 30,000 examples seen, 2 to 4), warmup (7.5%), the evaluation interval and the weight
average's decay are chosen from the training split as configs/csv.py chooses them, and the peak
learning rate from the encoder's width (1e-4 up to d_model 512, as chosen on validation for
all-MiniLM-L6-v2 and m3e-small; 2e-5 for base encoders, 1e-5 for large ones, as their papers tune
them), printed when the run starts and recorded in config.json. AdamW (no decay on biases and
LayerNorm), linear warmup and linear decay to 0, weight decay 0.01, batch 32, the checkpoint's own
dropout in the encoder; evaluated and served as a running average of the weights (optim.ema_decay
0.99, about the last 100 steps: higher mean best validation than without it over seeds 0, 1 and 2
of an 810-step run; a run under 800 steps averages over its last eighth); early stopping after 3
evaluations without a better validation accuracy; the TF-IDF baseline beside it.
optim.layer_decay < 1 gives each lower layer a smaller learning rate (off by default).

Variants (`configs/finetune.py:<arg>`):
  (none)  your file (--config.data.path), as above. With all-MiniLM-L6-v2 on English review
          sentences, against its ablations, TF-IDF and configs/csv.py: docs/results.md ("A
          pretrained encoder, fine-tuned"), from `python -m benchmarks finetune`.
  imdb    TFDS imdb_reviews (or --config.data.path=/path/to/aclImdb), 256 tokens: the first 64
          and last 192 of a longer review, 2 epochs: for an accelerator (`python -m benchmarks
          device --parts=finetune`). Not measured yet.
  imdb_cpu  imdb cut to a quarter of its encoder's cost, for CPUs: 128 tokens (the first 32 and
          last 96), one epoch, with the bag beside it reading up to 1,024 tokens of each review.
          Measured on IMDB's official split: docs/results.md.
  sst2    TFDS glue/sst2, 64 tokens, 2 epochs. Not measured yet.
  bag     your file, as (none), plus configs/csv.py's bag: a linear model on the bag of hashed
          1-2-grams of the checkpoint's token ids (2^20 buckets) whose logits are added to the
          head's, its table started from naive Bayes log-count ratios of the training split. It
          reads what the encoder reads; --config.data.bag_len=-1 lets it read up to the
          99th-percentile length (the encoder then reads at most 256 tokens). The weight
          average raised its best validation on each of seeds 0, 1 and 2. Measured in the same
          table.
  The imdb, imdb_cpu and sst2 variants have no weight average (not measured with it).
  tiny    a few steps at 32 tokens, for tests (tests/data/bert/tiny_bert).
predict (--explain), visualize (--steps) and faithfulness serve the workdir; predict's
most-attended words are its last layer's attention, averaged over heads and queries and summed
over a word's pieces ([CLS] and [SEP] not listed); predict --max_len=N reads longer texts.
"""

import ml_collections

from configs import common, default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("tiny", "imdb", "imdb_cpu", "sst2", "bag"), __file__)
    config = default.get_config("tiny" if arg == "tiny" else None)
    with config.unlocked():
        config.model.pretrained = ""  # required: --config.model.pretrained=DIR
        config.data.tokenizer = "pretrained"
        config.data.lowercase = False  # the checkpoint's own normalizer decides
        # Mean over [CLS] on validation, all-MiniLM-L6-v2 on the RT sentences: 83.98% against
        # 83.81% over seeds 0-2 (benchmarks/REPORT.md, section 8).
        config.model.pooling = "mean"
        config.model.dropout = 0.1
        # What the checkpoint's encoder does not have (fields.PRETRAINED_OFF).
        config.model.ngram_buckets = 0
        config.optim.adversarial_eps = 0.0
        config.optim.learning_rate = -1.0  # by the encoder's width (experiments/data/chosen.py)
        config.optim.schedule = "linear"
        config.optim.weight_decay = 0.01
        config.train.patience = 3
        if arg == "tiny":
            config.data.dataset = "file"
            config.data.max_len = 32  # tiny_bert has 40 positions
            config.data.buckets = (32,)
            config.data.tail_len = 8
            config.optim.learning_rate = 1e-3
            config.train.patience = 0
        else:
            config.data.dataset = "file"
            config.data.max_len = 0  # 0 and -1: chosen from the data
            config.data.tail_len = -1
            config.data.batch_size = 32
            config.data.eval_batch_size = 64
            config.optim.warmup_steps = -1
            config.train.num_epochs = 0
            config.train.eval_every_steps = 0
            config.train.checkpoint_every_steps = 0
        if arg in ("imdb", "imdb_cpu"):  # 22,500 training reviews: 704 steps an epoch
            config.data.dataset = "imdb_reviews"
            config.data.max_len = 256
            config.data.tail_len = 192
            config.data.buckets = (64, 128, 192, 256)
            config.train.num_epochs = 2
            config.optim.warmup_steps = 100
            config.train.eval_every_steps = 100
            config.train.checkpoint_every_steps = 200
        if arg == "imdb_cpu":  # a quarter of imdb's encoder cost, the bag reading the rest
            config.data.max_len = 128
            config.data.tail_len = 96
            config.data.buckets = (32, 64, 96, 128)
            config.train.num_epochs = 1
            config.optim.warmup_steps = 53  # 7.5% of the steps, as the data rule would choose
            config.train.eval_every_steps = config.train.checkpoint_every_steps = 176  # 4 times
            config.data.bag_len = -1  # chosen from the data: up to 1,024 tokens
        if arg == "sst2":  # 67,349 training sentences: 2,105 steps an epoch
            config.data.dataset = "glue/sst2"
            config.data.max_len = 64
            config.data.tail_len = 0
            config.data.buckets = (16, 32, 48, 64)
            config.train.num_epochs = 2
            config.optim.warmup_steps = 250
            config.train.eval_every_steps = 500
            config.train.checkpoint_every_steps = 1000
        if arg in ("bag", "imdb_cpu"):  # as configs/csv.py's bag
            config.model.bag_buckets = 1 << 20
            config.model.bag_orders = (1, 2)
            config.optim.bag_init = "naive_bayes"
        if arg in (None, "bag"):  # chosen on validation on English review sentences
            config.optim.ema_decay = -1  # 0.99, or over the last eighth of a shorter run
    return config
