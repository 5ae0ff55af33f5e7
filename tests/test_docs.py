"""README.md and docs/*.md stay true: their result numbers are what results.json renders, their
python blocks run, their commands name modules, flags and config fields that exist (and `make test`
and `make test-slow`, both in .ci/run, split the suite between them), and their links resolve. A
block that must not run here is preceded by `<!-- docs-test: skip (why) -->`."""

import ast
import importlib
import itertools
import json
import re
import shlex
import tomllib

import pytest
from absl import flags
from conftest import ROOT

from benchmarks import docs, report
from experiments import cli

RESULTS = json.loads((ROOT / "benchmarks" / "results.json").read_text(encoding="utf-8"))
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
SKIP = "<!-- docs-test: skip"
FENCE = re.compile(r"^(<!-- docs-test: skip[^\n]*\n)?```(\w*)\n(.*?)^```", re.S | re.M)


def _read(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    """(page, index, code) of every block in `lang` that is not marked skip."""
    out = []
    for page in PAGES:
        for i, m in enumerate(FENCE.finditer(_read(page))):
            if m.group(2) == lang and not m.group(1):
                out.append((page, i, m.group(3)))
    return out


def test_readme_is_short_and_its_first_python_block_is_the_vmap_example():
    readme = _read("README.md")
    assert len(readme.encode("utf-8")) <= 8 * 1024
    first = re.search(r"```python\n(.*?)```", readme, flags=re.S).group(1)
    assert "jax.vmap" in first and "attn.attention" in first


def test_every_results_region_is_what_results_json_renders():
    pages = docs.pages()
    assert set(PAGES) <= set(pages) and "benchmarks/analysis.md" in pages
    for page in pages:
        text = _read(page)
        assert docs.render(text, RESULTS) == text, f"{page}: run python -m benchmarks.report"
    readme = _read("README.md")
    for name in ("headline", "verdict"):
        assert f"<!-- results:{name} -->\n" in readme


def test_render_rewrites_a_stale_region_and_refuses_an_unknown_one():
    stale = "a <!-- results:tfidf -->99.99%<!-- /results:tfidf --> b"
    assert docs.render(stale, RESULTS) == (
        f"a <!-- results:tfidf -->{docs.FACTS['tfidf'](RESULTS)}<!-- /results:tfidf --> b"
    )
    with pytest.raises(KeyError, match="unknown results region"):
        docs.render("<!-- results:nope -->x<!-- /results:nope -->", RESULTS)
    # Documentation quoting a marker in backticks is left alone.
    quoted = "`<!-- results:NAME -->` and `<!-- /results:NAME -->`"
    assert docs.render(quoted, RESULTS) == quoted


def _headline_numbers() -> set[str]:
    acc, im = RESULTS["accuracy"], RESULTS["imdb"]
    runs = [*acc["seeds"].values(), *acc["no_attention"].values(), acc["structured"]]
    runs += [acc["tfidf_logreg"], acc["tfidf_sublinear_logreg"], *im["seeds"].values()]
    runs.append(im["tfidf_word12_sublinear_logreg"])
    for row in RESULTS.get("finetune", {}).get("runs", {}).values():
        runs += [*row["seeds"].values()] if "seeds" in row else [row]
    runs += RESULTS.get("finetune", {}).get("imdb", {}).get("seeds", {}).values()
    return {f"{100 * r['test_accuracy']:.2f}" for r in runs}


def _docstrings() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
        for p in sorted((ROOT / "configs").glob("*.py"))
    }


def test_result_numbers_are_typed_nowhere_outside_a_region():
    numbers = _headline_numbers()
    texts = {page: docs.MARKER.sub("", _read(page)) for page in PAGES} | _docstrings()
    for name, text in texts.items():
        typed = sorted(n for n in numbers if re.search(rf"(?<![\d.]){re.escape(n)}(?!\d)", text))
        assert not typed, f"{name} types {typed}: reference a rendered region instead"


@pytest.mark.parametrize(
    "page,index,code", _blocks("python"), ids=lambda x: str(x) if isinstance(x, int) else None
)
def test_python_block_runs(page, index, code):
    exec(compile(code, f"{page}[{index}]", "exec"), {})


def _logical_lines(block: str) -> list[str]:
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _commands() -> list[tuple[str, str, list[str]]]:
    """(page, program, args) for every `python -m X ...` and `make ...` in the sh blocks."""
    out = []
    for page, _, block in _blocks("sh"):
        for line in _logical_lines(block):
            line = line.split(" #")[0].replace('"', " ").replace("'", " ")
            words = line.split()
            for i, w in enumerate(words):
                if re.fullmatch(r"(\S*/)?python3?", w) and words[i + 1 : i + 2] == ["-m"]:
                    args = []
                    for a in words[i + 3 :]:
                        if a in (";", "&&", "|", "&") or a.startswith(">") or a.endswith(";"):
                            break
                        args.append(a)
                    out.append((page, words[i + 2], args))
                elif w == "make" and (i == 0 or "=" in words[i - 1]):
                    out.append((page, "make", [a for a in words[i + 1 :] if "=" not in a]))
    return out


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    variables = dict(re.findall(r"^(\w+)\s*[:?]?=\s*(\S+)", text, flags=re.M))

    def expand(s: str) -> str:
        return re.sub(r"\$\((\w+)\)", lambda m: expand(variables[m.group(1)]), s)

    return {expand(t) for t in re.findall(r"^([\w.$()/-]+):", text, flags=re.M)}


def _check_config_fields(args: list[str]) -> None:
    spec = next(a.split("=", 1)[1] for a in args if a.startswith("--config="))
    config = cli.load_config_file(str(ROOT / spec))
    for a in args:
        if a.startswith("--config."):
            node = config
            for part in a[len("--config.") :].split("=")[0].split("."):
                assert part in node, f"{spec} has no field {a.split('=')[0]}"
                node = node[part]


def test_commands_name_what_exists():
    commands = _commands()
    assert {"make", "experiments.train", "experiments.predict", "benchmarks"} <= {
        c[1] for c in commands
    }
    targets = _make_targets()
    for page, program, args in commands:
        where = f"{page}: {program} {' '.join(args)}"
        if program == "make":
            assert args and all(a in targets for a in args), where
            continue
        module = importlib.import_module(program)
        if program == "benchmarks":
            module = importlib.import_module("benchmarks.__main__")
        if not hasattr(module, "define_flags"):  # a plain script with its own argv handling
            assert hasattr(module, "main"), where
            continue
        fv = flags.FlagValues()
        module.define_flags(fv)
        for a in args:
            if not a.startswith("--") or a.startswith("--config."):
                continue
            name = a[2:].split("=")[0]
            known = name in fv or (name.startswith("no") and name[2:] in fv)
            assert known, f"{where}: --{name} is not a flag of {program}"
        if any(a.startswith("--config.") for a in args):
            _check_config_fields(args)


def _marker_expression(command: str) -> str:
    """The `-m` expression of a pytest command line ("True" when it selects by no marker)."""
    words = shlex.split(command)
    words = words[words.index("pytest") + 1 :]
    return words[words.index("-m") + 1] if "-m" in words else "True"


def test_make_test_and_make_test_slow_split_the_suite_and_ci_runs_both():
    """As install.md says: whatever a test's markers, exactly one of `make test` and
    `make test-slow` runs it, and .ci/run runs both on the pinned stack; its Colab step leaves out
    the slow tests but the notebook's."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    fast, slow = (
        _marker_expression(re.search(rf"^{target}:.*\n\t(.*)", makefile, flags=re.M).group(1))
        for target in ("test", "test-slow")
    )
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    colab = _marker_expression(next(line for line in ci.splitlines() if " pytest " in line))
    markers = [
        m.split(":")[0]
        for m in tomllib.loads(_read("pyproject.toml"))["tool"]["pytest"]["ini_options"]["markers"]
    ]
    assert {"slow", "notebook"} <= set(markers)
    for values in itertools.product([False, True], repeat=len(markers)):
        marked = dict(zip(markers, values, strict=True))
        runs = [eval(e, {"__builtins__": {}}, marked) for e in (fast, slow, colab)]
        assert runs[0] != runs[1], f"{marked}: make test {runs[0]}, make test-slow {runs[1]}"
        assert runs[2] == (not marked["slow"] or marked["notebook"]), marked
    assert {"make test", "make test-slow"} <= set(ci.splitlines())


def test_shell_words_parse():
    for _, _, block in _blocks("sh"):
        for line in _logical_lines(block):
            shlex.split(line, comments=True)  # an unbalanced quote fails here


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # a '#' in code is no heading
    return {report.anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize(
    "page", [*PAGES, "benchmarks/REPORT.md", "benchmarks/analysis.md", "docs/results.md"]
)
def test_relative_links_resolve(page):
    base = (ROOT / page).parent
    for target in LINK.findall(_read(page)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (base / file).resolve() if file else ROOT / page
        assert path.exists(), f"{page}: {target} does not exist"
        assert path.is_relative_to(ROOT), f"{page}: {target} leaves the repository"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page}: no heading #{anchor} in {path.name}"


def test_finetune_verdict_names_each_seed_short_of_the_margin():
    """Met on the mean is not met on every seed: the verdict names the seeds below 5 points."""
    t = lambda gaps: {  # noqa: E731
        "finetuned_mean": 0.8 + sum(gaps) / len(gaps),
        "bar": 0.8,
        "met": sum(gaps) / len(gaps) >= 0.05,
        "finetuned_seeds": ["0", "1", "2"],
        "seed_gaps": gaps,
    }
    targets = {
        "attention_earns": t([0.07, 0.06, 0.08]),
        "beats_scratch_and_tfidf": t([0.049, 0.061, 0.045]),
    }
    said = docs.finetune_verdict({"finetune": {"targets": targets, "runs": {}}})
    assert "(target 5: met on the mean, every seed)" in said
    assert "(target 5: met on the mean; seed 0: 4.90, 2: 4.50)" in said


def test_readme_shows_fine_tuning_among_the_ways_in():
    readme = _read("README.md")
    ways = readme[readme.index("## ") : readme.index("## Results")]
    ways = ways[ways.index("ways in") :]
    commands = [args for page, program, args in _commands() if page == "README.md"]
    assert any("--config=configs/finetune.py" in args for args in commands)
    assert "configs/finetune.py" in ways and "--config.model.pretrained=" in ways


def test_library_has_text_to_ids_for_a_pretrained_encoder():
    blocks = [code for page, _, code in _blocks("python") if page == "docs/library.md"]
    assert any(
        "attn.encoders.load(" in code and "attn.encoders.encode(" in code and "tokenizers" in code
        for code in blocks
    )


_CALL = re.compile(r"`((?:attn\.)?[\w.]+)\(([^`()]*)\)")


def test_library_table_lists_every_parameter():
    """Each call the API table writes out names every parameter of the function it names (a bare
    name is in the module of the cell's previous dotted one), and the function exists."""
    import inspect

    import attn

    text = _read("docs/library.md")
    rows = [line for line in text.splitlines() if line.startswith("| `attn.")]
    assert rows
    missing = []
    for row in rows:
        cell = row.split(" | ")[0]
        module = None
        for name, args in _CALL.findall(cell):
            if name.startswith("attn."):
                *path, last = name.split(".")[1:]
                module = attn
                for part in path:
                    module = getattr(module, part, None)
                if module is None:
                    missing.append(f"{name}: no such module")
                    continue
            elif module is None or "." in name:
                continue
            else:
                last = name
            fn = getattr(module, last, None)
            if fn is None:
                missing.append(f"{name}: no such function")
                continue
            if inspect.isclass(fn):
                continue  # a dataclass's fields are elided as ...
            listed = {a.split("=")[0].strip(" *") for a in args.split(",")}
            params = inspect.signature(fn).parameters.values()
            absent = [
                p.name
                for p in params
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in listed
            ]
            if absent and "..." not in listed:
                missing.append(f"{name}: {absent}")
    assert not missing, "\n".join(missing)
