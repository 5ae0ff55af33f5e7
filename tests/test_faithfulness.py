"""experiments.faithfulness on tiny trained workdirs (the default's, and one with a bag reading
longer cuts and no attention layer), its statistics against scipy, and the erasure test that
`predict --explain` and `visualize`'s page show for each text."""

import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from conftest import (
    assert_close32,
    assert_one_line_error,
    classifier_terms,
    run_here,
    tiny_config,
    tol32,
    tree_hash,
)

from attn import importance
from experiments import serving, train, visualize
from experiments.data import encoding, tokenizers
from experiments.explain import faithfulness, maps, ranking

LIMIT = 48


@pytest.fixture(scope="module")
def measured(trained, tmp_path_factory) -> dict:
    """One `faithfulness --limit=LIMIT` on a copy of the tiny trained workdir."""
    import shutil

    workdir = str(tmp_path_factory.mktemp("faith") / "run")
    shutil.copytree(trained, workdir)
    before = tree_hash(workdir)
    result = faithfulness.faithfulness(workdir, "test", LIMIT)
    return {"workdir": workdir, "before": before, "result": result}


@pytest.fixture(scope="module")
def bagged(tfds_dir, tmp_path_factory) -> str:
    """A tiny workdir whose model has no encoder layer, CLS pooling and a bag reading up to 128
    tokens of texts attention cuts to 64 (the last 8 kept)."""
    workdir = str(tmp_path_factory.mktemp("bagged") / "run")
    config = tiny_config(
        tfds_dir,
        model__num_layers=0,
        model__pooling="cls",
        model__bag_buckets=512,
        data__bag_len=128,
        data__tail_len=8,
    )
    train.train_and_evaluate(config, workdir)
    return workdir


def test_the_command_writes_its_files_and_only_them(measured):
    workdir, result = measured["workdir"], measured["result"]
    after = tree_hash(workdir)
    assert {k: v for k, v in after.items() if k in measured["before"]} == measured["before"]
    assert sorted(set(after) - set(measured["before"])) == [faithfulness.FILE, faithfulness.PLOT]
    with open(os.path.join(workdir, faithfulness.PLOT), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(os.path.join(workdir, faithfulness.FILE), encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(result))
    assert result["num_texts"] == LIMIT and result["percents"] == [1, 2, 5, 10, 20]
    assert sorted(result["methods"]) == sorted(faithfulness.METHODS)
    assert result["unavailable"] == {} and result["logit_halves"] is None  # no bag


def test_leave_one_out_is_the_best_single_token_erasure(measured):
    # At 1% every text here loses one token, and leave-one-out picks the one whose loss drops
    # the probability most: no ranking can beat it there, text by text and so on average.
    methods = measured["result"]["methods"]
    best = methods["leave_one_out"]["comprehensiveness"][0]["mean"]
    for m, r in methods.items():
        assert r["comprehensiveness"][0]["mean"] <= best + 1e-6, m
        for name in ("comprehensiveness", "sufficiency"):
            for point in r[name]:
                assert point["low"] <= point["mean"] <= point["high"]
        if m != "leave_one_out":
            rho = r["spearman_with_leave_one_out"]
            assert -1 <= rho["mean"] <= 1 and 0 < rho["num_texts"] <= LIMIT
    assert "spearman_with_leave_one_out" not in methods["leave_one_out"]
    pairs = measured["result"]["aopc_comprehensiveness_differences"]
    d = pairs["attention - random"]
    aopc = {m: methods[m]["aopc_comprehensiveness"]["mean"] for m in ("attention", "random")}
    assert d["mean"] == pytest.approx(aopc["attention"] - aopc["random"], abs=1e-6)


def test_per_text_scores_are_the_library_functions(trained):
    loaded = serving.load(trained)
    cfg = loaded.cfg
    ids = encoding.load(loaded.config.data, ("test",), add_cls=False, tokenizer=loaded.tokenizer)
    ids = ids.splits["test"].ids[:3]
    per_text = faithfulness.explain_all(
        loaded.params,
        cfg,
        loaded.config.data,
        ids,
        None,
        None,
        faithfulness.METHODS,
        serving.framing_ids(loaded),
    )
    for ids_L, t in zip(ids, per_text, strict=True):
        tokens = jnp.asarray(ids_L[None])
        loo = jax.jit(importance.leave_one_out, static_argnames="cfg")(
            loaded.params, tokens, cfg=cfg
        )[0]
        assert_close32(t["scores"]["leave_one_out"], loo, classifier_terms(cfg, len(ids_L)))
        received = maps.analyse(loaded.params, cfg, ids_L, None)["received"]
        # the shading
        assert_close32(t["scores"]["attention"], received, classifier_terms(cfg, len(ids_L)))
        comp, suff = jax.jit(importance.erasure_drops, static_argnames=("cfg", "percents"))(
            loaded.params,
            tokens,
            jnp.asarray(t["scores"]["gradient"][None]),
            tokens != 0,
            cfg=cfg,
            percents=faithfulness.PERCENTS,
        )
        assert_close32(
            t["drops"]["gradient"], np.stack([comp[0], suff[0]]), classifier_terms(cfg, len(ids_L))
        )


def test_a_model_without_attention_gets_the_other_methods(bagged, capsys):
    proc = run_here("experiments.faithfulness", f"--workdir={bagged}", "--limit=20", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(bagged, faithfulness.FILE), encoding="utf-8") as f:
        result = json.load(f)
    assert sorted(result["methods"]) == ["gradient", "leave_one_out", "random"]
    assert set(result["unavailable"]) == {"attention", "rollout"}
    assert "| attention | the model has no attention layer (num_layers=0) |" in proc.stdout
    assert "leave-one-out" in proc.stdout and "written:" in proc.stdout
    # Two classes: the halves' margins add up to the model's, so in every text one agrees.
    halves = result["logit_halves"]
    assert halves["encoder"]["agrees"] + halves["bag"]["agrees"] >= 1
    assert "the bag alone for" in proc.stdout


def test_the_bag_loses_exactly_the_erased_tokens(bagged):
    loaded = serving.load(bagged)
    long_text = "这家酒店" * 30 + "服务很差，不推荐"  # cut for attention, read longer by the bag
    ids_L = serving.encode(loaded, long_text)
    bag_G = serving.encode_bag(loaded, long_text)
    source_G = ranking.bag_source(loaded, long_text)
    assert len(ids_L) == 64 and len(bag_G) == 128 and ids_L[0] == tokenizers.CLS
    inside = source_G >= 0
    assert (bag_G[inside] == ids_L[source_G[inside]]).all()  # the same tokens of the text
    assert sorted(source_G[inside]) == list(range(64))  # each attention position once
    assert source_G[-8:].tolist() == list(range(56, 64))  # the kept tail lines up at the end
    assert (~inside).sum() == 64


def _fake_trained(max_len: int, tail_len: int, bag_len: int, cls: bool):
    tok = tokenizers.build_tokenizer(
        "char", ["abcdefghij"], lowercase=True, min_freq=1, max_vocab=0
    )
    data = types.SimpleNamespace(max_len=max_len, tail_len=tail_len, bag_len=bag_len, convert="")
    return types.SimpleNamespace(
        tokenizer=tok,
        config=types.SimpleNamespace(data=data),
        cfg=types.SimpleNamespace(max_len=max_len, pooling="cls" if cls else "mean"),
    )


@pytest.mark.parametrize("cls", [False, True])
@pytest.mark.parametrize("text", ["abc", "abcdefghij" * 3, "abcdefghij" * 9])
def test_bag_source_lines_up_with_both_cuts(text, cls):
    t = _fake_trained(max_len=12, tail_len=4, bag_len=48, cls=cls)
    ids_L, bag_G = serving.encode(t, text), serving.encode_bag(t, text)
    source_G = ranking.bag_source(t, text)
    assert len(source_G) == len(bag_G)
    inside = source_G >= 0
    assert (bag_G[inside] == ids_L[source_G[inside]]).all()
    assert sorted(source_G[inside]) == list(range(len(ids_L)))
    assert (~inside).sum() == len(bag_G) - len(ids_L)
    assert ranking.bag_source(_fake_trained(12, 4, 0, cls), text) is None


def test_a_limit_is_a_fixed_random_sample():
    chosen = faithfulness.sample(1000, 50)
    assert len(set(chosen)) == 50 and (np.diff(chosen) > 0).all()
    assert chosen.max() > 500  # not the first 50: a split may be ordered by label
    assert (faithfulness.sample(1000, 50) == chosen).all()
    assert (faithfulness.sample(30, 50) == np.arange(30)).all()
    assert (faithfulness.sample(30, None) == np.arange(30)).all()


def test_correlations_match_scipy():
    rng = np.random.default_rng(0)
    for n in (2, 3, 7, 40):
        a = rng.integers(0, 4, n).astype(float)  # ties
        b = a + rng.normal(0, 2, n)
        if len(set(a)) > 1:
            assert faithfulness.spearman(a, b) == pytest.approx(scipy.stats.spearmanr(a, b)[0])
            assert faithfulness.kendall(a, b) == pytest.approx(scipy.stats.kendalltau(a, b)[0])
    assert np.isnan(faithfulness.spearman(np.ones(4), np.arange(4.0)))
    assert np.isnan(faithfulness.kendall(np.arange(4.0), np.ones(4)))


def test_bad_flags_are_one_line_errors(trained_copy, tmp_path, capsys):
    before = tree_hash(trained_copy)
    cases = [
        (["--limit=0"], "--limit must be at least 1"),
        ([], "--workdir=DIR is required"),
        (["extra"], "unexpected arguments"),
    ]
    for args, fragment in cases:
        workdir = [] if not args else [f"--workdir={trained_copy}"]
        proc = run_here("experiments.faithfulness", *workdir, *args, capsys=capsys)
        assert_one_line_error(proc, fragment)
    missing = run_here("experiments.faithfulness", f"--workdir={tmp_path / 'none'}", capsys=capsys)
    assert_one_line_error(missing, "does not exist")
    assert tree_hash(trained_copy) == before


def test_predict_explain_adds_the_erasure_test(trained, capsys):
    args = ("experiments.predict", f"--workdir={trained}", "--top=3", "--explain")
    proc = run_here(*args, "质量很好，很满意", " ", capsys=capsys)
    assert proc.returncode == 2  # the blank text fails, the other is answered
    header, good, bad = proc.stdout.strip("\n").split("\n")
    assert header.split("\t")[3:] == ranking.HEADER.split("\t")[1:]
    label, prob, attended, loo, without_attended, without_loo = good.split("\t")
    assert len(loo.split(" ")) == 3 and 0 <= float(without_attended) <= 1
    assert 0 <= float(without_loo) <= 1
    assert bad.split("\t")[3:] == ["-", "-", "-"]
    proc = run_here(*args, "--json", "质量很好，很满意", capsys=capsys)
    p = json.loads(proc.stdout)
    e = p["explain"]
    assert [t for t, _ in e["attention"]] == [t for t, _ in p["top_tokens"]]  # the same ranking
    # By hand: erase the 3 most-attended tokens, run the model again.
    loaded = serving.load(trained)
    ids_L = serving.encode(loaded, "质量很好，很满意")
    close = tol32(classifier_terms(loaded.cfg, len(ids_L)))  # a probability, by two programs
    assert e["probability"] == pytest.approx(p["probability"], abs=close)
    received = maps.analyse(loaded.params, loaded.cfg, ids_L, None)["received"]
    erased = ids_L.copy()
    erased[np.argsort(-received, kind="stable")[: e["removed"]]] = tokenizers.PAD
    probs = maps.analyse(loaded.params, loaded.cfg, erased, None)["probs"]
    label_id = loaded.label_names.index(p["label"])
    assert e["removed"] == 3
    assert e["without_attended"] == pytest.approx(float(probs[label_id]), abs=close)


def test_predict_explain_on_a_model_without_attention(bagged, capsys):
    proc = run_here(
        "experiments.predict", f"--workdir={bagged}", "--explain", "--json", "很好", capsys=capsys
    )
    e = json.loads(proc.stdout)["explain"]
    assert e["attention"] is None and e["without_attended"] is None
    assert e["removed"] == 2 and len(e["leave_one_out"]) == 2  # CLS is never ranked or erased


def test_the_page_shows_both_rankings_side_by_side(trained_copy):
    out = os.path.join(trained_copy, "vis")
    visualize.visualize(trained_copy, ["质量很好，很满意"], out)
    page = open(os.path.join(out, "attention.html"), encoding="utf-8").read()
    e = ranking.explain(serving.load(trained_copy), "质量很好，很满意")
    assert "<th>attention (weight)</th><th>leave-one-out (drop)</th>" in page
    assert f"<b>{e['without_attended']:.3f}</b>" in page
    assert f"<b>{e['without_leave_one_out']:.3f}</b>" in page
    for token, drop in e["leave_one_out"]:
        assert f"{token} ({drop:+.3f})" in page
