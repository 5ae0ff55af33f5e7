"""visualize on the tiny trained workdir: the step-by-step values it draws recombine into the
drawn weights and outputs and are the model's own; the output directory is replaced whole; bad
choices are one-line errors that write nothing."""

import base64
import io
import itertools
import math
import os
import re

import jax
import numpy as np
import pytest
from conftest import assert_one_line_error, run, run_here, tree_hash
from matplotlib.figure import Figure
from matplotlib.text import Text

import attn
from attn import classifier, models, multihead, scores
from experiments import serving, visualize
from experiments.explain import maps, page, plots, step_plots
from experiments.training import metrics

TEXTS = ["很好看", "质量太差了，不推荐"]
WINDOW, PAD_TO, QUERY = 6, 5, 2  # text 1 is padded (3 -> 5 tokens), text 2 cut (9 -> 6)


@pytest.fixture(scope="module")
def drawn(trained, tmp_path_factory) -> dict:
    """One `visualize --steps` call on a copy of the trained workdir, with every Head that was
    drawn in a figure or put on the page."""
    import shutil

    workdir = str(tmp_path_factory.mktemp("steps") / "run")
    shutil.copytree(trained, workdir)
    out = os.path.join(workdir, "vis")
    figures, pages = [], []
    real_plot, real_write = step_plots.plot_steps, page.write

    def plot_steps(h, **kwargs):
        figures.append((h, kwargs))
        return real_plot(h, **kwargs)

    def write(path, rows, **kwargs):
        pages.append(kwargs["steps"])
        return real_write(path, rows, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_plots, "plot_steps", plot_steps)
        mp.setattr(page, "write", write)
        written = visualize.visualize(
            workdir, TEXTS, out, steps=True, head=1, query=QUERY, window=WINDOW, pad_to=PAD_TO
        )
    return {"workdir": workdir, "out": out, "written": written, "figures": figures, "pages": pages}


def _view_ids(trained: serving.Trained, text: str) -> np.ndarray:
    """The ids the steps are drawn on: the first WINDOW tokens, padded to PAD_TO."""
    ids_L = serving.encode(trained, text)[:WINDOW]
    return np.concatenate([ids_L, np.zeros(max(PAD_TO - len(ids_L), 0), ids_L.dtype)])


def test_steps_files_are_written_with_their_names(drawn):
    out, workdir = drawn["out"], drawn["workdir"]
    names = [
        "text1_layer0_head0.png",
        "text1_layer0_head1.png",
        "text1_steps_layer0_head1.png",
        "text2_layer0_head0.png",
        "text2_layer0_head1.png",
        "text2_steps_layer0_head1.png",
        "attention.html",
    ]
    assert drawn["written"] == [os.path.join(out, n) for n in names] + [
        os.path.join(workdir, "curves.png")
    ]
    assert sorted(os.listdir(out)) == sorted(names)
    for name in names[:-1]:
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in os.listdir(workdir) if ".tmp" in f]  # nothing left half-made
    html = open(os.path.join(out, "attention.html"), encoding="utf-8").read()
    assert "Legend" in html and "masked" in html and "<rt>" in html  # numbers shown, not hovered


def test_the_page_carries_the_glyphs_of_its_chinese_text_in_the_pngs_font(drawn):
    from fontTools.ttLib import TTFont

    html = open(os.path.join(drawn["out"], "attention.html"), encoding="utf-8").read()
    face = re.search(
        r"@font-face\{font-family:'([^']+)';src:url\(data:font/otf;base64,([^)]+)\)", html
    )
    assert face and face[1] == page.CJK_FAMILY
    assert f"body{{font-family:'{face[1]}',sans-serif;" in html
    font = TTFont(io.BytesIO(base64.b64decode(face[2])))
    assert font["name"].getDebugName(1).startswith("Noto Sans CJK SC")  # the PNGs' font
    cmap = font.getBestCmap()
    assert all(ord(c) in cmap for text in TEXTS for c in text)  # 很好看, 质量太差了，不推荐
    assert len(face[2]) < 200_000  # the page's glyphs, not the font's 16 MB
    assert page.font_face("an English page: sans-serif has its glyphs") == ""


def test_drawn_steps_recombine_and_are_the_model_attention(drawn, trained):
    loaded = serving.load(trained)
    cfg = loaded.cfg
    d_head = cfg.d_model // cfg.num_heads
    cols = slice(d_head, 2 * d_head)  # head 1
    mha = loaded.params["layer_0"]["mha"]
    assert len(drawn["figures"]) == len(TEXTS)
    for text, (h, kwargs) in zip(TEXTS, drawn["figures"], strict=True):
        ids_L = _view_ids(loaded, text)
        assert kwargs["query"] == QUERY and kwargs["score"] == scores.get_score("scaled_dot")
        assert kwargs["qk_titles"] == models.PROJECTED_QK == ("Q = X Wq", "K = X Wk")
        assert h.tokens == loaded.tokenizer.tokens(ids_L.tolist())
        np.testing.assert_array_equal(h.allowed_L, ids_L != classifier.PAD)
        # Q, K, V are X through the head's columns of the projections.
        for name, m_LxK in (("q", h.q_LxK), ("k", h.k_LxK), ("v", h.v_LxK)):
            w, b = np.asarray(mha[name]["w"]), np.asarray(mha[name]["b"])
            np.testing.assert_allclose(m_LxK, h.x_LxD @ w[:, cols] + b[cols], atol=1e-5)
        # Scores, scaling, softmax over the allowed keys and the weighted sum, from Q, K, V.
        np.testing.assert_allclose(h.raw_LxL, h.q_LxK @ h.k_LxK.T, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            h.scaled_LxL, h.raw_LxL / math.sqrt(d_head), rtol=1e-5, atol=1e-6
        )
        e_LxL = np.where(h.allowed_L, np.exp(h.scaled_LxL - h.scaled_LxL.max(1, keepdims=True)), 0)
        np.testing.assert_allclose(h.weights_LxL, e_LxL / e_LxL.sum(1, keepdims=True), atol=1e-6)
        assert (h.weights_LxL[:, ~h.allowed_L] == 0).all()
        np.testing.assert_allclose(h.out_LxK, h.weights_LxL @ h.v_LxK, atol=1e-5)
        # The library's attention on the drawn Q, K, V gives the drawn weights and outputs ...
        out_LxK, w_LxL = attn.attention(h.q_LxK, h.k_LxK, h.v_LxK, h.allowed_L)
        np.testing.assert_allclose(h.weights_LxL, w_LxL, atol=1e-6)
        np.testing.assert_allclose(h.out_LxK, out_LxK, atol=1e-6)
        # ... and the model's forward pass on the same ids has the same attention map.
        model_w_LxL = maps.analyse(loaded.params, cfg, ids_L, None)["attention"][0][1]
        np.testing.assert_allclose(h.weights_LxL, model_w_LxL, atol=1e-6)
    assert drawn["figures"][0][0].tokens[-2:] == ["<pad>", "<pad>"]
    assert len(drawn["figures"][1][0].tokens) == WINDOW
    # The page shows the first text's steps, the very arrays of its figure, as numbers.
    (shown,) = drawn["pages"]
    assert shown is drawn["figures"][0][0]
    html = open(os.path.join(drawn["out"], "attention.html"), encoding="utf-8").read()
    for v in np.concatenate([shown.weights_LxL[QUERY][shown.allowed_L], shown.out_LxK[QUERY]]):
        assert f">{v:.2f}</td>" in html
    assert html.count("<td class='masked'>masked</td>") == 2 * len(shown.tokens) + 2


def test_earlier_output_is_replaced_and_a_failed_call_changes_nothing(
    trained_copy, capsys, monkeypatch
):
    out = os.path.join(trained_copy, "visualize")
    argv = ("experiments.visualize", f"--workdir={trained_copy}")
    assert run_here(*argv, "--steps", *TEXTS, capsys=capsys).returncode == 0
    assert len(os.listdir(out)) == 7
    proc = run_here(*argv, "很好", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == [
        "attention.html",
        "text1_layer0_head0.png",
        "text1_layer0_head1.png",
    ]
    before = tree_hash(trained_copy)
    assert_one_line_error(run_here(*argv, "--steps", "很好", " ", capsys=capsys), "text 2")
    assert tree_hash(trained_copy) == before

    # Failing halfway (here a full disk while writing the page) leaves no trace either.
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(page, "write", full_disk)
        assert_one_line_error(run_here(*argv, "--steps", "很好", capsys=capsys), "No space")
    assert tree_hash(trained_copy) == before
    # An --out that holds other files is never replaced.
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("mine")
    before = tree_hash(trained_copy)
    assert_one_line_error(run_here(*argv, "很好", capsys=capsys), "notes.txt")
    assert tree_hash(trained_copy) == before


def test_a_layer_the_model_cannot_draw_is_one_line_and_writes_nothing(
    trained_copy, capsys, monkeypatch
):
    """A model's attention_steps refuses a layer it cannot draw honestly (a ValueError naming
    why); visualize says so in one line, with the layer, and leaves no trace."""

    def refuse(*args, **kwargs):
        raise ValueError("layer 0 masks a sliding window, which the figure does not draw")

    monkeypatch.setattr(maps, "attention_steps", refuse)
    before = tree_hash(trained_copy)
    proc = run_here("experiments.visualize", f"--workdir={trained_copy}", "很好", capsys=capsys)
    assert_one_line_error(proc, "--layer=0: layer 0 masks a sliding window")
    assert tree_hash(trained_copy) == before


def test_steps_figure_and_page_title_q_and_k_as_the_model_computes_them(tmp_path, monkeypatch):
    """A model whose Q and K are not X's projections alone (rotated by position) names them in
    both the figure and the page."""
    params = multihead.init(jax.random.key(0), 8, 2)
    st = multihead.steps(params, jax.random.normal(jax.random.key(1), (4, 8)), num_heads=2)
    h = step_plots.head_view(st, 0, list("abcd"), np.ones(4, bool))
    titles = ("Q = rotary(X Wq)", "K = rotary(X Wk)")
    texts = []
    real_savefig = Figure.savefig

    def savefig(fig, *args, **kwargs):
        texts.extend(t.get_text() for t in fig.findobj(Text))
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    path = str(tmp_path / "steps.png")
    step_plots.plot_steps(
        h, score="scaled_dot", query=0, title="t", x_title="X", path=path, qk_titles=titles
    )
    assert set(titles) <= set(texts) and "Q = X Wq" not in texts
    html_path = page.write(
        str(tmp_path / "page.html"),
        [],
        shade_meaning="m",
        steps=h,
        steps_heading="h",
        score="scaled_dot",
        query=0,
        x_title="X",
        qk_titles=titles,
    )
    html = open(html_path, encoding="utf-8").read()
    assert all(f"<b>{t}</b>" in html for t in titles) and "Q = X Wq" not in html


@pytest.mark.parametrize(
    "flag, fragment",
    [
        ("--layer=1", "--layer=1 is out of range"),
        ("--head=2", "--head=2 is out of range"),
        ("--head=-1", "--head=-1 is out of range"),
        ("--window=0", "--window=0 is out of range"),
        ("--max_tokens=0", "--max_tokens=0 is out of range"),
        ("--pad_to=65", "--pad_to=65 is out of range"),
        ("--query=3", "text 1: --query=3"),
    ],
)
def test_bad_choice_is_one_line_and_writes_nothing(flag, fragment, trained_copy, capsys):
    before = tree_hash(trained_copy)
    proc = run_here(
        "experiments.visualize",
        f"--workdir={trained_copy}",
        "--steps",
        flag,
        "很好看",
        capsys=capsys,
    )
    assert_one_line_error(proc, fragment)
    assert tree_hash(trained_copy) == before


def test_help_names_the_files_it_writes():
    proc = run("experiments.visualize", "--help")  # absl prints the module docstring
    assert "Traceback" not in proc.stderr, proc.stderr
    for name in ("text<n>_layer<l>_head<h>.png", "text<n>_steps_layer<l>_head<h>.png"):
        assert name in proc.stdout
    for name in ("attention.html", "curves.png", "--steps", "--query", "--window"):
        assert name in proc.stdout


@pytest.mark.parametrize("score", sorted(scores.SCORES))
def test_steps_figure_names_the_score_shapes_and_masked_keys(score, tmp_path, monkeypatch):
    params = multihead.init(jax.random.key(0), 8, 2, score=score)
    x_LxD = jax.random.normal(jax.random.key(1), (5, 8))
    allowed_L = np.array([True, True, True, False, False])
    st = multihead.steps(params, x_LxD, allowed_L, num_heads=2, score=score)
    h = step_plots.head_view(st, 1, list("abcde"), allowed_L)
    texts = []
    real_savefig = Figure.savefig

    def savefig(fig, *args, **kwargs):
        texts.extend(t.get_text() for t in fig.findobj(Text))
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    path = str(tmp_path / "steps.png")
    step_plots.plot_steps(h, score=score, query=1, title="t", x_title="X", path=path)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    raw_title, scaled_title = step_plots.score_titles(score, 4)
    assert raw_title in texts and scaled_title in texts
    assert step_plots.SCORE_FORMULAS[score] in raw_title and score in raw_title
    assert ("√4" in scaled_title) == (score == "scaled_dot")
    for shape in (
        "5 × 8  (tokens × d_model)",
        "5 × 4  (tokens × d_head)",
        "5 × 5  (queries × keys)",
    ):
        assert shape in texts
    assert texts.count("masked") == 4  # two masked keys in each of the two bar charts
    assert "masked key (padding): weight exactly 0" in texts


def test_a_score_with_an_unscaled_form_is_titled_by_it_and_its_divisor(tmp_path, monkeypatch):
    """A score that says it is another divided by a constant: the raw panel names that other
    score's formula, the scaled one the divisor, and neither says it is unscaled."""
    dot = scores.get_score("dot")
    halved = scores.Score(
        "halved", lambda p, q, k: scores.dot(p, q, k) / 2, dot.init, False, unscaled=dot,
        divisor="√4",
    )  # fmt: skip
    params = multihead.init(jax.random.key(0), 8, 2, score=halved)
    x_LxD = jax.random.normal(jax.random.key(1), (5, 8))
    st = multihead.steps(params, x_LxD, None, num_heads=2, score=halved)
    h = step_plots.head_view(st, 0, list("abcde"), np.ones(5, bool))
    texts = []
    real_savefig = Figure.savefig

    def savefig(fig, *args, **kwargs):
        texts.extend(t.get_text() for t in fig.findobj(Text))
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    path = str(tmp_path / "s.png")
    step_plots.plot_steps(h, score=st.score, query=0, title="t", x_title="X", path=path)
    raw_title, scaled_title = step_plots.score_titles(halved, 4)
    assert raw_title == "scores S = Q Kᵀ  [halved]"
    assert scaled_title == "scaled S / √4  (softmax input)"
    assert raw_title in texts and scaled_title in texts
    assert not any("not scaled" in t for t in texts)


def test_a_wide_encoders_x_panel_does_not_stretch_the_steps_figure(tmp_path, monkeypatch):
    """X of a 768-wide encoder with 64-wide heads (BERT-base) is squeezed, not drawn 69 inches
    wide beside three 6-inch head panels: its figure is at most 5 inches wider than a 96-wide
    model's with 8-wide heads, which is drawn as before (X 8.6 inches, each head 1.5)."""
    widths = {}
    real_savefig = Figure.savefig

    def savefig(fig, *args, **kwargs):
        widths[d_model] = fig.get_size_inches()[0]
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    for d_model in (96, 768):
        params = multihead.init(jax.random.key(0), d_model, 12, score="scaled_dot")
        x_LxD = jax.random.normal(jax.random.key(1), (6, d_model))
        st = multihead.steps(params, x_LxD, None, num_heads=12, score="scaled_dot")
        h = step_plots.head_view(st, 0, list("abcdef"), np.ones(6, bool))
        path = str(tmp_path / f"steps{d_model}.png")
        step_plots.plot_steps(h, score="scaled_dot", query=0, title="t", x_title="X", path=path)
    assert widths[96] == pytest.approx(96 * 0.09 + 3 * 1.5 + 4 * 1.6)
    assert widths[768] <= widths[96] + 5


@pytest.mark.parametrize(
    "tokens",
    [
        list("这本书很好看，但是物流太慢了，包装也破了") * 3 + ["<pad>"] * 4,  # 64 tokens
        "this movie was not good at all , the acting felt wooden".split() * 5 + ["<unk>"],
    ],
    ids=["cjk-64", "words-61"],
)
def test_heatmap_tick_labels_do_not_overlap(tokens, tmp_path, monkeypatch):
    extents, rotations = {}, []
    real_savefig = Figure.savefig

    def savefig(fig, *args, **kwargs):
        real_savefig(fig, *args, **kwargs)  # draws, so the labels have their final places
        (ax, _colorbar) = fig.axes
        for axis in ("x", "y"):
            labels = getattr(ax, f"get_{axis}ticklabels")()
            assert all(label.get_fontsize() >= 8 for label in labels)
            extents[axis] = [label.get_window_extent() for label in labels]
        rotations.extend(label.get_rotation() for label in ax.get_xticklabels())

    monkeypatch.setattr(Figure, "savefig", savefig)
    n = len(tokens)
    plots.plot_heatmap(np.full((n, n), 1.0 / n), tokens, "t", str(tmp_path / "map.png"))
    for axis, boxes in extents.items():
        assert len(boxes) == n
        for a, b in itertools.pairwise(boxes):
            assert not a.overlaps(b), f"{axis} labels overlap"
    # Single characters (CJK, punctuation) stay upright; longer tokens turn vertical.
    assert rotations == [0.0 if len(t) == 1 else 90.0 for t in tokens]


def test_steps_figure_labels_do_not_overlap_at_the_default_window(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    n = 32  # --window's default
    tokens = list("这本书很好看，但是物流太慢了，包装也破了，客服态度还可以，总体来说")[:n]
    assert len(tokens) == n
    params = multihead.init(jax.random.key(0), 64, 4)
    st = multihead.steps(params, jax.random.normal(jax.random.key(1), (n, 64)), num_heads=4)
    h = step_plots.head_view(st, 0, tokens, np.ones(n, bool))
    checked = []
    real_savefig = Figure.savefig

    def savefig(fig, *args, **kwargs):
        real_savefig(fig, *args, **kwargs)
        for ax in fig.findobj(Axes):
            for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
                if [label.get_text() for label in labels] != tokens:
                    continue  # feature indices or a colorbar
                boxes = [label.get_window_extent() for label in labels]
                assert not any(a.overlaps(b) for a, b in itertools.pairwise(boxes))
                checked.append(ax)

    monkeypatch.setattr(Figure, "savefig", savefig)
    step_plots.plot_steps(
        h, score="scaled_dot", query=0, title="t", x_title="X", path=str(tmp_path / "s.png")
    )
    # Rows of all 8 matrices, key columns of the 3 score panels and of the 2 bar charts.
    assert len(checked) == 8 + 3 + 2


def test_curves_mark_the_checkpoint_training_kept(trained, tmp_path):
    step, accuracy = plots.best_validation(metrics.read(trained))
    assert step == serving.load(trained).step
    assert accuracy == max(
        r["accuracy"] for r in metrics.read(trained) if r["split"] == "validation"
    )
    path = plots.plot_curves(trained, str(tmp_path / "curves.png"))
    assert os.path.getsize(path) > 0


def test_the_kept_model_rule_takes_the_highest_finite_row_and_breaks_ties_on_loss():
    # train.py keeps its best checkpoint by the same rule (metrics.improves).
    rows = [
        {"split": "train", "step": 5, "accuracy": 1.0, "loss": 0.1},
        {"split": "validation", "step": 10, "accuracy": 0.7, "loss": 0.5},
        {"split": "validation", "step": 20, "accuracy": 0.9, "loss": float("nan")},
        {"split": "validation", "step": 30, "accuracy": 0.8, "loss": 0.4},
        {"split": "validation", "step": 40, "accuracy": 0.8, "loss": 0.3},
        {"split": "validation", "step": 50, "accuracy": 0.8, "loss": 0.35},
        {"split": "validation", "step": 60, "accuracy": 0.75, "loss": 0.1},
    ]
    assert plots.best_validation(rows) == (40, 0.8)
    assert plots.best_validation(rows[:1]) is None
