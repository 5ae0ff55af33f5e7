"""Package promises: the README example runs; attn/ stays free of TF, I/O and configs and needs
only its declared dependencies; entry points in experiments/ are imported by no module there."""

import ast
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).parent.parent
# experiments/'s top level: the commands and these modules they share; the rest sit in rooms.
SHARED = {
    "cli",
    "compile_cache",
    "errors",
    "fields",
    "parallel",
    "workdirs",
}


def test_readme_python_example_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "README has no python example"
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert scope["out"].shape == (8, 4, 16, 32)
    assert scope["grads"].shape == scope["q"].shape


def test_import_attn_loads_no_tensorflow_or_config_library():
    code = "import sys, attn, attn.flax_interop; print(sorted(m for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules = set(eval(out.stdout))
    assert "attn.classifier" in modules
    assert not {m for m in modules if m.split(".")[0] in ("tensorflow", "ml_collections")}


def test_library_sources_do_no_io():
    for path in sorted((ROOT / "attn").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        for forbidden in ("import tensorflow", "open(", "ml_collections", "print("):
            if path.name == "bert.py" and forbidden == "open(":
                continue  # attn's one I/O: bert.load reads a checkpoint directory
            assert forbidden not in source, f"{path.name} contains {forbidden!r}"


def test_the_objectives_hold_their_loss_step_and_evaluation_and_the_pipeline_the_runs():
    from experiments import pretrain, train
    from experiments.training import classify, masked_tokens, pipeline

    assert train.train_and_evaluate is pipeline.train_and_evaluate
    assert pretrain.pipeline.pretrain is pipeline.pretrain
    for objective in (classify, masked_tokens):
        assert {"train_step", "evaluate"} <= set(vars(objective))
        assert not {"train_and_evaluate", "pretrain"} & set(vars(objective))
        tree = ast.parse(pathlib.Path(objective.__file__).read_text(encoding="utf-8"))
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "experiments.training"
            for alias in node.names
        }
        assert not imported & {"setup", "pipeline", "baseline", "warm_start", "finetune"}


def test_no_module_in_experiments_imports_an_entry_point():
    entry_points = {p.stem for p in (ROOT / "experiments").glob("*.py")} - {
        "__init__",
        *SHARED,
    }
    assert {"train", "pretrain", "evaluate", "predict", "visualize", "faithfulness"} <= entry_points
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "experiments":
                names = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom | ast.Import):
                modules = [node.module] if isinstance(node, ast.ImportFrom) else []
                modules += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names = {m.split(".")[1] for m in modules if m and m.startswith("experiments.")}
            else:
                continue
            assert not names & entry_points, f"{path.relative_to(ROOT)} imports {names}"


def test_pip_install_gives_the_library_alone():
    """`pip install .` installs attn only: top-level packages named experiments or configs would
    shadow a user's own modules of those names (and need what only the clone installs)."""
    from setuptools import find_packages

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    found = find_packages(where=str(ROOT), **settings["setuptools"]["packages"]["find"])
    assert {p.split(".")[0] for p in found} == {"attn"}, found


def test_the_clone_imports_from_anywhere_beside_a_folder_named_attn(tmp_path):
    """From another directory, beside a folder named `attn` (e.g. a clone seen from its parent),
    the clone's attn, experiments and configs are imported (its editable install, as make
    does), not the folder."""
    (tmp_path / "attn").mkdir()
    script = tmp_path / "script.py"
    script.write_text(
        "import attn, configs.default, experiments.data\n"
        "print(attn.__file__, configs.default.__file__, experiments.data.__file__)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    paths = [pathlib.Path(p) for p in out.stdout.split()]
    assert paths == [
        ROOT / "attn" / "__init__.py",
        ROOT / "configs" / "default.py",
        ROOT / "experiments" / "data" / "__init__.py",
    ]


def _closure(names: list[str]) -> set[str]:
    """The installed distributions `names` need, theirs included (extras left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = re.split(r"[^A-Za-z0-9._-]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        todo += [r for r in importlib.metadata.requires(name) or () if "extra ==" not in r]
    return seen


_ATTENTION = (
    "import sys, jax, attn\n"
    "q = jax.random.normal(jax.random.key(0), (5, 8))\n"
    "out, w = attn.attention(q, q, q, attn.masks.causal)\n"
    "print(out.shape, float(w.sum()), 'flax' in sys.modules)\n"
)


def test_attn_runs_with_only_its_declared_dependencies(tmp_path):
    """What `pip install .` gives, cheaply: a path holding only attn, the distributions
    `[project] dependencies` name and what they need; attn imports and attention runs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert {re.split(r"[<>=!~ ]", r)[0] for r in project["dependencies"]} == {"jax", "numpy"}
    needed = _closure(project["dependencies"])
    assert {"jax", "jaxlib", "numpy"} <= needed and not {"flax", "optax"} & needed
    (tmp_path / "attn").symlink_to(ROOT / "attn")
    for name in needed:
        dist = importlib.metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or () if ".." not in f.parts}:
            if not (tmp_path / top).exists():
                (tmp_path / top).symlink_to(dist.locate_file(top))
    # -S: no site-packages, so nothing else installed is importable.
    run = lambda code: subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    proc = run(_ATTENTION)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["(5,", "8)", "5.0", "False"]
    # The same path lacks what attn does not declare, so the check above can fail.
    proc = run("import attn.flax_interop")
    assert 'needs Flax, which is not installed: pip install "attn[flax]"' in proc.stderr


def test_experiments_top_level_holds_the_commands_and_at_most_six_shared_modules():
    top = {p.stem for p in (ROOT / "experiments").glob("*.py")} - {"__init__"}
    assert SHARED <= top and len(SHARED) <= 6
    for name in sorted(top - SHARED):  # a command: flags, then one call, then printing
        module = importlib.import_module(f"experiments.{name}")
        assert callable(module.define_flags) and callable(module.main), name
