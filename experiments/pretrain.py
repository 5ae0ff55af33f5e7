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
pretrains by itself first when config.pretrain.num_epochs > 0. It pretrains attn's own encoder:
a checkpoint's (configs/finetune.py, model.pretrained) comes pretrained, and `train` fine-tunes it.
"""

import os
import sys
import time

import ml_collections
from absl import flags

from experiments import cli, fields, parallel
from experiments.errors import UserError
from experiments.training import pipeline


def define_flags(fv: flags.FlagValues) -> None:
    cli.define_run_flags(fv)


def pretrain(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """`pipeline.pretrain`, after refusing a checkpoint's encoder: the config's own checks
    would first ask how long to pretrain and then to start from configs/finetune.py."""
    if fields.fine_tunes(config):
        raise UserError(
            "pretrain trains attn's own encoder on masked tokens; it does not pretrain a "
            "checkpoint's encoder (model.pretrained, configs/finetune.py), which comes "
            "pretrained: fine-tune it with python -m experiments.train "
            "--config=configs/finetune.py --config.model.pretrained=DIR --config.data.path=FILE "
            "--workdir=RUN"
        )
    return pipeline.pretrain(config, workdir)


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    start = time.perf_counter()
    result = cli.run_in_workdir(fv, pretrain)
    if result is None:  # not process 0
        parallel.finish()  # process 0 writes on; the job ends when it is done
        return
    workdir = fv.workdir
    curves = os.path.join(workdir, "curves.png")  # drawn by pipeline.pretrain
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
    parallel.finish()


if __name__ == "__main__":
    cli.main(define_flags, main)
