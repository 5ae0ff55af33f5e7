"""The benchmark package: the committed report follows from the committed results, the attention
section in --quick mode, the TF-IDF baseline, the Flax twin, and the command line. The train and
accuracy sections train models, so only `python -m benchmarks` runs them."""

import json
import shutil

import jax
import jax.numpy as jnp
import pytest
from conftest import ROOT, classifier_terms, make_aclimdb, tiny_config, tol32

from attn import classifier
from benchmarks import __main__ as bench_main
from benchmarks import accuracy, attention, docs, finetune, flax_twin, report, timing, train_step
from benchmarks import bert as bert_section
from experiments import cli

COMMITTED = ROOT / "benchmarks"


def test_committed_report_is_what_the_writer_makes_of_the_committed_results(tmp_path):
    shutil.copy(COMMITTED / "analysis.md", tmp_path)
    results = json.loads((COMMITTED / "results.json").read_text(encoding="utf-8"))
    report.write(results, str(tmp_path))
    written = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert written == (COMMITTED / "REPORT.md").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "results.json").read_text(encoding="utf-8")) == results
    for section in ("## 1. Attention", "## 2. Train step", "## 3. Accuracy", "## 6. Several"):
        assert section in written
    assert written.count("**met**") + written.count("**missed**") >= 6
    for png in ("attention_time.png", "attention_memory.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in written


@pytest.fixture(scope="module")
def quick_attention():
    return attention.run(quick=True)


def test_attention_rows(quick_attention):
    att = quick_attention
    assert att["matmul_gflops"] > 0
    rows = att["rows"]
    assert {r["method"] for r in rows} == set(attention.METHODS)
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
    assert set(targets) == {"matrix_speed", "chunked_memory", "chunked_long", "chunked_linear"}
    assert [(r["L"], r["mask"]) for r in att["scaling"]] == [
        (n, m) for n in (64, 128, 256) for m in ("none", "causal")
    ]
    assert all(r["temp_bytes"] > 0 for r in att["scaling"])
    assert all(isinstance(t["met"], bool) for t in targets.values())
    assert [x["L"] for x in targets["matrix_speed"]["ratios"]] == [32, 64]
    # At L=64 the naive form fits easily, so "runs where the naive form does not" is false.
    assert targets["chunked_long"]["met"] is False


def test_report_of_a_quick_attention_run(quick_attention, tmp_path):
    report.write({"attention": {**quick_attention, "wall_s": 1.0, "quick": True}}, str(tmp_path))
    written = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert "## 1. Attention" in written and "## 2. Train step" not in written
    assert "; --quick._" in written
    assert all(f"| 32 | 8 | fwd | {m} |" in written for m in attention.METHODS)
    assert "| 256 |" in written and "chunked fwd+bwd temp memory linear in L" in written


def test_tfidf_baseline_separates_the_classes(tfds_dir):
    base = accuracy.tfidf_baseline(
        tiny_config(tfds_dir).data, grid=(1.0, 10.0), sublinear=True, max_train=1000
    )
    # Even on 1,000 training texts character n-grams separate the classes well above chance.
    assert base["test_accuracy"] > 0.7 and base["num_train"] == 1000 and base["sublinear_tf"]
    assert set(base["validation_accuracy"]) == {"1.0", "10.0"}
    assert str(base["best_C"]) in base["validation_accuracy"]


def test_time_interleaved_alternates():
    calls = []
    times = timing.time_interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3
    )
    assert calls == ["a", "b"] * 3
    assert len(times["a"]) == len(times["b"]) == 3


def test_unknown_section_is_user_error(capsys):
    assert cli.run(bench_main.define_flags, bench_main.main, ["benchmarks", "speed"]) == 2
    err = capsys.readouterr().err
    names = "attention, train, accuracy, imdb, lra, multihost, bert, finetune, chinese, audit, "
    names += "traditional, distill, peers, families"
    names += ", all, device"
    assert f"{names}; got ['speed']" in err


@pytest.mark.parametrize(
    "kw",
    [
        dict(pooling="mean", ngram_buckets=11),
        dict(pooling="structured", positions="sinusoidal", num_layers=2),
        dict(pooling="cls", positions="none", num_classes=3),
        dict(pooling="max", bag_buckets=13),
    ],
)
def test_flax_twin_has_our_param_count(kw):
    cfg = classifier.ModelConfig(vocab_size=20, d_model=8, num_heads=2, d_ff=12, max_len=16, **kw)
    ours = jax.eval_shape(lambda k: classifier.init(k, cfg), jax.random.key(0))
    tokens = jnp.ones((2, 16), jnp.int32)
    theirs = jax.eval_shape(lambda k: flax_twin.Classifier(cfg).init(k, tokens), jax.random.key(0))
    assert train_step.param_count(ours) == train_step.param_count(theirs["params"])


def test_flax_twin_ignores_padding():
    cfg = classifier.ModelConfig(vocab_size=20, d_model=8, num_heads=2, d_ff=12, max_len=16)
    model = flax_twin.Classifier(cfg)
    tokens = jnp.array([[5, 6, 7, 0, 0, 0]])
    variables = jax.jit(model.init)(jax.random.key(0), tokens)
    short, _ = jax.jit(model.apply)(variables, tokens[:, :3])
    padded, _ = jax.jit(model.apply)(variables, tokens)
    assert jnp.allclose(short, padded, atol=tol32(classifier_terms(cfg, 6)), rtol=0)


def test_imdb_section_accumulates_seeds_and_reports_them(tmp_path, capsys):
    make_aclimdb(tmp_path / "aclImdb", per_class=40)
    argv = ["benchmarks", "imdb", "--quick", f"--out={tmp_path / 'out'}"]
    argv.append(f"--imdb_path={tmp_path / 'aclImdb'}")
    assert cli.run(bench_main.define_flags, bench_main.main, [*argv, "--seeds=0"]) == 0
    assert cli.run(bench_main.define_flags, bench_main.main, [*argv, "--seeds=1"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    sec = results["imdb"]
    assert sorted(sec["seeds"]) == ["0", "1"]  # the second call kept the first seed
    assert sec["tfidf_word12_sublinear_logreg"]["num_test"] == 80
    # The generated reviews are separable by one word, so the baseline gets them all right.
    assert sec["tfidf_word12_sublinear_logreg"]["test_accuracy"] == 1.0
    target = sec["targets"]["beats_baseline"]
    assert target["seeds"] == ["0", "1"] and target["met"] is False
    written = (tmp_path / "out" / "REPORT.md").read_text(encoding="utf-8")
    assert "## 4. IMDB" in written and "| seed 1 |" in written and "NBSVM" in written
    # A recipe saved before a field existed is read with the field's old value: still the same.
    del sec["recipe"]["data"]["label_names"]
    (tmp_path / "out" / "results.json").write_text(json.dumps(results), encoding="utf-8")
    assert cli.run(bench_main.define_flags, bench_main.main, [*argv, "--seeds=1"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    sec = results["imdb"]
    assert sorted(sec["seeds"]) == ["0", "1"]
    # Seeds trained with another recipe are not mixed into the new one's.
    sec["recipe"]["optim"]["learning_rate"] *= 2
    (tmp_path / "out" / "results.json").write_text(json.dumps(results), encoding="utf-8")
    assert cli.run(bench_main.define_flags, bench_main.main, [*argv, "--seeds=1"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    assert sorted(results["imdb"]["seeds"]) == ["1"]
    bad = [*argv, "--seeds=0,x"]
    assert cli.run(bench_main.define_flags, bench_main.main, bad) == 2
    assert "--seeds must be non-negative integers" in capsys.readouterr().err


def test_lra_cost_section(tmp_path, capsys):
    argv = ["benchmarks", "lra", "--quick", f"--out={tmp_path}"]
    assert cli.run(bench_main.define_flags, bench_main.main, argv) == 0
    (row,) = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["lra"]["rows"]
    assert row["step_s"] > 0 and row["step_gflop"] > 0 and row["total_steps"] > 0
    assert row["hours_here"] == pytest.approx(row["total_steps"] * row["step_s"] / 3600)
    assert "## 5. Long Range Arena text: cost" in (tmp_path / "REPORT.md").read_text(
        encoding="utf-8"
    )


def _run(acc: float, first: float = 0.8, short: float = 1.0, wall: float = 100.0) -> dict:
    return {
        "test_accuracy": acc,
        "first_epoch_validation_accuracy": first,
        "wall_s": wall,
        "short_reviews": {"accuracy": short, "num_examples": 20, "wrong": []},
    }


def test_accuracy_targets_need_every_seed_and_a_point_on_average():
    bases = {
        "tfidf_logreg": {"test_accuracy": 0.85},
        "tfidf_sublinear_logreg": {"test_accuracy": 0.86},
    }
    good = {**bases, "seeds": {"0": _run(0.875), "1": _run(0.87), "2": _run(0.872)}}
    t = accuracy.targets(good)
    assert all(x["met"] for x in t.values())
    assert t["mean_one_point_above"]["mean"] == pytest.approx(0.8723, abs=1e-4)
    one_low = {**bases, "seeds": {"0": _run(0.89), "1": _run(0.855), "2": _run(0.89)}}
    t = accuracy.targets(one_low)
    assert not t["every_seed_beats_baseline"]["met"] and t["mean_one_point_above"]["met"]
    close = {**bases, "seeds": {"0": _run(0.865), "1": _run(0.868)}}
    assert not accuracy.targets(close)["mean_one_point_above"]["met"]
    slow = {**bases, "seeds": {"0": _run(0.9, wall=301)}}
    assert not accuracy.targets(slow)["every_seed_beats_baseline"]["met"]
    collapsed = {**bases, "seeds": {"0": _run(0.9, first=0.5), "1": _run(0.9, short=0.95)}}
    t = accuracy.targets(collapsed)
    assert not t["no_collapse"]["met"] and not t["short_reviews"]["met"]


def test_bert_section_times_both_attentions_and_reports_them(tmp_path, capsys):
    argv = ["benchmarks", "bert", "--quick", f"--out={tmp_path}"]
    assert cli.run(bench_main.define_flags, bench_main.main, argv) == 0
    sec = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["bert"]
    (row,) = sec["rows"]
    for name in ("attn", "jax.nn"):
        assert row[name]["step_s"] > 0 and 0 < row[name]["fraction_of_matmul"]
        assert row[name]["tokens_per_s"] == pytest.approx(
            row["batch"] * row["L"] / row[name]["step_s"]
        )
    assert row["ratio"] == pytest.approx(row["jax.nn"]["step_s"] / row["attn"]["step_s"])
    assert row["attn chunked"]["temp_bytes"] >= 0
    assert sec["numerics"] == {"skipped": "no --bert_dir (a BERT model directory)"}
    written = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert "## 7. A pretrained-size encoder" in written and "Numerics: not measured" in written


def test_bert_numerics_against_a_reference_file(tmp_path, monkeypatch):
    data = ROOT / "tests" / "data" / "bert"
    shutil.copy(data / "tiny_bert_golden.npz", tmp_path / "tiny_bert_reference.npz")
    monkeypatch.setattr(bert_section, "REFERENCES", str(tmp_path))
    n = bert_section.numerics(str(data / "tiny_bert"))
    assert n["param_count"] == n["file_float_values"] == 20_640
    assert n["float32"]["vs_flax"] < 1e-5 and n["float32"]["vs_float64_numpy"] < 1e-5
    assert 1e-5 < n["bfloat16"]["vs_flax"] < 0.2  # bfloat16 drifts, but not by much


def test_finetune_section_accumulates_rows_and_seeds_and_judges_its_targets(tmp_path, capsys):
    """The ablation table in --quick (the tiny checkpoint, 4 steps a run): rows and seeds of
    separate calls accumulate, each run is saved as it ends, and the targets read the means."""
    rows = ["text,label"]
    for i in range(120):
        word = ("great", "awful")[i % 2]
        rows.append(f"the film {i} was {word},{('pos', 'neg')[i % 2]}")
    data = tmp_path / "sentences.csv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["benchmarks", "finetune", "--quick", f"--out={out}", f"--data_path={data}"]

    def results() -> dict:
        return json.loads((out / "results.json").read_text(encoding="utf-8"))["finetune"]

    run = lambda *more: cli.run(bench_main.define_flags, bench_main.main, [*argv, *more])  # noqa: E731
    assert run("--rows=tfidf,attention_off", "--seeds=0") == 0
    assert run("--rows=finetuned", "--seeds=0,1") == 0
    sec = results()
    assert sec["runs"]["tfidf"]["test_accuracy"] == 1.0  # one word separates the classes
    assert sorted(sec["runs"]["attention_off"]["seeds"]) == ["0"]  # kept from the first call
    assert sorted(sec["runs"]["finetuned"]["seeds"]) == ["0", "1"]
    assert sec["runs"]["attention_off"]["recipe"]["model"]["pretrained_layers"] == 0
    t = sec["targets"]["attention_earns"]
    ft = [sec["runs"]["finetuned"]["seeds"][s]["test_accuracy"] for s in ("0", "1")]
    assert t["finetuned_mean"] == pytest.approx(sum(ft) / 2) and t["finetuned_seeds"] == ["0", "1"]
    assert t["met"] == (t["finetuned_mean"] - t["bar"] >= 0.05 - 1e-9)
    assert t["seed_gaps"] == pytest.approx([a - t["bar"] for a in ft])
    bar = sec["targets"]["beats_scratch_and_tfidf"]["bar"]
    assert bar == 1.0  # scratch was not run: TF-IDF alone sets it
    written = (out / "REPORT.md").read_text(encoding="utf-8")
    per_seed = " / ".join(f"{g * 100:+.2f}" for g in t["seed_gaps"])
    assert f"per seed {per_seed})" in written
    assert "## 8. What attention earns pretrained" in written
    assert "(seeds 0, 1)" in written and "attention off" in written
    assert run("--rows=finetuned,nope") == 2
    assert "--rows: unknown nope" in capsys.readouterr().err
    assert cli.run(bench_main.define_flags, bench_main.main, argv[:4]) == 2
    assert "finetune needs --data_path=FILE" in capsys.readouterr().err

    # The imdb row trains on an aclImdb folder's official split and keeps the text file's rows.
    make_aclimdb(tmp_path / "aclImdb")
    assert run("--rows=imdb", "--seeds=1") == 2
    assert "the imdb row needs --imdb_path=DIR" in capsys.readouterr().err
    imdb = ["--rows=imdb", f"--imdb_path={tmp_path / 'aclImdb'}"]
    assert cli.run(bench_main.define_flags, bench_main.main, [*argv[:4], *imdb, "--seeds=1"]) == 0
    sec = results()
    assert sorted(sec["runs"]["finetuned"]["seeds"]) == ["0", "1"] and sec["data_path"] == str(data)
    ran = sec["imdb"]
    assert ran["config"] == finetune.IMDB_CPU and sorted(ran["seeds"]) == ["1"]
    assert ran["recipe"]["data"]["dataset"] == "imdb_reviews"
    assert ran["recipe"]["data"]["path"] == str(tmp_path / "aclImdb")
    acc = ran["seeds"]["1"]["test_accuracy"]
    assert ran["every_seed_above"] == {n: acc > b for n, b in finetune.IMDB_BARS.items()}
    target = sec["targets"][finetune.IMDB_TARGET]  # in REPORT's targets table
    assert target["met"] == (acc > 0.9122) and target["finetuned_mean"] == acc
    assert "### IMDB" in (out / "REPORT.md").read_text(encoding="utf-8")
    assert f"seed 1 | {100 * acc:.2f}%" in docs.finetune_imdb(sec)


def test_families_section_times_every_family_against_its_reference(tmp_path, capsys):
    """`benchmarks families --quick`: a row per registered family, each timed against jax.nn's
    attention or, where jax.nn cannot compute its score, BERT's step of its size, and
    ModernBERT's step at two depths; REPORT renders the table and the depth ratio."""
    argv = ["benchmarks", "families", "--quick", f"--out={tmp_path}"]
    assert cli.run(bench_main.define_flags, bench_main.main, argv) == 0
    sec = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["families"]
    from attn import encoders

    assert set(sec["rows"]) == set(encoders.FAMILIES)
    for name, row in sec["rows"].items():
        assert row["ratio"] > 0 and row["attn"]["step_s"] > 0
        jax_nn = "xla" not in encoders.family(name).unsupported
        assert (row["reference"] == "jax.nn") == jax_nn and bool(row["no_jax_nn"]) != jax_nn
    depth = sec["depth"]
    assert depth["family"] == "modernbert" and depth["layers"] == [1, 2]
    assert depth["ratio"] == depth["step_s"][1] / depth["step_s"][0] > 0
    report = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert "10. Every encoder family" in report and "| deberta-v2 |" in report
    assert f"2 / 1 layers **{depth['ratio']:.2f}**" in report


def test_traditional_section_scores_both_scripts_and_the_conversion(trained, tmp_path, capsys):
    """`benchmarks traditional --quick` with the `trained` workdir as the audit's attn from scratch:
    every 20th test text simplified, made traditional, and read with --convert=t2s, which answers
    as on the simplified text wherever the round trip gives the text back; REPORT renders it."""
    pytest.importorskip("opencc")
    (tmp_path / "runs" / "audit").mkdir(parents=True)
    (tmp_path / "runs" / "audit" / "default-tiny").symlink_to(trained)
    out = tmp_path / "out"
    argv = ["benchmarks", "traditional", "--quick", f"--out={out}", f"--workdirs={tmp_path}/runs"]
    assert cli.run(bench_main.define_flags, bench_main.main, argv) == 0
    sec = json.loads((out / "results.json").read_text(encoding="utf-8"))["traditional"]
    assert sec["num_test"] == sec["changed_texts"] == 87  # 1,726 / 20; each has a simplified one
    assert 0.2 < sec["changed_characters"] < 0.35 and sec["round_trip_exact"] > 0.9
    (name, m), *others = sec["models"].items()
    assert name == "attn from scratch (configs/default.py)" and not others
    assert [m[k]["converted_texts"] for k in ("simplified", "traditional", "converted")] == [
        0,
        0,
        87,
    ]
    assert m["traditional"]["unknown_tokens"] > m["simplified"]["unknown_tokens"]
    assert abs(m["converted"]["accuracy"] - m["simplified"]["accuracy"]) <= (
        1 - sec["round_trip_exact"] + 1e-9
    )
    said = m["predict"]
    assert (said["simplified"]["text"], said["traditional"]["text"]) == (
        "这本书非常好看",
        "這本書非常好看",
    )
    assert said["converted"] == {**said["simplified"], "text": "這本書非常好看"}
    written = (out / "REPORT.md").read_text(encoding="utf-8")
    assert "## 15. Traditional Chinese" in written
    assert f"| {name} | test accuracy | {100 * m['simplified']['accuracy']:.2f}% |" in written
