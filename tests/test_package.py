"""Package promises: the README example runs; attn/ stays free of TF, I/O and configs; entry
points in experiments/ are imported by no module there."""

import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


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
            assert forbidden not in source, f"{path.name} contains {forbidden!r}"


def test_no_module_in_experiments_imports_an_entry_point():
    entry_points = {"train", "evaluate", "predict", "visualize", "data_info"}
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


def test_installed_packages_import_from_anywhere(tmp_path):
    """From another directory, beside a folder named `attn` (e.g. a clone seen from its parent),
    the installed attn, experiments and configs are the repository's."""
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
