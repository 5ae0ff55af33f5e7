"""PNG plots: training curves from metrics.jsonl and attention heatmaps with CJK-capable labels."""

import functools
import html
import importlib.util
import os

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import font_manager  # noqa: E402

from experiments import metrics  # noqa: E402


@functools.cache
def cjk_font_family() -> str | None:
    """Registers the Noto Sans CJK font shipped by `mplfonts` (DejaVu has no CJK glyphs)."""
    spec = importlib.util.find_spec("mplfonts")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "fonts", "NotoSansCJKsc-Regular.otf")
    if not os.path.exists(path):
        return None
    font_manager.fontManager.addfont(path)
    return font_manager.FontProperties(fname=path).get_name()


def _font_kwargs() -> dict:
    family = cjk_font_family()
    return {"fontfamily": [family, "DejaVu Sans"]} if family else {}


def plot_curves(workdir: str) -> str:
    """Loss and accuracy against step for train and validation; returns the PNG path."""
    rows = metrics.read(workdir)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for split, style in (("train", "-"), ("validation", "o-")):
        r = [row for row in rows if row["split"] == split]
        if not r:
            continue
        steps = [row["step"] for row in r]
        ax_loss.plot(steps, [row["loss"] for row in r], style, label=split)
        ax_acc.plot(steps, [row["accuracy"] for row in r], style, label=split)
    for ax, name in ((ax_loss, "loss"), (ax_acc, "accuracy")):
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(os.path.basename(os.path.abspath(workdir)))
    fig.tight_layout()
    path = os.path.join(workdir, "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_heatmap(weights_LxL: np.ndarray, tokens: list[str], title: str, path: str) -> str:
    """One attention map: queries on rows, keys on columns, token labels on both axes."""
    n = len(tokens)
    size = min(max(4.0, 0.28 * n + 2), 24)
    fig, ax = plt.subplots(figsize=(size, size))
    im = ax.imshow(weights_LxL[:n, :n], cmap="viridis", vmin=0.0)
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    fontsize = 9 if n <= 40 else 6
    ax.set_xticklabels(tokens, rotation=90, fontsize=fontsize, **_font_kwargs())
    ax.set_yticklabels(tokens, fontsize=fontsize, **_font_kwargs())
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    ax.set_title(title, **_font_kwargs())
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attention_html(rows: list[tuple[str, list[str], np.ndarray]], path: str) -> str:
    """A page shading each token by the attention it receives; rows are (caption, tokens, w_L)."""
    parts = [
        "<!doctype html><meta charset='utf-8'><title>attention</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "span{padding:2px 1px;border-radius:3px;line-height:2}</style>",
    ]
    for caption, tokens, w_L in rows:
        scale = float(w_L.max()) or 1.0
        spans = "".join(
            f"<span title='{w:.3f}' style='background:rgba(255,80,0,{w / scale:.3f})'>"
            f"{html.escape(t)}</span>"
            for t, w in zip(tokens, w_L, strict=True)
        )
        parts.append(f"<h3>{html.escape(caption)}</h3><p>{spans}</p>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path
