"""The step-by-step figure of one attention head on one text: X, Q, K, V, the scores, the scaled
scores, the softmax weights and the outputs side by side, then one query's score against every key
before and after the softmax. It draws the values it is given and computes none."""

from typing import NamedTuple

import matplotlib
import numpy as np
from matplotlib import patches
from matplotlib.axes import Axes
from matplotlib.figure import Figure  # not pyplot: see experiments/explain/plots.py

from attn import models, multihead, scores
from experiments.explain import plots

# What each built-in score computes for one (query, key) pair, in matrix notation.
SCORE_FORMULAS = {
    "dot": "Q Kᵀ",
    "scaled_dot": "Q Kᵀ",
    "general": "Q W Kᵀ",
    "additive": "vᵀ tanh(W [q; k])",
    "mlp": "perceptron on [q; k; q∘k]",
}
MASKED_COLOR = "#9e9e9e"
POSITIVE, NEGATIVE, WEIGHT = "#c0392b", "#2e6da4", "#e67e22"


class Head(NamedTuple):
    """One head's values as drawn, for the tokens of one text; allowed_L False = masked key."""

    tokens: list[str]
    allowed_L: np.ndarray
    x_LxD: np.ndarray
    q_LxK: np.ndarray
    k_LxK: np.ndarray
    v_LxK: np.ndarray
    raw_LxL: np.ndarray
    scaled_LxL: np.ndarray
    weights_LxL: np.ndarray
    out_LxK: np.ndarray


def head_view(st: multihead.Steps, head: int, tokens: list[str], allowed_L: np.ndarray) -> Head:
    """Head `head` of a layer's steps (X is shared by all heads)."""
    per_head = (
        st.q_HxLxK,
        st.k_HxLxK,
        st.v_HxLxK,
        st.raw_HxLxL,
        st.scaled_HxLxL,
        st.weights_HxLxL,
        st.out_HxLxK,
    )
    return Head(
        tokens,
        np.asarray(allowed_L, bool),
        np.asarray(st.x_LxD, np.float32),
        *(np.asarray(a[head], np.float32) for a in per_head),
    )


def score_titles(score: str | scores.Score, d_head: int) -> tuple[str, str]:
    """Titles of the raw and the scaled score panels: the score function (its unscaled form
    where it has one, `attn.scores.Score.unscaled`), and the scaling."""
    sc = scores.get_score(score)
    raw = sc.unscaled if sc.unscaled is not None else sc
    formula = SCORE_FORMULAS.get(raw.name, raw.name)
    title = f"scores S = {formula}  [{sc.name}]"
    if sc.unscaled is not None:
        return title, f"scaled S / {sc.divisor}  (softmax input)"
    if sc.name == "scaled_dot":
        return title, f"scaled S / √{d_head}  (softmax input)"
    return title, f"{sc.name} is not scaled: S  (softmax input)"


def _matrix(
    ax: Axes,
    m_LxX: np.ndarray,
    h: Head,
    title: str,
    shape: str,
    *,
    keys_on_columns: bool,
    query: int | None,
    numbers: bool,
    bar_aspect: float,
    weights: bool = False,
) -> None:
    """One panel: tokens label the rows; columns are keys (tokens) or feature indices. Weights
    are shaded from 0 with masked keys grey; other values red above 0 and blue below."""
    rows, cols = m_LxX.shape
    if weights:
        cmap = matplotlib.colormaps["Oranges"].with_extremes(bad=MASKED_COLOR)
        shown = np.ma.masked_array(m_LxX, np.broadcast_to(~h.allowed_L, m_LxX.shape))
        im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=float(m_LxX.max()) or 1.0, aspect="auto")
    else:
        bound = float(np.abs(m_LxX).max()) or 1.0
        im = ax.imshow(m_LxX, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    plots.token_ticks(ax, "y", h.tokens)
    if keys_on_columns:
        plots.token_ticks(ax, "x", h.tokens)
        for j in np.flatnonzero(~h.allowed_L):
            if not weights:  # scores exist for masked keys; the softmax ignores them
                ax.add_patch(
                    patches.Rectangle(
                        (j - 0.5, -0.5), 1, rows, fill=False, hatch="///", ec=MASKED_COLOR, lw=0
                    )
                )
    else:
        ax.set_xticks([0, cols - 1], ["0", str(cols - 1)], fontsize=7)
    if query is not None:
        ax.add_patch(
            patches.Rectangle((-0.5, query - 0.5), cols, 1, fill=False, ec="black", lw=1.6)
        )
    if numbers:
        for i in range(rows):
            for j in range(cols):
                if weights and not h.allowed_L[j]:
                    continue
                v = m_LxX[i, j]
                dark = abs(v) > 0.6 * float(np.abs(m_LxX).max())
                color = "white" if dark else "black"
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6.5, color=color)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(shape, fontsize=8)
    ax.figure.colorbar(im, ax=ax, fraction=0.12, pad=0.03, aspect=bar_aspect)


def _bars(ax: Axes, values_L: np.ndarray, h: Head, title: str, *, weights: bool) -> None:
    """One query's value for every key; masked keys drawn grey and hatched at 0."""
    n = len(values_L)
    allowed = h.allowed_L
    shown = np.where(allowed, values_L, 0.0)
    if weights:
        colors = [WEIGHT if a else MASKED_COLOR for a in allowed]
    else:
        colors = [
            MASKED_COLOR if not a else POSITIVE if v >= 0 else NEGATIVE
            for a, v in zip(allowed, values_L, strict=True)
        ]
    bars = ax.bar(range(n), shown, color=colors, width=0.8)
    for bar, a in zip(bars, allowed, strict=True):
        if not a:
            bar.set_hatch("///")
    if n <= 24:
        labels = [f"{v:.2f}" if a else "masked" for v, a in zip(values_L, allowed, strict=True)]
        ax.bar_label(bars, labels, fontsize=7, padding=2, rotation=90 if n > 12 else 0)
    ax.axhline(0.0, color="black", lw=0.6)
    # Room for the value labels on both sides of 0 (bars stop autoscaling at 0).
    low, high = min(float(shown.min()), 0.0), max(float(shown.max()), 0.0)
    room = 0.25 * (high - low) or 0.1
    ax.set_ylim(low - room if low < 0 else 0.0, high + room)
    plots.token_ticks(ax, "x", h.tokens)
    ax.set_xlabel("key", fontsize=8)
    ax.set_title(title, fontsize=9)


def plot_steps(
    h: Head,
    *,
    score: str | scores.Score,
    query: int,
    title: str,
    x_title: str,
    path: str,
    qk_titles: tuple[str, str] = models.PROJECTED_QK,
) -> str:
    """The figure for one head; `score` titles its score panels (`score_titles`: the Steps'
    score says its unscaled form and divisor), `x_title` says what X is (e.g. after which
    LayerNorm), and `qk_titles` what Q and K are (`attn.models.steps_qk`: e.g. rotated by
    position)."""
    length, d_model = h.x_LxD.shape
    d_head = h.q_LxK.shape[1]
    cell = 0.42 if length <= 10 else 0.3 if length <= 24 else 0.22  # inches per token
    feature = 0.09  # inches per feature column
    numbers = length <= 10  # values written in the L x L cells when they fit
    label_room = 0.9 if plots.needs_rotation(h.tokens) else 0.0
    # X at most 9 inches wide and a head's panels at most 3: a pretrained encoder's 384 or 768
    # features would otherwise make the figure several times as wide as the attention it is about.
    head_w = min(max(d_head * feature, 1.5), 3.0)
    row1 = [min(max(d_model * feature, 2.4), 9.0)] + [head_w] * 3
    row2 = [length * cell] * 3 + [head_w]
    width = max(sum(row1), sum(row2)) + 4 * 1.6
    row_height = length * cell + 1.5 + label_room
    bars_height = 2.8 + label_room
    raw_title, scaled_title = score_titles(score, d_head)
    shapes = {
        "tokens": f"{length} × {d_model}  (tokens × d_model)",
        "head": f"{length} × {d_head}  (tokens × d_head)",
        "square": f"{length} × {length}  (queries × keys)",
    }
    with matplotlib.rc_context(plots.style()):
        fig = Figure(figsize=(width, 2 * row_height + bars_height + 0.8), layout="constrained")
        top, middle, bottom = fig.subfigures(
            3, 1, height_ratios=[row_height, row_height, bars_height]
        )
        ax_x, ax_q, ax_k, ax_v = top.subplots(1, 4, width_ratios=row1)
        ax_raw, ax_scaled, ax_w, ax_out = middle.subplots(1, 4, width_ratios=row2)
        # Colorbars about 0.16 inch wide and as tall as their panel, even beside narrow panels.
        bar_aspect = max(length * cell / 0.16, 8.0)
        features = {"keys_on_columns": False, "numbers": False, "bar_aspect": bar_aspect}
        _matrix(ax_x, h.x_LxD, h, x_title, shapes["tokens"], query=None, **features)
        _matrix(ax_q, h.q_LxK, h, qk_titles[0], shapes["head"], query=query, **features)
        _matrix(ax_k, h.k_LxK, h, qk_titles[1], shapes["head"], query=None, **features)
        _matrix(ax_v, h.v_LxK, h, "V = X Wv", shapes["head"], query=None, **features)
        square = {
            "keys_on_columns": True,
            "numbers": numbers,
            "query": query,
            "bar_aspect": bar_aspect,
        }
        _matrix(ax_raw, h.raw_LxL, h, raw_title, shapes["square"], **square)
        _matrix(ax_scaled, h.scaled_LxL, h, scaled_title, shapes["square"], **square)
        title_w = "softmax over keys: weights"
        _matrix(ax_w, h.weights_LxL, h, title_w, shapes["square"], weights=True, **square)
        _matrix(ax_out, h.out_LxK, h, "output = weights V", shapes["head"], query=query, **features)
        ax_before, ax_after = bottom.subplots(1, 2)
        who = f"query {query} '{plots.drawable(h.tokens[query])}'"
        _bars(
            ax_before,
            h.scaled_LxL[query],
            h,
            f"{who}: score per key, before softmax",
            weights=False,
        )
        _bars(
            ax_after, h.weights_LxL[query], h, f"{who}: weight per key, after softmax", weights=True
        )
        if not h.allowed_L.all():
            bottom.legend(
                handles=[
                    patches.Patch(
                        fc=MASKED_COLOR, hatch="///", label="masked key (padding): weight exactly 0"
                    )
                ],
                loc="outside lower center",
                fontsize=8,
            )
        fig.suptitle(
            f"{title}\nrows: queries (the chosen one outlined); key columns in the score panels",
            fontsize=10,
        )
        fig.savefig(path, dpi=100)
    return path
