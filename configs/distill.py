"""Distillation: attn's own self-attention classifier learns from a teacher, a fine-tuned
pretrained encoder, on the training texts and augmented copies of them (Tang et al. 2019; soft
targets: Hinton et al. 2015).

Run:
  python -m experiments.train --config=configs/distill.py --workdir=runs/student \
      --config.distill.teacher=runs/chinese_teacher
  python -m experiments.train --config=configs/distill.py:csv --workdir=runs/student \
      --config.data.path=reviews.csv --config.distill.teacher=runs/ft

The teacher (distill.teacher) is a workdir of configs/finetune.py (or any trained workdir on the
same data), or a transformers ...ForSequenceClassification directory or hub id, as
`predict --pretrained` serves; its labels must be the data's, and its tokenizer must read the
data. Its logits over the transfer set are computed once, with a progress bar, and kept in
WORKDIR/teacher_outputs.npz, which a resumed run reads back.

Variants (`configs/distill.py:<arg>`):
  (none)  the embedded Chinese reviews, with configs/default.py's student (model, data, optimizer).
  csv     your file (--config.data.path), with configs/csv.py's student: tokenizer, lengths and
          schedule chosen from the data (an epoch counts the augmented copies).
  tiny    a few steps, for tests.
With distill.teacher left empty, the run trains on the augmented copies with their texts' labels:
augmentation alone, to tell what the copies bring from what the teacher does.
"""

import ml_collections

from configs import common, csv, default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    common.check_variant(arg, ("csv", "tiny"), __file__)
    config = csv.get_config() if arg == "csv" else default.get_config(arg)
    with config.unlocked():
        config.distill.teacher = ""  # required: --config.distill.teacher=DIR
        config.distill.loss = "soft"
        config.distill.temperature = 2.0
        config.distill.weight = 1.0
        config.distill.augment = 4
        if arg is None:
            # One pass over the transfer set: with 4 copies of each text, 1.7 times the examples
            # configs/default.py's 3 epochs see, its cosine schedule over them.
            config.train.num_epochs = 1
        if arg == "tiny":
            config.distill.augment = 1
    return config
