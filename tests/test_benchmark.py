"""Benchmark harness in --quick mode: JSON keys, sane values, report and plots; the Flax twin."""

import json
import os

import jax
import jax.numpy as jnp
import pytest

from attn import classifier
from experiments import benchmark, flax_reference
from experiments.errors import UserError


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bench"))
    results = {
        name: fn(True)
        for name, fn in (
            ("attention", benchmark.bench_attention),
            ("train", benchmark.bench_train),
            ("accuracy", benchmark.bench_accuracy),
        )
    }
    benchmark.write_outputs(results, out)
    return out, results


def test_attention_rows(quick):
    _, results = quick
    att = results["attention"]
    assert att["matmul_gflops"] > 0
    rows = att["rows"]
    assert {r["method"] for r in rows} == set(benchmark.METHODS)
    assert {r["mode"] for r in rows} == {"fwd", "fwd_bwd"}
    assert {r["L"] for r in rows} == {32, 64}
    for r in rows:
        assert r["temp_bytes"] >= 0 and r["peak_rss_bytes"] > 0
        assert r["time_s"] > 0 and r["gflops"] > 0 and 0 < r["fraction_of_matmul"]
        assert r["memory_ratio_vs_matrix"] >= 0 and r["time_ratio_vs_jax_nn"] > 0
        if r["method"] == "matrix":
            assert r["memory_ratio_vs_matrix"] == 1.0
        if r["method"] == "jax.nn":
            assert r["time_ratio_vs_jax_nn"] == 1.0
    targets = att["targets"]
    assert set(targets) == {"matrix_speed", "chunked_memory", "chunked_long"}
    assert all(isinstance(t["met"], bool) for t in targets.values())
    assert [x["L"] for x in targets["matrix_speed"]["ratios"]] == [32, 64]
    # At L=64 the naive form fits easily, so "runs where the naive form does not" is false.
    assert targets["chunked_long"]["met"] is False


def test_train_rows(quick):
    _, results = quick
    tr = results["train"]
    assert tr["param_count"]["ours"] == tr["param_count"]["flax"] > 0
    for row in tr["rows"]:
        for name in ("ours", "flax"):
            assert row[name]["step_s"] > 0 and row[name]["examples_per_s"] > 0
            assert row[name]["tokens_per_s"] == pytest.approx(
                row[name]["examples_per_s"] * row["L"]
            )
        assert row["ratio"] > 0
    p = tr["pipeline"]
    assert p["steps"] == 3 and 0 <= p["wait_fraction"] <= 1 and p["examples_per_s"] > 0
    assert isinstance(tr["targets"]["train_speed"]["met"], bool)


def test_accuracy_rows(quick):
    _, results = quick
    acc = results["accuracy"]
    for name in ("default", "structured", "mean"):
        assert 0 <= acc[name]["test_accuracy"] <= 1 and acc[name]["wall_s"] > 0
    assert acc["structured"]["model"]["pooling"] == "structured"
    assert acc["mean"]["model"]["pooling"] == "mean"
    bases = [acc["tfidf_logreg"], acc["tfidf_sublinear_logreg"]]
    assert [b["sublinear_tf"] for b in bases] == [False, True]
    for base in bases:
        # Even on 2,000 training texts character n-grams separate the classes well above chance.
        assert base["test_accuracy"] > 0.7
        assert str(base["best_C"]) in base["validation_accuracy"]
    t = acc["targets"]["beats_baseline"]
    assert t["baseline"] == max(b["test_accuracy"] for b in bases) and isinstance(t["met"], bool)


def test_outputs_written(quick):
    out, results = quick
    with open(os.path.join(out, "results.json")) as f:
        assert json.load(f) == json.loads(json.dumps(results))
    report = open(os.path.join(out, "REPORT.md")).read()
    for section in ("## 1. Attention", "## 2. Train step", "## 3. Accuracy"):
        assert section in report
    assert report.count("**met**") + report.count("**missed**") >= 6
    for png in ("attention_time.png", "attention_memory.png"):
        with open(os.path.join(out, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report


def test_time_interleaved_alternates():
    calls = []
    times = benchmark.time_interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3
    )
    assert calls == ["a", "b"] * 3
    assert len(times["a"]) == len(times["b"]) == 3


def test_unknown_section_is_user_error():
    with pytest.raises(UserError, match="attention, train, accuracy, all.*speed"):
        benchmark.main(["benchmark", "speed"])


@pytest.mark.parametrize(
    "kw",
    [
        dict(pooling="mean", ngram_buckets=11),
        dict(pooling="structured", positions="sinusoidal", num_layers=2),
        dict(pooling="cls", positions="none", num_classes=3),
        dict(pooling="max"),
    ],
)
def test_flax_twin_has_our_param_count(kw):
    cfg = classifier.ModelConfig(vocab_size=20, d_model=8, num_heads=2, d_ff=12, max_len=16, **kw)
    ours = jax.eval_shape(lambda k: classifier.init(k, cfg), jax.random.key(0))
    tokens = jnp.ones((2, 16), jnp.int32)
    theirs = jax.eval_shape(
        lambda k: flax_reference.Classifier(cfg).init(k, tokens), jax.random.key(0)
    )
    assert benchmark._count(ours) == benchmark._count(theirs["params"])


def test_flax_twin_ignores_padding():
    cfg = classifier.ModelConfig(vocab_size=20, d_model=8, num_heads=2, d_ff=12, max_len=16)
    model = flax_reference.Classifier(cfg)
    tokens = jnp.array([[5, 6, 7, 0, 0, 0]])
    variables = model.init(jax.random.key(0), tokens)
    short, _ = model.apply(variables, tokens[:, :3])
    padded, _ = model.apply(variables, tokens)
    assert jnp.allclose(short, padded, atol=1e-5)
