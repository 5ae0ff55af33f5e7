"""What attn offers a user's type checker and imports: __all__ in every module, py.typed shipped."""

import ast
import importlib
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).parent.parent
MODULES = sorted(p.stem for p in (ROOT / "attn").glob("*.py") if p.stem != "__init__")


def test_every_module_lists_its_public_names_in_all():
    for name in MODULES:
        module = importlib.import_module(f"attn.{name}")
        exported = module.__all__
        assert len(set(exported)) == len(exported), name
        assert all(hasattr(module, n) for n in exported), name
        tree = ast.parse((ROOT / "attn" / f"{name}.py").read_text(encoding="utf-8"))
        defined = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
        }
        assert defined <= set(exported), (name, defined - set(exported))
    top = importlib.import_module("attn")
    assert set(MODULES) - {"attention", "flax_interop"} <= set(top.__all__)
    assert {"attention", "dot_product_attention", "Attention"} <= set(top.__all__)


def test_py_typed_is_shipped():
    assert (ROOT / "attn" / "py.typed").exists()
    with open(ROOT / "pyproject.toml", "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["attn"]
