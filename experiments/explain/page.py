"""The HTML page of `visualize`: every text with each token shaded by, and labelled with, the
attention it receives, its top tokens by attention and by leave-one-out side by side with the
erasure test of the attention, a legend, and the step-by-step values of one head for the first
text, in tables with the numbers in the cells."""

import base64
import html
import io

import numpy as np

from attn import models, scores
from experiments.data import chosen
from experiments.explain import plots, step_plots

CJK_FAMILY = "attn Noto Sans CJK SC"  # the page's name for the font it carries

_STYLE = """
body{font-family:sans-serif;max-width:75em;margin:2em auto;padding:0 1em}
ruby{padding:2px 1px;border-radius:3px;margin:0 1px;font-size:1.3em}
rt{font-size:0.55em;color:#333}
.legend{border:1px solid #ccc;padding:0.6em 1em;margin:1em 0;background:#fafafa}
.bar{display:inline-block;width:12em;height:1em;vertical-align:middle;border:1px solid #999}
.swatch{display:inline-block;width:1.2em;height:1em;vertical-align:middle;border:1px solid #999}
.panels{display:flex;flex-wrap:wrap;gap:1.2em;align-items:flex-start}
.panel{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:0.72em;font-family:monospace}
td,th{border:1px solid #ddd;padding:1px 3px;text-align:right}
th{background:#f3f3f3;font-family:sans-serif}
tr.query td{border-top:2px solid #000;border-bottom:2px solid #000}
td.masked{background:#9e9e9e;color:#fff}
td.ignored{background-image:repeating-linear-gradient(45deg,#0000 0 4px,#9e9e9e99 4px 6px)}
.shape{font-size:0.8em;color:#555}
table.side{font-size:0.9em;font-family:sans-serif;margin:0.3em 0}
table.side td{text-align:left}
"""


def _cells(values: np.ndarray, allowed: np.ndarray, *, weights: bool, keys: bool) -> str:
    """One row's cells. Weights are orange from 0, other values red above 0 and blue below, each
    stronger with |value| relative to the largest over allowed keys. On key columns, a weight of a
    masked key is grey and a score of one striped (computed, but ignored by the softmax)."""
    masked = ~allowed if keys else np.zeros(len(values), bool)
    bound = float(np.abs(values[~masked]).max()) if (~masked).any() else 0.0
    cells = []
    for v, m in zip(values, masked, strict=True):
        if m and weights:
            cells.append("<td class='masked'>masked</td>")
            continue
        a = 0.8 * min(abs(v) / bound, 1.0) if bound else 0.0
        rgb = "230,126,34" if weights else "192,57,43" if v >= 0 else "46,109,164"
        cls = " class='ignored'" if m else ""
        cells.append(f"<td{cls} style='background-color:rgba({rgb},{a:.2f})'>{v:.2f}</td>")
    return "".join(cells)


def _table(
    m_LxX: np.ndarray,
    h: step_plots.Head,
    title: str,
    shape: str,
    *,
    keys: bool,
    query: int | None,
    weights: bool = False,
) -> str:
    """One matrix: tokens label the rows; columns are keys or feature indices."""
    esc = [html.escape(t) for t in h.tokens]
    heads = esc if keys else [str(j) for j in range(m_LxX.shape[1])]
    rows = ["<tr><th></th>" + "".join(f"<th>{c}</th>" for c in heads) + "</tr>"]
    for i, row in enumerate(m_LxX):
        cls = " class='query'" if i == query else ""
        cells = _cells(row, h.allowed_L, weights=weights, keys=keys)
        rows.append(f"<tr{cls}><th>{esc[i]}</th>{cells}</tr>")
    return (
        f"<div class='panel'><b>{html.escape(title)}</b><table>{''.join(rows)}</table>"
        f"<div class='shape'>{html.escape(shape)}</div></div>"
    )


def _steps(
    h: step_plots.Head,
    *,
    heading: str,
    score: str | scores.Score,
    query: int,
    x_title: str,
    qk_titles: tuple[str, str],
) -> str:
    length, d_model = h.x_LxD.shape
    d_head = h.q_LxK.shape[1]
    raw_title, scaled_title = step_plots.score_titles(score, d_head)
    tok, hd, sq = (
        f"{length} × {d_model} (tokens × d_model)",
        f"{length} × {d_head} (tokens × d_head)",
        f"{length} × {length} (queries × keys)",
    )
    features = {"keys": False}
    square = {"keys": True, "query": query}
    inputs = [
        _table(h.x_LxD, h, x_title, tok, query=None, **features),
        _table(h.q_LxK, h, qk_titles[0], hd, query=query, **features),
        _table(h.k_LxK, h, qk_titles[1], hd, query=None, **features),
        _table(h.v_LxK, h, "V = X Wv", hd, query=None, **features),
    ]
    attention = [
        _table(h.raw_LxL, h, raw_title, sq, **square),
        _table(h.scaled_LxL, h, scaled_title, sq, **square),
        _table(h.weights_LxL, h, "softmax over keys: weights", sq, weights=True, **square),
        _table(h.out_LxK, h, "output = weights V", hd, query=query, **features),
    ]
    rows = "".join(
        f"<tr><th>{name}</th>{_cells(r, h.allowed_L, weights=w, keys=True)}</tr>"
        for name, r, w in (
            ("score (softmax input)", h.scaled_LxL[query], False),
            ("weight", h.weights_LxL[query], True),
        )
    )
    keys = "".join(f"<th>{html.escape(t)}</th>" for t in h.tokens)
    who = f"query {query} '{html.escape(h.tokens[query])}'"
    per_query = (
        f"<div class='panel'><b>{who}: its score against each key, before and after the "
        f"softmax</b><table><tr><th>key</th>{keys}</tr>{rows}</table></div>"
    )
    return (
        f"<h2>{html.escape(heading)}</h2>"
        "<div class='legend'>Each table is one step of the head's computation, in order; rows "
        "are queries (tokens), the outlined row is the chosen query. Cell colour: "
        "<span class='swatch' style='background:rgba(192,57,43,0.75)'></span> positive, "
        "<span class='swatch' style='background:rgba(46,109,164,0.75)'></span> negative, "
        "stronger for larger |value| within the table; "
        "<span class='swatch' style='background:rgba(230,126,34,0.85)'></span> softmax weight "
        "(each row sums to 1); "
        "<span class='swatch' style='background:#9e9e9e'></span> masked key (padding, "
        "weight exactly 0); striped: a masked key's score, computed but ignored by the "
        "softmax.</div>"
        f"<div class='panels'>{''.join(inputs)}</div><p></p>"
        f"<div class='panels'>{''.join(attention)}</div><p></p>{per_query}"
    )


def _side_by_side(e: dict) -> str:
    """The top tokens by attention and by leave-one-out, and what erasing the top ones does."""
    by_attention = e["attention"] or []
    lines = ["<tr><th>rank</th><th>attention (weight)</th><th>leave-one-out (drop)</th></tr>"]
    for rank in range(max(len(by_attention), len(e["leave_one_out"]))):
        cells = [
            f"{html.escape(ranked[rank][0])} ({ranked[rank][1]:{fmt}})"
            if rank < len(ranked)
            else ""
            for ranked, fmt in ((by_attention, ".3f"), (e["leave_one_out"], "+.3f"))
        ]
        lines.append(f"<tr><th>{rank + 1}</th><td>{cells[0]}</td><td>{cells[1]}</td></tr>")
    k = e["removed"]
    attended = (
        "the model has no attention"
        if e["without_attended"] is None
        else f"{e['without_attended']:.3f}"
    )
    return (
        f"<table class='side'>{''.join(lines)}</table>"
        f"<p>Probability of the predicted class: {e['probability']:.3f}; with the {k} "
        f"most-attended tokens erased: <b>{attended}</b>; with the {k} top leave-one-out tokens "
        f"erased: <b>{e['without_leave_one_out']:.3f}</b>.</p>"
    )


def write(
    path: str,
    rows: list[tuple[str, list[str], np.ndarray, dict]],
    *,
    shade_meaning: str,
    steps: step_plots.Head,
    steps_heading: str,
    score: str | scores.Score,
    query: int,
    x_title: str,
    qk_titles: tuple[str, str] = models.PROJECTED_QK,
) -> str:
    """rows are (caption, tokens, received_L, `ranking.explain`'s dict) per text; `steps` is the
    first text's head, its X, Q and K titled `x_title` and `qk_titles`, `score` its score
    (`step_plots.score_titles`)."""
    parts = [
        "<!doctype html><meta charset='utf-8'><title>attention</title>",
        f"<style>{_STYLE}</style>",
        "<div class='legend'><b>Legend.</b> Each token is shaded by "
        f"{html.escape(shade_meaning)}; the number above it is that value. "
        "<span class='bar' style='background:linear-gradient(to right,rgba(255,80,0,0),"
        "rgba(255,80,0,1))'></span> 0 to the largest value in the text. Under each text, its "
        "top tokens by attention and by leave-one-out (how much the predicted class's "
        "probability drops when that token alone is erased: turned into padding, its n-grams "
        "gone), and the probability once the top ones of each are erased. Attention is an "
        "explanation only as far as erasing what it points at changes the prediction; "
        "<code>python -m experiments.faithfulness</code> measures that over a whole split.</div>",
    ]
    for caption, tokens, w_L, explained in rows:
        scale = float(w_L.max()) or 1.0
        spans = "".join(
            f"<ruby style='background:rgba(255,80,0,{w / scale:.3f})'>{html.escape(t)}"
            f"<rt>{w:.3f}</rt></ruby>"
            for t, w in zip(tokens, w_L, strict=True)
        )
        parts.append(f"<h3>{html.escape(caption)}</h3><p>{spans}</p>{_side_by_side(explained)}")
    parts.append(
        _steps(
            steps,
            heading=steps_heading,
            score=score,
            query=query,
            x_title=x_title,
            qk_titles=qk_titles,
        )
    )
    page = "\n".join(parts)
    font = font_face(page)
    if font:
        page = page.replace(
            f"<style>{_STYLE}", f"<style>{font}{_STYLE.replace('sans-serif', _FAMILIES)}", 1
        )
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


_FAMILIES = f"'{CJK_FAMILY}',sans-serif"


def font_face(page: str) -> str:
    """An @font-face that carries the font the PNGs draw CJK text with (`plots.cjk_font_path`)
    for a page that has CJK text; "" for one that has none, or without the font. A browser's
    sans-serif may have no CJK glyphs (they rendered as boxes), and a font file beside the page
    or in site-packages is refused to a page opened from disk in some browsers, so the font
    travels inside the page: only the glyphs of the page's characters (tens of kB, not the
    font's 16 MB), as a data: URL."""
    path = plots.cjk_font_path()
    if path is None or not chosen.cjk_share([page]):
        return ""
    from fontTools import subset  # matplotlib's own dependency

    options = subset.Options()
    options.layout_features = []  # horizontal text of single characters
    options.name_IDs = ["*"]  # the font's name and licence (SIL OFL) travel with its glyphs
    font = subset.load_font(path, options)
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=page)
    subsetter.subset(font)
    out = io.BytesIO()
    subset.save_font(font, out, options)
    data = base64.b64encode(out.getvalue()).decode("ascii")
    return (
        f"@font-face{{font-family:'{CJK_FAMILY}';"
        f"src:url(data:font/otf;base64,{data}) format('opentype')}}"
    )
