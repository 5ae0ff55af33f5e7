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

from absl import flags

from experiments import cli, parallel
from experiments.training import pipeline


def define_flags(fv: flags.FlagValues) -> None:
    cli.define_run_flags(fv)


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    start = time.perf_counter()
    result = cli.run_in_workdir(fv, pipeline.pretrain)
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
