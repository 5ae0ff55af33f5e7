"""Default: char-level self-attention classifier on the embedded `chinese_reviews` data.

Run:
  python -m experiments.train --config=configs/default.py --workdir=runs/default
  python -m experiments.train --config=configs/default.py:tiny --workdir=/tmp/tiny   # smoke test

Variants (`configs/default.py:<arg>`):
  (none)      the default below, 4-5 min on 2 CPU cores with the run's TF-IDF baseline. Its
              test accuracy over seeds 0/1/2 (--config.train.seed), against char 1-3-gram
              TF-IDF + logistic regression on the same split: docs/results.md and
              benchmarks/REPORT.md, both generated from benchmarks/results.json.
  tiny        a few steps of a very small model, for tests.
  structured  structured self-attentive pooling (Lin et al. 2017) instead of mean pooling.
  pretrained  10 epochs (4,340 steps) of masked-token pretraining on the training texts first,
              into WORKDIR/pretrain, then the default's fine-tuning with a relative adversarial
              eps. 22 min on 2 CPU cores shared with another run; further seeds reuse the
              pretraining (--config.model.init_from=WORKDIR/pretrain, 7.5 min each). What it
              reaches, attention on and off: benchmarks/analysis.md, section "Priors".
"""

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("tiny", "structured", "pretrained"), __file__)
    config = ml_collections.ConfigDict()

    config.data = ml_collections.ConfigDict()
    config.data.dataset = "chinese_reviews"
    config.data.data_dir = ""  # TFDS data_dir; "" = the TFDS default (~/tensorflow_datasets)
    config.data.path = ""  # for dataset="file"
    config.data.text_field = "text"
    config.data.label_field = "label"
    config.data.label_names = ()  # e.g. ("neg", "pos") to skip a stray "neutral" row
    config.data.max_bad_fraction = 0.01
    config.data.convert = ""  # e.g. "t2s": OpenCC's traditional-to-simplified Chinese
    config.data.tokenizer = "char"
    config.data.lowercase = True
    config.data.min_freq = 2
    config.data.max_vocab = 8000
    config.data.max_len = 256
    config.data.tail_len = 0
    config.data.bag_len = 0  # the bag (model.bag_buckets > 0) reads what attention reads
    config.data.unlabeled = ()  # more texts to pretrain on, besides the training split's
    config.data.buckets = (32, 64, 96, 128, 192, 256)
    config.data.batch_size = 32  # tuned on validation: +0.7 pt over 64 (one seed)
    config.data.eval_batch_size = 256

    config.model = ml_collections.ConfigDict()
    config.model.d_model = 64
    config.model.num_heads = 4
    config.model.num_layers = 1
    config.model.d_ff = 256
    config.model.positions = "learned"
    config.model.pooling = "mean"
    config.model.pool_hops = 4
    config.model.pool_hidden = 64
    config.model.dropout = 0.15  # with the adversarial loss: 0.15 > 0.3 on validation (2 seeds)
    config.model.embed_dropout = 0.15
    config.model.score = "scaled_dot"
    config.model.implementation = "matrix"
    config.model.q_chunk = 128
    config.model.k_chunk = 128
    config.model.ngram_buckets = 1 << 17  # fewer hash collisions: +1 pt val over 1 << 16
    config.model.ngram_orders = (2, 3)
    config.model.bag_buckets = 0  # >0 adds a linear model on the bag of hashed n-grams
    config.model.bag_orders = (1, 2)
    config.model.bag_dropout = 0.0
    config.model.dtype = "float32"
    config.model.init_from = ""  # a workdir whose encoder and tokenizer the run starts from
    config.model.embeddings_from = ""  # a word-vector file the token embeddings start from
    config.model.pretrained = (
        ""  # a pretrained encoder to fine-tune: directory or hub id (finetune.py)
    )
    config.model.pretrained_layers = -1  # its first N layers (0: embeddings alone); -1 = all
    config.model.pretrained_init = "checkpoint"  # or "random": its architecture, random weights

    config.optim = ml_collections.ConfigDict()
    config.optim.learning_rate = 5e-3  # tuned on validation: 1e-3 < 2e-3 < 5e-3
    config.optim.warmup_steps = 100
    config.optim.schedule = "cosine"  # after the warmup: cosine or linear decay
    config.optim.layer_decay = 1.0  # a pretrained encoder's layer-wise learning-rate decay
    config.optim.weight_decay = 0.1  # tuned on validation: 0.01 < 0.1 ~ 0.3
    config.optim.clip_norm = 1.0
    config.optim.label_smoothing = 0.0
    # Adds the loss at embeddings perturbed along the gradient (Miyato et al. 2017): +1.1 pt mean
    # validation over 2 seeds; eps 1 < 1.5 < 2, and 3 or 5 stall at the majority class.
    config.optim.adversarial_eps = 2.0
    config.optim.adversarial_relative = False
    config.optim.ema_decay = 0.0  # > 0 evaluates and serves a running average of the weights
    config.optim.penalty_weight = 0.1  # structured pooling's ||AA^T - I||^2 coefficient
    config.optim.bag_init = "zeros"  # the bag's starting table, when model.bag_buckets > 0
    config.optim.max_nonfinite = 20  # consecutive skipped (non-finite) steps before giving up
    config.optim.warm_lr_scale = 1.0  # learning-rate factor of init_from's / embeddings_from's

    config.train = ml_collections.ConfigDict()
    config.train.seed = 0
    config.train.num_epochs = 3
    config.train.eval_every_steps = 100  # finer early stopping on validation
    config.train.checkpoint_every_steps = 200
    config.train.keep_checkpoints = 1  # with the optimizer's state, to resume; best/ apart
    config.train.log_every_steps = 20
    config.train.max_steps = 0  # 0 = run num_epochs in full
    config.train.baseline = True
    config.train.patience = 0  # evaluations without improvement before stopping; 0 = never

    # Masked-token pretraining of the encoder on the training texts, run by train before it
    # trains the classifier when num_epochs > 0 (or alone by experiments.pretrain).
    config.pretrain = ml_collections.ConfigDict()
    config.pretrain.num_epochs = 0
    config.pretrain.max_steps = 0
    config.pretrain.mask_rate = 0.15
    config.pretrain.head_vocab = 0
    config.pretrain.learning_rate = 1e-3
    config.pretrain.warmup_steps = 200
    config.pretrain.eval_every_steps = 500
    config.pretrain.checkpoint_every_steps = 500

    # Distillation (configs/distill.py): attn's own model learns from a teacher's answers over a
    # transfer set, the training texts and `augment` augmented copies of each; with augment and
    # no teacher, the copies keep their texts' labels (augmentation alone).
    config.distill = ml_collections.ConfigDict()
    config.distill.teacher = ""  # a trained workdir or a transformers sequence classifier
    config.distill.loss = "soft"
    config.distill.temperature = 1.0
    config.distill.weight = 1.0
    config.distill.augment = 0
    config.distill.mask_rate = 0.1  # Tang et al. 2019's p_mask
    config.distill.ngram_rate = 0.25  # and p_ng

    if arg == "tiny":
        config.data.max_len = 64
        config.data.buckets = (64,)  # one bucket: each step function compiles once
        config.data.batch_size = 16
        config.data.eval_batch_size = 64
        config.model.d_model = 16
        config.model.num_heads = 2
        config.model.d_ff = 32
        config.model.ngram_buckets = 256
        config.optim.warmup_steps = 2
        config.train.num_epochs = 1
        config.train.max_steps = 6
        config.train.eval_every_steps = 3
        config.train.checkpoint_every_steps = 3
        config.train.keep_checkpoints = 2  # tests compare step 3 of runs too
        config.train.log_every_steps = 1
        config.train.baseline = False  # tests ask for it where they check it
        config.pretrain.warmup_steps = 2
        config.pretrain.eval_every_steps = 3
        config.pretrain.checkpoint_every_steps = 3
    elif arg == "structured":
        config.model.pooling = "structured"
    elif arg == "pretrained":
        config.pretrain.num_epochs = 10
        # csv.py's relative eps (5% of each text's embedding norm); on validation it ties the
        # absolute eps of 2 after pretraining: 84.76% against 84.71% (seed 0).
        config.optim.adversarial_relative = True
        config.optim.adversarial_eps = 0.05
    config.lock()
    return config
