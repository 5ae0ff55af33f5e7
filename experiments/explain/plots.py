"""PNG plots: training curves from metrics.jsonl and attention heatmaps, with CJK-capable text.

Figures are `matplotlib.figure.Figure` objects, never pyplot's: saving one renders it with Agg
whatever the backend, so no backend is chosen here and a notebook's inline plots keep working.
"""

import functools
import importlib.util
import os

import matplotlib
import numpy as np
from matplotlib import font_manager, ft2font
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from experiments import workdirs
from experiments.training import baseline, metrics


def cjk_font_path() -> str | None:
    """The Noto Sans CJK font shipped by `mplfonts` (DejaVu has no CJK glyphs); None without it."""
    spec = importlib.util.find_spec("mplfonts")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "fonts", "NotoSansCJKsc-Regular.otf")
    return path if os.path.exists(path) else None


@functools.cache
def cjk_font_family() -> str | None:
    """Registers `cjk_font_path`'s font with matplotlib; its family name, None without it."""
    path = cjk_font_path()
    if path is None:
        return None
    font_manager.fontManager.addfont(path)
    return font_manager.FontProperties(fname=path).get_name()


def style() -> dict:
    """rcParams for `matplotlib.rc_context`: the CJK font first, then DejaVu Sans for the glyphs
    it lacks."""
    family = cjk_font_family()
    return {"font.family": [family, "DejaVu Sans"]} if family else {}


@functools.cache
def _glyphs() -> frozenset[int]:
    """The code points `style`'s fonts have glyphs for."""
    paths = [font_manager.findfont("DejaVu Sans"), cjk_font_path()]
    return frozenset(c for p in paths if p for c in ft2font.FT2Font(p).get_charmap())


def drawable(token: str) -> str:
    """`token` as a figure labels it: a character no font of `style` has is written U+XXXX. A
    checkpoint's vocabulary holds emoji (bert-base-chinese's has 👍), which were drawn as empty
    boxes, with a matplotlib warning per figure."""
    glyphs = _glyphs()
    return "".join(c if c.isspace() or ord(c) in glyphs else f"U+{ord(c):04X}" for c in token)


def needs_rotation(labels: list[str]) -> bool:
    """Whether some label is longer than 2 characters as drawn, and so is turned vertical on an
    x axis."""
    return any(len(drawable(t)) > 2 for t in labels)


def token_ticks(ax: Axes, axis: str, tokens: list[str]) -> None:
    """One 8-point label per token on `axis` ("x" or "y"). On x, when some token is longer than
    2 characters, every token but single characters (a CJK text's, punctuation) turns vertical,
    so neighbours never overlap and CJK stays upright. Tokens are labelled as `drawable`."""
    tokens = [drawable(t) for t in tokens]
    if axis == "y":
        ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
        return
    ax.set_xticks(range(len(tokens)), tokens, fontsize=8)
    if needs_rotation(tokens):
        for label, token in zip(ax.get_xticklabels(), tokens, strict=True):
            if len(token) > 1:
                label.set_rotation(90)


def best_validation(rows: list[dict]) -> tuple[int, float] | None:
    """(step, accuracy) of the checkpoint training kept as best (`metrics.improves`, the rule
    training applies); None before any."""
    best, best_loss = None, None
    for row in rows:
        if row["split"] == "validation" and metrics.improves(
            row, metrics.NO_BEST if best is None else best[1], best_loss
        ):
            best, best_loss = (row["step"], row["accuracy"]), row["loss"]
    return best


def plot_curves(workdir: str, path: str | None = None, label: str = "") -> str:
    """Loss and accuracy against step for train and validation, as PNG at `path` (default
    DIR/curves.png), with the TF-IDF baseline's validation accuracy when the run fit it; returns
    the path. `label` names what the loss and accuracy are of (e.g. "masked-token")."""
    rows = metrics.read(workdir)
    fig = Figure(figsize=(10, 4.8))
    ax_loss, ax_acc = fig.subplots(1, 2)
    for split, style in (("train", "-"), ("validation", "o-")):
        r = [row for row in rows if row["split"] == split]
        if not r:
            continue
        steps = [row["step"] for row in r]
        ax_loss.plot(steps, [row["loss"] for row in r], style, label=split)
        ax_acc.plot(steps, [row["accuracy"] for row in r], style, label=split)
    base_path = os.path.join(workdir, baseline.FILE)
    if os.path.exists(base_path):
        b = workdirs.read_json(base_path)
        ax_acc.axhline(
            b["validation_accuracy"][str(b["best_C"])],
            color="grey",
            linestyle="--",
            label=f"TF-IDF baseline ({b['features']}), validation",
        )
    best = best_validation(rows)
    if best is not None:
        ax_acc.plot(
            *best,
            "*",
            color="black",
            markersize=12,
            zorder=3,
            label=f"best validation {best[1]:.4f} (step {best[0]}): the kept model",
        )
    for ax, name in ((ax_loss, "loss"), (ax_acc, "accuracy")):
        ax.set_xlabel("step")
        ax.set_ylabel(f"{label} {name}".strip())
        ax.grid(alpha=0.3)
        # Below the axes: inside, the legend sat on the curves it explains.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, frameon=False)
    fig.suptitle(os.path.basename(os.path.abspath(workdir)))
    fig.tight_layout()
    path = path or os.path.join(workdir, "curves.png")
    fig.savefig(path, dpi=110, format="png")
    return path


def plot_heatmap(weights_LxL: np.ndarray, tokens: list[str], title: str, path: str) -> str:
    """One attention map: queries on rows, keys on columns, token labels on both axes.

    Cells are at least 0.2 inch, so 8-point labels never overlap, even at 64 tokens and more.
    """
    n = len(tokens)
    side = max(4.0, 0.2 * n + 2.0)
    with matplotlib.rc_context(style()):
        fig = Figure(figsize=(side + 1.0, side), layout="constrained")
        ax = fig.subplots()
        im = ax.imshow(weights_LxL[:n, :n], cmap="viridis", vmin=0.0, aspect="auto")
        token_ticks(ax, "x", tokens)
        token_ticks(ax, "y", tokens)
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query")
        ax.set_title(title)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02, label="attention weight")
        fig.savefig(path, dpi=100)
    return path
