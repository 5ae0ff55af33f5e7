"""Attention heatmaps (one PNG per layer and head), a shaded-token HTML page, and training curves.

  python -m experiments.visualize --workdir=runs/default "这本书很好看，推荐"

Writes into DIR/visualize/ (or --out): layer<l>_head<h>.png per text, attention.html, and
DIR/curves.png from DIR/metrics.jsonl.
"""

import os

from absl import flags

from experiments import cli, forward, plots, workdirs
from experiments.cli import UserError


def visualize(workdir: str, texts: list[str], out: str, max_tokens: int = 64) -> list[str]:
    """Writes the plots for `texts`; returns the paths written."""
    trained = workdirs.load(workdir)
    encoded = []  # every text is checked before anything is written
    for n, text in enumerate(texts, 1):
        try:
            encoded.append(workdirs.encode(trained, text))
        except UserError as e:
            raise UserError(f"text {n}: {e}") from None
    os.makedirs(out, exist_ok=True)
    written, rows = [], []
    for n, ids_L in enumerate(encoded, 1):
        result = forward.analyse(trained.params, trained.cfg, ids_L)
        tokens = trained.tokenizer.tokens(ids_L.tolist())
        label = trained.label_names[int(result["probs"].argmax())]
        caption = f"text {n}: {label} ({result['probs'].max():.2f})"
        rows.append((caption, tokens, result["received"]))
        shown = tokens[:max_tokens]
        for layer, w_HxLxL in enumerate(result["attention"]):
            for head, w_LxL in enumerate(w_HxLxL):
                path = os.path.join(out, f"text{n}_layer{layer}_head{head}.png")
                title = f"{caption} | layer {layer} head {head}"
                written.append(plots.plot_heatmap(w_LxL, shown, title, path))
    written.append(plots.attention_html(rows, os.path.join(out, "attention.html")))
    written.append(plots.plot_curves(workdir))
    return written


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "A workdir written by experiments.train.", flag_values=fv)
    flags.DEFINE_string("out", None, "Output directory; default DIR/visualize.", flag_values=fv)
    flags.DEFINE_integer("max_tokens", 64, "Tokens shown on heatmap axes.", flag_values=fv)


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    if not fv.workdir:
        raise UserError("--workdir=DIR is required")
    if len(argv) < 2:
        raise UserError('give at least one text, e.g. visualize --workdir=DIR "很好看"')
    out = fv.out or os.path.join(fv.workdir, "visualize")
    for path in visualize(fv.workdir, argv[1:], out, fv.max_tokens):
        print(path)


if __name__ == "__main__":
    cli.main(define_flags, main)
