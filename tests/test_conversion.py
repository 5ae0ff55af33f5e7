"""Traditional Chinese for a model trained on simplified: data.convert and the serving commands'
--convert (OpenCC, `experiments.data.conversion`), on the `trained` workdir (characters of the
simplified embedded reviews). The conversion reaches what the model reads, is said on stderr,
follows the workdir's saved config unless --convert overrides it, and a name OpenCC lacks is
refused in one line before anything is written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error, run_here, tiny_config, tiny_flags

from experiments import serving
from experiments.data import conversion, datasets

pytest.importorskip("opencc")  # requirements.txt pins it; a bare `pip install .[experiments]` too

TRADITIONAL = "這個產品質量很好，物流也快"  # 產 is outside the embedded reviews' characters
SIMPLIFIED = "这个产品质量很好，物流也快"


@pytest.fixture(autouse=True)
def _said_afresh():
    """Each test sees the summary lines its own command prints (`conversion.say` prints a line
    once per process)."""
    conversion.say.cache_clear()


def _predict(workdir: str, *args: str, capsys) -> subprocess.CompletedProcess:
    return run_here("experiments.predict", f"--workdir={workdir}", *args, capsys=capsys)


def _answers(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[1:]  # under the header


def _convert_saved(workdir: str, name: str | None) -> None:
    """The workdir's config.json as a run with data.convert=name writes it (None: as a run
    from before the field wrote it)."""
    path = os.path.join(workdir, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["data"].pop("convert")
    if name is not None:
        config["data"]["convert"] = name
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)


def test_opencc_converts_between_the_scripts():
    assert conversion.converter("t2s")(TRADITIONAL) == SIMPLIFIED
    assert conversion.converter("s2t")(SIMPLIFIED) == TRADITIONAL
    assert conversion.converter("")(TRADITIONAL) == TRADITIONAL
    assert conversion.convert_all("t2s", [TRADITIONAL, SIMPLIFIED, "好"]) == (
        [SIMPLIFIED, SIMPLIFIED, "好"],
        1,
    )
    assert {"t2s", "s2t", "tw2s", "hk2s"} <= set(conversion.names("data.convert", "t2s"))


def test_predict_convert_reads_traditional_as_the_simplified_text(trained, capsys):
    """--convert=t2s: the traditional text gets the simplified text's answer, its words listed as
    read (simplified), and stderr says how many texts changed; without it the model reads 產 as
    unknown and answers otherwise."""
    every = "--top=20"  # every word the model knows, not the 5 most attended
    plain = _answers(_predict(trained, every, TRADITIONAL, SIMPLIFIED, capsys=capsys))
    proc = _predict(trained, every, "--convert=t2s", TRADITIONAL, SIMPLIFIED, capsys=capsys)
    converted = _answers(proc)
    assert converted == [plain[1], plain[1]] and plain[0] != plain[1]
    assert "产" in converted[0] and "產" not in converted[0] + plain[0]
    assert "OpenCC t2s changed 1 of 2 texts before the model read them" in proc.stderr
    assert "OpenCC" not in _predict(trained, SIMPLIFIED, capsys=capsys).stderr


def test_the_saved_data_convert_is_applied_and_convert_overrides_it(trained_copy, capsys):
    """A workdir whose run converted its texts (config.json's data.convert) converts what predict
    reads; --convert='' reads the text as it is; a workdir from before the field converts
    nothing."""
    simplified = _answers(_predict(trained_copy, SIMPLIFIED, capsys=capsys))
    as_is = _answers(_predict(trained_copy, TRADITIONAL, capsys=capsys))
    _convert_saved(trained_copy, "t2s")
    assert serving.load(trained_copy).config.data.convert == "t2s"
    proc = _predict(trained_copy, TRADITIONAL, capsys=capsys)
    assert _answers(proc) == simplified
    assert "OpenCC t2s changed 1 of 1 texts before the model read them" in proc.stderr
    proc = _predict(trained_copy, "--convert=", TRADITIONAL, capsys=capsys)
    assert _answers(proc) == as_is and "OpenCC" not in proc.stderr
    _convert_saved(trained_copy, None)
    assert serving.load(trained_copy).config.data.convert == ""
    assert _answers(_predict(trained_copy, TRADITIONAL, capsys=capsys)) == as_is


def test_predict_path_converts_every_row(trained, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_text(f"text,label\n{TRADITIONAL},pos\n{SIMPLIFIED},pos\n", encoding="utf-8")
    out = tmp_path / "out.csv"
    proc = _predict(trained, f"--path={src}", f"--out={out}", "--convert=t2s", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert "2 of 2 rows answered" in proc.stderr
    assert "OpenCC t2s changed 1 of 2 texts before the model read them" in proc.stderr
    rows = out.read_text(encoding="utf-8").splitlines()
    assert rows[1].split(",")[2:] == rows[2].split(",")[2:]  # the same answer, to the digit


def test_evaluate_path_converts_every_row_and_records_it_beside_the_run_s_own(
    trained_copy, tmp_path, capsys
):
    src = tmp_path / "in.csv"
    src.write_text(f"text,label\n{TRADITIONAL},pos\n{SIMPLIFIED},neg\n", encoding="utf-8")
    args = (f"--workdir={trained_copy}", f"--path={src}")
    assert run_here("experiments.evaluate", *args, capsys=capsys).returncode == 0
    proc = run_here("experiments.evaluate", *args, "--convert=t2s", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert "OpenCC t2s changed 1 of 2 texts before the model read them" in proc.stderr
    assert "evaluate_file_in_t2s.json" in proc.stdout
    own, converted = (
        json.loads(Path(trained_copy, f"evaluate_file_in{end}.json").read_text(encoding="utf-8"))
        for end in ("", "_t2s")
    )
    # The same text read twice, labelled both ways: one right, one wrong.
    assert converted["convert"] == "t2s" and converted["accuracy"] == 0.5
    assert "convert" not in own and own["num_examples"] == 2


def test_evaluate_names_a_conversion_other_than_the_run_s():
    from experiments import evaluate

    name = lambda **kw: os.path.basename(evaluate.result_file("W", **kw))  # noqa: E731
    assert name(split="test") == "evaluate_test.json"
    assert name(split="test", convert="t2s") == "evaluate_test_t2s.json"
    assert name(split="test", convert="") == "evaluate_test_unconverted.json"
    assert name(which="checkpoints", path="a/b.csv", convert="") == (
        "evaluate_file_b_last_unconverted.json"
    )


@pytest.mark.parametrize(
    "command, args",
    [("predict", [TRADITIONAL]), ("evaluate", []), ("visualize", ["--out=VIS", TRADITIONAL])],
)
def test_an_unknown_conversion_is_refused_in_one_line_and_nothing_is_written(
    command, args, trained_copy, tmp_path, capsys
):
    before = sorted(os.listdir(trained_copy))
    args = [a.replace("VIS", str(tmp_path / "vis")) for a in args]
    proc = run_here(
        f"experiments.{command}",
        f"--workdir={trained_copy}",
        "--convert=t2x",
        *args,
        capsys=capsys,
    )
    assert_one_line_error(proc, "--convert='t2x' is not an OpenCC conversion; known: ", "t2s")
    assert sorted(os.listdir(trained_copy)) == before and os.listdir(tmp_path) == ["copy"]


def test_export_refuses_a_run_that_converted_its_texts(trained_copy, tmp_path, capsys):
    """An exported model reads texts as given: one of a run with data.convert would answer
    traditional text as the run never read it."""
    _convert_saved(trained_copy, "t2s")
    args = (f"--workdir={trained_copy}", f"--out={tmp_path / 'exported'}")
    proc = run_here("experiments.export", *args, capsys=capsys)
    assert_one_line_error(proc, "(data.convert='t2s')", "an exported model cannot do")
    assert not (tmp_path / "exported").exists()


def test_a_run_with_an_unknown_conversion_is_refused_before_its_workdir_exists(
    tfds_dir, tmp_path, capsys
):
    workdir = tmp_path / "run"
    proc = run_here(
        "experiments.train",
        *tiny_flags(tfds_dir),
        "--config.data.convert=zh2xx",
        f"--workdir={workdir}",
        capsys=capsys,
    )
    assert_one_line_error(proc, "data.convert='zh2xx' is not an OpenCC conversion")
    assert not workdir.exists()


def test_data_convert_converts_every_split_text_and_says_how_many(tfds_dir, capsys):
    """The splits are the same texts, converted: what training, evaluate and the baseline read."""
    plain = datasets.load_splits(tiny_config(tfds_dir).data, ("validation", "test"))
    capsys.readouterr()
    data = tiny_config(tfds_dir, data__convert="s2t").data
    converted = datasets.load_splits(data, ("validation", "test"))
    for split, (texts, labels, names) in plain.items():
        got, got_labels, got_names = converted[split]
        assert got == conversion.convert_all("s2t", texts)[0] and got != texts
        assert (got_labels == labels).all() and got_names == names
    total = sum(len(plain[s][0]) for s in plain)
    changed = sum(a != b for s in plain for a, b in zip(plain[s][0], converted[s][0], strict=True))
    assert capsys.readouterr().err == (
        f"OpenCC s2t changed {changed:,} of {total:,} texts (validation, test) before the model "
        "read them\n"
    )


def test_opencc_is_imported_only_when_a_conversion_is_asked_for(monkeypatch):
    code = (
        "import sys\n"
        "from experiments import evaluate, predict, train, visualize, serving\n"
        "from experiments.data import conversion, datasets\n"
        "conversion.converter('')\n"
        "print('opencc' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "opencc", None)  # what `import opencc` meets uninstalled
    conversion.converter.cache_clear()
    with pytest.raises(conversion.UserError) as e:
        conversion.converter("t2s", "--convert")
    assert str(e.value) == (
        "--convert='t2s' converts texts with OpenCC, which is not installed: pip install opencc"
    )
    conversion.converter.cache_clear()
