"""Is the attention map an explanation? Erasure tests of five token rankings on a split.

  python -m experiments.faithfulness --workdir=runs/default [--split=test] [--limit=N]

Explains every text of the split (N drawn at random with --limit) five ways and measures how
much the prediction rests on what each ranking puts first (`experiments.explain.faithfulness`
says how). Writes DIR/faithfulness.json and DIR/faithfulness.png and prints the table as
markdown rows. Leave-one-out runs the model once per token: a few minutes for the embedded
data's test split on 2 CPU cores, hours for all of IMDB's test reviews: take a --limit there.
"""

import os

from absl import flags

from experiments import cli
from experiments.data.splits import SPLITS
from experiments.errors import UserError
from experiments.explain import faithfulness


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "A workdir written by experiments.train.", flag_values=fv)
    flags.DEFINE_enum("split", "test", list(SPLITS), "Split to explain.", flag_values=fv)
    flags.DEFINE_integer(
        "limit",
        None,
        "Only N texts of the split, drawn at random (the same every run): leave-one-out is "
        "slow on long texts.",
        flag_values=fv,
    )


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    if not fv.workdir:
        raise UserError("--workdir=DIR is required")
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {argv[1:]}; faithfulness takes only flags")
    result = faithfulness.faithfulness(fv.workdir, fv.split, fv.limit)
    name = os.path.basename(os.path.abspath(fv.workdir))
    print(f"{fv.split} split, {result['checkpoint']}: {result['num_texts']:,} texts")
    print(faithfulness.table(result, name))
    for pair, d in result["aopc_comprehensiveness_differences"].items():
        print(f"AOPC comprehensiveness, {pair}: {faithfulness.ci(d)}")
    halves = result["logit_halves"]
    if halves:
        e, b = halves["encoder"], halves["bag"]
        print(
            f"the encoder half of the logits alone gives the prediction for {e['agrees']:.1%} of "
            f"the texts (median margin {e['median_margin']:.3f}), the bag alone for "
            f"{b['agrees']:.1%} ({b['median_margin']:.3f}); attention can explain only the first"
        )
    written = (os.path.join(fv.workdir, name) for name in (faithfulness.FILE, faithfulness.PLOT))
    print(f"written: {', '.join(written)}")


if __name__ == "__main__":
    cli.main(define_flags, main)
