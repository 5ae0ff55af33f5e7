"""Attention heatmaps, self-attention step by step, an HTML page, and training curves.

  python -m experiments.visualize --workdir=runs/default "这本书很好看，推荐"
  python -m experiments.visualize --workdir=runs/default --steps --head=1 --query=3 "这本书很好看"

Writes into OUT (--out, default DIR/visualize), replacing what an earlier call left there:
  text<n>_layer<l>_head<h>.png        text n's attention weights, one map per layer and head
  text<n>_steps_layer<l>_head<h>.png  with --steps: layer l, head h of text n step by step
                                      (X, Q, K, V, scores, scaled scores, softmax weights, outputs,
                                      and query --query's scores before and after the softmax)
  attention.html                      every text's tokens shaded by the attention they receive,
                                      its top tokens by attention and by leave-one-out side by
                                      side with the probability once the 3 most-attended are
                                      erased, and the steps of the first text as tables of numbers
and DIR/curves.png from DIR/metrics.jsonl. A call that fails changes none of them. A prediction
that reads less than it seems (a text cut to the model's length, or mostly outside its
vocabulary) gets a line `note: text N: ...` on stderr and the same words on the page, as in
experiments.predict. With --convert (or the run's data.convert) stderr says how many texts the
conversion changed; the tokens drawn are the converted ones.
"""

import os
import re
import secrets
import shutil
import sys

import numpy as np
from absl import flags

from attn import classifier, models
from experiments import cli, serving
from experiments.data import conversion
from experiments.errors import UserError
from experiments.explain import maps, page, plots, ranking, step_plots

# Everything visualize writes into OUT: an existing OUT holding anything else is not replaced.
_OUTPUTS = re.compile(r"attention\.html|text\d+_(steps_)?layer\d+_head\d+\.png")


def visualize(
    workdir: str,
    texts: list[str],
    out: str,
    max_tokens: int = 64,
    *,
    steps: bool = False,
    layer: int = 0,
    head: int = 0,
    query: int = 0,
    window: int = 32,
    pad_to: int = 0,
    convert: str | None = None,
) -> list[str]:
    """Writes the plots for `texts` into a fresh directory that then replaces `out`; returns the
    paths written.

    The steps (drawn with `steps` for every text, and on the page for the first) are those of
    layer `layer`, head `head`, on the text's first `window` tokens run alone, padded with PAD
    to `pad_to` tokens when that is longer (padding is what masked keys look like). Texts are
    converted by `convert` (an OpenCC conversion), by default as the run converted its own.
    """
    trained = serving.converting(serving.load(workdir), convert)
    cfg = trained.cfg
    _check_choice(cfg, layer=layer, head=head, window=window, pad_to=pad_to, max_tokens=max_tokens)
    _check_out(out)
    reads = []  # every text is checked before anything is written
    for n, text in enumerate(texts, 1):
        try:
            reads.append(serving.read(trained, text))
        except UserError as e:
            raise UserError(f"text {n}: {e}") from None
    notes = ["; ".join(r.reading.notes) for r in reads]
    drawn = [_window(r.ids_L, window, pad_to) for r in reads]
    for n, ids_L in enumerate(drawn if steps else drawn[:1], 1):
        if not 0 <= query < len(ids_L):
            raise UserError(
                f"text {n}: --query={query} is not one of its {len(ids_L)} drawn tokens "
                f"(0 to {len(ids_L) - 1})"
            )
    for n, note in enumerate(notes, 1):
        if note:
            print(f"note: text {n}: {note}", file=sys.stderr)
    conversion.report(trained.config.data.convert, sum(r.converted for r in reads), len(reads))

    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    fresh = os.path.join(parent, f".{os.path.basename(out)}.tmp-{secrets.token_hex(4)}")
    os.mkdir(fresh)  # not mkdtemp: the directory gets the user's usual permissions
    curves = os.path.join(workdir, "curves.png")
    curves_tmp = curves + ".tmp"
    try:
        names = _draw(
            trained,
            reads,
            drawn,
            notes,
            fresh,
            max_tokens=max_tokens,
            steps=steps,
            layer=layer,
            head=head,
            query=query,
        )
        plots.plot_curves(workdir, curves_tmp)
        _replace_dir(fresh, out)
        os.replace(curves_tmp, curves)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        if os.path.exists(curves_tmp):
            os.remove(curves_tmp)
        raise
    return [os.path.join(out, name) for name in names] + [curves]


def _check_choice(cfg: models.AnyConfig, **choice: int) -> None:
    """Each flag's allowed range for this model, and why. Windows longer than the model's
    max_len are fine: texts are already cut to it."""
    num_layers, num_heads, _ = models.layout(cfg)
    bounds = {
        "layer": (0, num_layers - 1, f"the model has {num_layers} layer(s), from 0"),
        "head": (0, num_heads - 1, f"the model has {num_heads} head(s), from 0"),
        "pad_to": (0, cfg.max_len, f"the model reads at most {cfg.max_len} tokens"),
        "window": (1, None, "at least one token is drawn"),
        "max_tokens": (1, None, "at least one token is drawn"),
    }
    for name, value in choice.items():
        low, high, why = bounds[name]
        if value < low or (high is not None and value > high):
            allowed = f"{low} to {high}" if high is not None else f"at least {low}"
            raise UserError(f"--{name}={value} is out of range ({allowed}): {why}")


def _check_out(out: str) -> None:
    if os.path.isdir(out):
        others = sorted(f for f in os.listdir(out) if not _OUTPUTS.fullmatch(f))
        if others:
            raise UserError(
                f"{out!r} holds files visualize did not write ({', '.join(others[:3])}); "
                "it replaces its output directory whole, so give an empty or new --out"
            )
    elif os.path.exists(out):
        raise UserError(f"{out!r} is a file; --out must be a directory")


def _window(ids_L: np.ndarray, window: int, pad_to: int) -> np.ndarray:
    ids_L = ids_L[:window]
    padding = np.full(max(pad_to - len(ids_L), 0), classifier.PAD, ids_L.dtype)
    return np.concatenate([ids_L, padding])


def _draw(
    trained: serving.Trained,
    reads: list[serving.Read],
    drawn: list[np.ndarray],
    notes: list[str],
    out: str,
    *,
    max_tokens: int,
    steps: bool,
    layer: int,
    head: int,
    query: int,
) -> list[str]:
    """Writes every file into `out`; returns their names in the order written."""
    cfg = trained.cfg
    _, num_heads, score = models.layout(cfg)
    names, rows = [], []
    first = None
    x_title = models.steps_input(cfg, layer)
    qk_titles = models.steps_qk(cfg, layer)
    for n, (r, view_L, note) in enumerate(zip(reads, drawn, notes, strict=True), 1):
        ids_L, tokens = r.ids_L, r.tokens_L
        result = maps.analyse(trained.params, cfg, ids_L, r.bag_G, trained.config.data)
        label = trained.label_names[int(result["probs"].argmax())]
        caption = f"text {n}: {label} ({result['probs'].max():.2f})"
        checked = ranking.explain_read(trained, r)
        rows.append(
            (f"{caption} ({note})" if note else caption, tokens, result["received"], checked)
        )
        for lay, w_HxLxL in enumerate(result["attention"]):
            for h, w_LxL in enumerate(w_HxLxL):
                names.append(f"text{n}_layer{lay}_head{h}.png")
                title = f"{caption} | layer {lay} head {h}"
                path = os.path.join(out, names[-1])
                plots.plot_heatmap(w_LxL, tokens[:max_tokens], title, path)
        if not (steps or n == 1):
            continue
        try:
            st = maps.attention_steps(trained.params, cfg, view_L, layer)
        except ValueError as e:  # a layer the model cannot draw honestly says why in one line
            raise UserError(f"--layer={layer}: {e}") from None
        view = step_plots.head_view(
            st, head, trained.tokenizer.tokens(view_L.tolist()), view_L != classifier.PAD
        )
        shown = sum(view.allowed_L)
        cut = f"tokens 1-{shown} of {len(ids_L)}, run alone" if shown < len(ids_L) else ""
        padded = f"padded to {len(view_L)}" if shown < len(view_L) else ""
        where = " | ".join(p for p in (cut, padded) if p)
        heading = (
            f"{caption} | layer {layer} head {head} of {num_heads} | "
            f"score {score}{' | ' + where if where else ''}"
        )
        if n == 1:
            first = (view, heading, st.score)
        if steps:
            names.append(f"text{n}_steps_layer{layer}_head{head}.png")
            step_plots.plot_steps(
                view,
                score=st.score,  # the Score itself: it may say its unscaled form and divisor
                query=query,
                title=heading,
                x_title=x_title,
                path=os.path.join(out, names[-1]),
                qk_titles=qk_titles,
            )
    if cfg.pooling == "structured":
        meaning = "the weight structured pooling gives it, averaged over hops"
    else:
        meaning = "the attention it receives in the last layer, averaged over queries and heads"
    names.append("attention.html")
    page.write(
        os.path.join(out, names[-1]),
        rows,
        shade_meaning=meaning,
        steps=first[0],
        steps_heading=f"Self-attention step by step: {first[1]}",
        score=first[2],
        query=query,
        x_title=x_title,
        qk_titles=qk_titles,
    )
    return names


def _replace_dir(fresh: str, out: str) -> None:
    """Moves directory `fresh` to `out`, removing what an earlier call left there."""
    if not os.path.exists(out):
        os.rename(fresh, out)
        return
    old = fresh + ".old"
    os.rename(out, old)
    try:
        os.rename(fresh, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old)


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "A workdir written by experiments.train.", flag_values=fv)
    flags.DEFINE_string(
        "out", None, "Output directory, replaced whole; default DIR/visualize.", flag_values=fv
    )
    flags.DEFINE_integer(
        "max_tokens", 64, "Tokens shown on the heatmaps' axes (the first N).", flag_values=fv
    )
    flags.DEFINE_bool(
        "steps",
        False,
        "Also draw text<n>_steps_layer<l>_head<h>.png: self-attention step by step.",
        flag_values=fv,
    )
    flags.DEFINE_integer("layer", 0, "Layer drawn step by step (from 0).", flag_values=fv)
    flags.DEFINE_integer("head", 0, "Head drawn step by step (from 0).", flag_values=fv)
    flags.DEFINE_integer(
        "query",
        0,
        "Token (from 0) whose scores are drawn before and after softmax.",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "window",
        32,
        "Steps are drawn for a text's first N tokens, run through the model alone.",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "pad_to",
        0,
        "Pad the drawn tokens with PAD to this length, to see padding keys masked.",
        flag_values=fv,
    )
    cli.define_convert_flag(fv)


def main(fv: flags.FlagValues, argv: list[str]) -> None:
    if not fv.workdir:
        raise UserError("--workdir=DIR is required")
    if len(argv) < 2:
        raise UserError('give at least one text, e.g. visualize --workdir=DIR "很好看"')
    out = fv.out or os.path.join(fv.workdir, "visualize")
    written = visualize(
        fv.workdir,
        argv[1:],
        out,
        fv.max_tokens,
        steps=fv.steps,
        layer=fv.layer,
        head=fv.head,
        query=fv.query,
        window=fv.window,
        pad_to=fv.pad_to,
        convert=fv.convert,
    )
    for path in written:
        print(path)


if __name__ == "__main__":
    cli.main(define_flags, main)
