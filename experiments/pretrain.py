"""Pretrains the classifier's encoder on masked tokens of unlabeled text; resumes from the workdir.

  python -m experiments.pretrain --config=configs/imdb.py:pretrained --workdir=runs/imdb_pt \
      [--config.data.unlabeled="('DIR/aclImdb',)"]
  python -m experiments.train --config=configs/imdb.py --workdir=runs/imdb_finetuned \
      --config.model.init_from=runs/imdb_pt

The texts are the training split's (never validation's or test's) and those `data.unlabeled`
names, without any that occur in validation or test; 15% of each text's tokens are hidden
(`attn.masked_lm`) and predicted. The workdir is a training run's in all but its objective:
checkpoints with exact resume, metrics.jsonl, TensorBoard events, curves.png (masked-token loss
and accuracy, on validation's texts with fixed masks), and pretrain.json (the best checkpoint's
validation figures). `train --config.model.init_from=DIR` fine-tunes from it; `train` also
pretrains by itself first when config.pretrain.num_epochs > 0.
"""

import os
import sys
import time

import ml_collections
from absl import flags
from ml_collections import config_flags

from experiments import cli, distributed, loop, pretraining, workdirs
from experiments.cli import UserError


def define_flags(fv: flags.FlagValues) -> None:
    config_flags.DEFINE_config_file(
        "config", None, "Path to a config file[:variant].", flag_values=fv
    )
    flags.DEFINE_string(
        "workdir", None, "Directory for checkpoints, vocabulary and metrics.", flag_values=fv
    )
    distributed.define_flags(fv)


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    config: ml_collections.ConfigDict = fv.config
    workdir = fv.workdir
    if config is None or not workdir:
        raise UserError("both --config=configs/<name>.py and --workdir=DIR are required")
    start = time.perf_counter()
    distributed.initialize_from_flags(fv)
    fresh = not os.path.exists(workdir)
    with cli.interrupt_detail(lambda: loop.resume_hint(workdir)):
        try:
            result = pretraining.pretrain(config, workdir)
        except UserError:
            if fresh and distributed.is_primary():  # a refused run leaves no empty workdir
                workdirs.remove_if_unused(workdir)
            raise
    if not distributed.is_primary():
        distributed.finish()  # process 0 writes on; the job ends when it is done
        return
    curves = os.path.join(workdir, "curves.png")  # drawn by pretraining.pretrain
    print(
        f"validation masked-token accuracy {result['accuracy']:.4f}  loss {result['loss']:.4f}  "
        f"({result['num_targets']} hidden tokens, best step {result['step']}, "
        f"{time.perf_counter() - start:.0f} s)"
    )
    print(
        f"curves: {curves}\nfine-tune it: python -m experiments.train --config=... "
        f"--workdir=... --config.model.init_from={workdir}",
        file=sys.stderr,
    )
    distributed.finish()


if __name__ == "__main__":
    cli.main(define_flags, main)
