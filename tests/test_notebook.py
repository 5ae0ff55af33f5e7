"""The Colab notebook: plain Python that installs only what Colab lacks, and every cell run end to
end in a kernel on CPU, with only its parameter cell replaced (the tiny config, embedded data)."""

import ast
import json
import pathlib
import re
import subprocess
import sys
import textwrap
import zipfile

import pytest
from conftest import ROOT

NOTEBOOK = ROOT / "experiments" / "colab.ipynb"
TINY_BERT = ROOT / "tests" / "data" / "bert" / "tiny_bert"  # in place of a hub id


def _cells(kind: str = "code") -> list[dict]:
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == kind]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def test_notebook_is_plain_python_with_one_parameter_cell():
    """No shell or magic lines: every cell compiles as Python (and so runs under any kernel)."""
    cells = _cells()
    for cell in cells:
        compile(_source(cell), str(NOTEBOOK), "exec")
    tagged = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
    assert tagged == [cells[0]]
    names = {t.id for node in ast.parse(_source(cells[0])).body for t in node.targets}
    assert {"CONFIG", "OVERRIDES", "SOURCE", "WORK", "INSTALL", "TEXTS"} <= names
    # The first run is the fast one: the embedded data, no download; its examples follow the
    # data's language rather than staying English.
    values = {
        t.id: ast.literal_eval(node.value)
        for node in ast.parse(_source(cells[0])).body
        for t in node.targets
    }
    assert values["CONFIG"] == "configs/default.py" and values["TEXTS"] == []
    assert values["PRETRAINED"] == "bert-base-chinese"  # section 5: the Chinese pretrained path


def test_notebook_installs_only_what_colab_lacks():
    """One pip call: the repository's [experiments] extra, whose lower bounds are Colab's own
    versions (.ci/run installs them, runs the same call and checks that none changed). No jax,
    numpy or TFDS of its own, no requirements file of exact pins, no restart, no clone of a URL."""
    code = "\n".join(_source(c) for c in _cells())
    assert code.count('"pip", "install"') == 1
    assert '"pip", "install", "-q", "-e", f"{REPO}[experiments]"' in code
    for absent in ("requirements", "jax[", "git clone", "YOUR_NAME", "Restart"):
        assert absent not in code
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip" install -q -e ".[experiments]"' in ci
    assert 'pip" install -q -r requirements-colab.txt' in ci
    text = "\n".join(_source(c) for c in _cells("markdown"))
    assert "no public URL" in text and "v5e-1" in text and "one JAX device" in text
    assert "no restart" in text


def test_importing_the_project_keeps_the_matplotlib_backend():
    """A notebook's inline backend survives the imports the notebook makes."""
    code = (
        "import matplotlib; matplotlib.use('svg')\n"
        "from experiments import evaluate, train, visualize\n"
        "from experiments.explain import plots, step_plots\n"
        "print(matplotlib.get_backend())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "svg", out.stderr[-2000:]


def _zip_of_the_repository(path: pathlib.Path) -> None:
    """What a user uploads: the repository in one top folder, as a hosted 'download zip' is."""
    with zipfile.ZipFile(path, "w") as z:
        z.write(ROOT / "pyproject.toml", "attn-main/pyproject.toml")
        for package in ("attn", "configs", "experiments"):
            for file in sorted((ROOT / package).rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    z.write(file, f"attn-main/{file.relative_to(ROOT)}")


PARAMETERS = """
CONFIG = "configs/default.py:tiny"
OVERRIDES = {{"data.data_dir": {data_dir!r}}}
RUN = "tiny"
TEXTS = []
SOURCE = {source!r}
WORK = {work!r}
INSTALL = False
FINETUNE = "configs/finetune.py:tiny"
PRETRAINED = {pretrained!r}
"""


@pytest.mark.slow
@pytest.mark.notebook
def test_notebook_runs_every_cell_on_cpu(tfds_dir, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # A kernel of this very interpreter, whatever kernels the machine has registered.
    spec = tmp_path / "kernels" / "jupyter" / "kernels" / "attn-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "kernels" / "jupyter"))
    _zip_of_the_repository(tmp_path / "attn.zip")
    work = tmp_path / "work"

    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    (parameters,) = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    # SOURCE names the folder, which does not exist: the zip beside it is found, as on Drive.
    parameters.source = PARAMETERS.format(
        data_dir=tfds_dir, source=str(tmp_path / "attn"), work=str(work), pretrained=str(TINY_BERT)
    )
    client = nbclient.NotebookClient(
        nb, kernel_name="attn-test", timeout=600, resources={"metadata": {"path": str(tmp_path)}}
    )
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        # Rerunning the training cell resumes the finished run instead of starting over.
        train_cell = next(c for c in cells if "train_and_evaluate" in c.source)
        metrics_before = (work / "tiny" / "metrics.jsonl").read_text(encoding="utf-8")
        nb.cells.append(nbformat.v4.new_code_cell(train_cell.source))
        rerun = client.execute_cell(nb.cells[-1], len(nb.cells) - 1)

    def outputs(cell, key):
        return [o for o in cell.outputs if key in o.get("data", {})]

    def text(cell):
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")

    code = {i: c for i, c in enumerate(cells)}
    # The code came from the zip, unpacked under WORK, and the run went to WORK as well.
    assert f"the code: {work / 'attn_code' / 'attn-main'}" in text(code[1])
    assert "1 cpu device(s)" in text(code[3])
    assert (work / "tiny" / "checkpoints").is_dir() and (work / "tiny" / "eval_test.json").exists()
    assert "'num_examples': 1726" in text(code[4])
    assert outputs(code[5], "image/png")  # curves.png
    assert outputs(code[6], "image/png")  # pyplot inline, after the project's imports
    steps = outputs(code[7], "image/png")
    assert len(steps) == 2  # one step-by-step figure per text
    (page,) = outputs(code[7], "text/html")
    shown = re.sub(r"<rt>.*?</rt>|<[^>]+>", "", page["data"]["text/html"])  # tokens, no weights
    assert "质量很好，很满意" in shown  # TEXTS = []: the examples in the training texts' language
    # Section 5 fine-tuned the checkpoint on the same data and classified TEXTS with it.
    assert (work / "tiny_ft" / "checkpoint_tokenizer" / "vocab.txt").is_file()
    tuned = text(code[8])
    assert re.search(r"test accuracy: \S+tiny_bert fine-tuned 0\.\d{4}, configs/default", tuned)
    assert len(re.findall(r"\t 质量很好，很满意|\t 太差了，不推荐", tuned)) == 2
    assert "resuming from step 6 of 6; nothing left to train" in text(rerun)
    assert (work / "tiny" / "metrics.jsonl").read_text(encoding="utf-8") == metrics_before


def test_parameters_template_names_every_parameter():
    """The test's parameter cell sets what the notebook's does, no more and no less."""
    ours = {t.id for node in ast.parse(_source(_cells()[0])).body for t in node.targets}
    template = textwrap.dedent(PARAMETERS).format(data_dir="", source="", work="", pretrained="")
    theirs = {t.id for node in ast.parse(template).body for t in node.targets}
    assert ours == theirs
