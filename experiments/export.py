"""Writes a trained workdir as a directory that serves it without the workdir: a fine-tune as a
transformers model directory, attn's own model as a jax.export artifact.

  python -m experiments.export --workdir=runs/ft --out=exported/ft [--onnx]
  python -m experiments.export --workdir=runs/student --out=exported/student

OUT holds config.json, model.safetensors (the served weights alone: the weight average when the
run kept one, no optimizer state), the checkpoint's tokenizer files and a README.md model card;
AutoTokenizer.from_pretrained(OUT) and AutoModelForSequenceClassification.from_pretrained(OUT)
load it. A "cls" fine-tune (and ModernBERT's either way) is the family's own
...ForSequenceClassification; a mean-pooled one of another family is
MeanPooledForSequenceClassification, whose code is written beside it (modeling_mean_pooled.py:
load it with trust_remote_code=True).
attn reads it back too: `python -m experiments.predict --pretrained=OUT TEXT`. --onnx adds
OUT/model.onnx (transformers' model traced by torch.onnx; inputs as the tokenizer names them,
batch and length free), for a Python that has torch, transformers, onnx and onnxscript, which
attn itself never needs: without them it is refused in one line before anything is read.

A workdir of attn's own model (trained from scratch, or distilled from a teacher), which no
transformers class computes, is written by `jax.export` instead (`exporting.jax_dir`): OUT holds
model.jax (its forward as serialized StableHLO, batch and length symbolic), weights.npz, its
tokenizer's files, classifier.json (labels, how a text is read) and load.py, a loader that needs
jax and numpy, not this repository: `python OUT/load.py TEXT` gives predict's probabilities.

OUT must not exist or be an empty directory; it is written under a temporary name beside it and
renamed when whole. A pretraining workdir, and a fine-tune with a bag (model.bag_buckets), which
no transformers class computes, are refused in one line.
"""

from absl import flags

from experiments import cli
from experiments.errors import UserError
from experiments.exporting import from_workdir, jax_dir


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string(
        "workdir", None, "A trained workdir: a fine-tune, or attn's own model.", flag_values=fv
    )
    flags.DEFINE_string("out", None, "The directory to write (new, or empty).", flag_values=fv)
    flags.DEFINE_boolean(
        "onnx",
        False,
        "Also write OUT/model.onnx (needs torch, transformers, onnx and onnxscript).",
        flag_values=fv,
    )


def main(fv: flags.FlagValues, argv: list[str]) -> int:
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {argv[1:]}: export takes --workdir and --out")
    if not fv.workdir or not fv.out:
        raise UserError("--workdir=DIR and --out=DIR are both required")
    out = from_workdir.export(fv.workdir, fv.out, onnx=fv.onnx)
    if (out / jax_dir.MODEL).exists():
        print(f"wrote {out}: python {out / jax_dir.LOADER} TEXT, or its Classifier in Python")
    else:
        print(
            f"wrote {out}: load it with transformers' AutoModelForSequenceClassification, or "
            f"python -m experiments.predict --pretrained={out}"
        )
    return 0


if __name__ == "__main__":
    cli.main(define_flags, main)
