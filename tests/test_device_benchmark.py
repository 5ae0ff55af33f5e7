"""`python -m benchmarks device` on CPU with --quick: every figure it measures on a GPU or TPU is
measured at tiny sizes or named with the reason it cannot be, printed, and written to
device.json."""

import json

import pytest
from conftest import make_aclimdb

from benchmarks import __main__ as bench_main
from benchmarks import device, finetune
from experiments import cli


def _run(*args: str) -> int:
    return cli.run(bench_main.define_flags, bench_main.main, ["benchmarks", "device", *args])


@pytest.mark.slow
def test_quick_run_measures_or_names_every_figure(tmp_path, capsys):
    make_aclimdb(tmp_path / "aclImdb")
    assert _run("--quick", f"--out={tmp_path}", f"--imdb_path={tmp_path / 'aclImdb'}") == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "device.json").read_text(encoding="utf-8"))
    rows = [*result["matmul"], *result["attention"], *result["train"]["rows"], result["lra"]]
    rows += [*result["bert"], result["finetune"]]
    assert sorted(r["figure"] for r in rows) == sorted(device.figures())
    assert result["device"]["platform"] == "cpu" and result["quick"] is True

    assert all(r["flops"] > 0 for r in result["matmul"])
    for r in result["attention"]:
        assert r["measured_L"] == device.QUICK.measured_length
        assert device._attention_line(r) in out  # printed, measured or not
        if r["method"] == device.CUDNN:
            assert r["skipped"] == "cuDNN runs on NVIDIA GPUs only"
            continue
        if r["method"] in device.FUSED:  # attn's own one-line refusal off their hardware
            assert r["skipped"].startswith("not measurable here: implementation=")
            assert "JAX's default backend is 'cpu'" in r["skipped"]
            continue
        assert r["time_s"] > 0 and r["tflops"] > 0 and r["fraction_of_matmul"] > 0
        assert r["ratio_vs_jax_nn"] == pytest.approx(
            r["time_s"]
            / next(
                x["time_s"]
                for x in result["attention"]
                if (x["method"], x["L"], x["dtype"]) == (device.REFERENCE, r["L"], r["dtype"])
            )
        )

    train = result["train"]
    assert {r["dtype"] for r in train["rows"]} == {"float32", "bfloat16"}
    for r in train["rows"]:
        assert r["examples_per_s"] > 0 and r["param_dtypes"] == ["float32"]  # bf16 or not
    assert "bfloat16/float32 speed" in out

    for r in result["bert"]:
        assert device._bert_line(r) in out
        if r["method"] in device.FUSED:
            assert r["skipped"].startswith("not measurable here: implementation=")
            continue
        if "skipped" in r:  # PyTorch, where it is not installed
            assert r["method"] == device.TORCH
            assert (
                r["skipped"]
                == "not measurable here: PyTorch is not installed (no dependency of attn)"
            )
            continue
        assert r["step_s"] > 0 and r["tokens_per_s"] > 0 and r["fraction_of_matmul"] > 0
    assert {r["ratio_vs_jax_nn"] for r in result["bert"] if r["method"] == device.REFERENCE} == {1}

    lra = result["lra"]
    # Bounded by the time budget and, for the tiny config, by its own 6 steps.
    assert 1 <= lra["steps"] <= 6 and lra["test_examples"] == 24
    assert 0.0 <= lra["test_accuracy"] <= 1.0
    assert f"test accuracy {lra['test_accuracy']:.4f} on 24 reviews" in out


def test_the_imdb_fine_tune_runs_each_seed_on_the_folder_and_reads_it_against_the_bars(
    tmp_path, capsys
):
    make_aclimdb(tmp_path / "aclImdb")
    args = ["--quick", "--parts=finetune", f"--out={tmp_path}", "--seeds=0,1"]
    assert _run(*args, f"--imdb_path={tmp_path / 'aclImdb'}") == 0
    ft = json.loads((tmp_path / "device.json").read_text(encoding="utf-8"))["finetune"]
    assert sorted(ft["seeds"]) == ["0", "1"] and ft["bert_dir"].endswith("tiny_bert")
    accs = [r["test_accuracy"] for r in ft["seeds"].values()]
    assert all(0.0 <= a <= 1.0 for a in accs)
    assert ft["every_seed_above"] == {n: min(accs) > b for n, b in finetune.IMDB_BARS.items()}
    assert ft["config"] == "finetune.py:imdb"
    assert "IMDB fine-tuned (finetune.py:imdb), seed 1: test" in capsys.readouterr().out
    assert _run("--quick", "--parts=finetune", f"--out={tmp_path}") == 0
    ft = json.loads((tmp_path / "device.json").read_text(encoding="utf-8"))["finetune"]
    assert ft["skipped"] == "needs --imdb_path (an aclImdb folder) and --bert_dir"


def test_without_a_folder_the_lra_figure_is_named_and_skipped(tmp_path, capsys):
    assert _run("--quick", "--parts=lra", f"--out={tmp_path}") == 0
    result = json.loads((tmp_path / "device.json").read_text(encoding="utf-8"))
    assert result["lra"] == {
        "figure": "lra_text test accuracy",
        "config": "lra_text.py:tiny",
        "skipped": "no --imdb_path (a local aclImdb folder)",
    }
    assert "attention" not in result and "train" not in result


@pytest.mark.parametrize(
    "args, message",
    [
        (["--parts=attention,speed"], "--parts must be some of attention, train, lra"),
        (["--imdb_path=/nonexistent/aclImdb"], "is not a folder"),
        (["--lra_minutes=0"], "--lra_minutes must be > 0"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, args, message):
    assert _run("--quick", f"--out={tmp_path}", *args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "device.json").exists()
