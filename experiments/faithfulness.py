"""Is the attention map an explanation? Erasure tests of five token rankings on a split.

  python -m experiments.faithfulness --workdir=runs/default [--split=test] [--limit=N]

Every text of the split (N drawn at random with --limit) is explained five ways
(`attn.importance`): attention (what `visualize` shades and `predict` lists), attention rollout,
gradient × input, leave-one-out and random, the control. For each ranking: comprehensiveness,
the drop of the predicted class's probability when its top k% of the text's tokens are erased
(PAD, so the n-grams and the bag lose them too), and sufficiency, the drop when only they are
kept (DeYoung et al. 2020), at k = 1, 2, 5, 10, 20% (at least one token); AOPC, their mean over
k; and the Spearman and Kendall correlation of its token scores with leave-one-out's in each
text. Each is a mean over texts with a 95% bootstrap interval (1,000 resamples of the texts),
and AOPC differences between methods are bootstrapped in pairs. For a model with a bag of
n-grams, also how often each half of its logits (encoder, bag) alone gives the prediction.

Writes DIR/faithfulness.json and DIR/faithfulness.png (probability drop against k, one line per
method) and prints the table as markdown rows: the faithfulness table of benchmarks/REPORT.md.
Leave-one-out runs the model once per token, so the cost grows with the square of the length:
a few minutes for the embedded data's 1,726 test reviews (median 45 tokens) on 2 CPU cores,
but about 2 CPU seconds per 512-token text, hours for all of IMDB's test reviews: take a
--limit there.
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
