"""Shared fixtures: a persistent JAX compile cache, prepared embedded data, a trained workdir.

Every training run of `configs/default.py:tiny` compiles the same few programs; the persistent
cache (shared by xdist workers and by the CLI subprocesses, which inherit the environment) turns
each recompile into a disk read, so a tiny run costs a few seconds instead of ~20 s of CPU.
"""

import contextlib
import fcntl
import hashlib
import importlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
WALL_CLOCK = ("examples_per_sec", "input_wait_fraction")  # metrics that differ run to run

_CACHE = os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"attn-tests-jax-cache-{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def _known(flag: str) -> str:
    """`flag` where this jaxlib's XLA knows it and XLA_FLAGS does not have it yet, else "": an
    unknown flag in XLA_FLAGS aborts the process that starts the backend, so a child process
    tries it first. A known flag is tried once: the xdist workers and the CLI subprocesses
    inherit XLA_FLAGS with it; an unknown one is tried again by each worker."""
    if flag.split("=")[0] in os.environ.get("XLA_FLAGS", ""):
        return ""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flag}"}
    child = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True
    )
    return flag if child.returncode == 0 else ""


# What XLA:CPU is asked for changes how fast compiled code runs, and the order of some float32
# roundings (a few 1e-6 on the encoders' goldens), not what it computes: the golden values hold
# either way. The tests' programs are small and most run once, so compiling them fast matters
# more: LLVM's optimisation level 0 (about twice as fast), and XLA's older loop emitters for the
# fusions instead of its MLIR ones (CPU time of the classifier, head and importance modules
# 477 s -> 297 s; of every family's train-and-serve tests 328 s -> 215 s). Set before JAX starts
# its backend; subprocesses inherit it.
os.environ["XLA_FLAGS"] = " ".join(
    (
        os.environ.get("XLA_FLAGS", ""),
        "--xla_backend_optimization_level=0",
        _known("--xla_cpu_use_fusion_emitters=false"),
    )
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# Runs the real `experiments.train` command line (or ENTRY=pretrain's), but stops dead at one point
# so that the test can SIGKILL it there. PAUSE=step:N stops when the loop asks for the batch of
# step N (steps up to N-1 computed, their metrics logged up to step N-2: they are read one step
# late);
# PAUSE=save:<which>/<N> stops inside orbax's atomic save of that checkpoint, after its temporary
# directory is written and before the rename that would publish it. Without PAUSE it runs through.
TRAIN_DRIVER = textwrap.dedent(
    """
    import importlib, os, sys, time
    import jax
    from orbax.checkpoint._src.path import atomicity
    from experiments import cli
    from experiments.data import batching

    kind, _, where = os.environ.get("PAUSE", "none:").partition(":")

    def pause():
        open(os.environ["PAUSED_FILE"], "w").close()
        time.sleep(600)

    if kind == "step":
        real_stream, real_prefetch, first = batching.train_stream, batching.prefetch, []

        def train_stream(*args, start_step, **kw):
            first.append(start_step + 1)
            return real_stream(*args, start_step=start_step, **kw)

        def prefetch(stream):
            for step, batch in enumerate(real_prefetch(stream), first[-1]):
                if step == int(where):
                    # Steps dispatched earlier finish first: a kill in the middle of one of
                    # gloo's exchanges can abort a peer process instead of leaving it waiting.
                    for array in jax.live_arrays():
                        array.block_until_ready()
                    pause()
                yield batch

        batching.train_stream, batching.prefetch = train_stream, prefetch
    elif kind == "save":
        real_finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def finalize(self, *args, **kw):
            if str(self.get_final()).endswith(where):
                pause()
            return await real_finalize(self, *args, **kw)

        atomicity.AtomicRenameTemporaryPath.finalize = finalize
    entry = "experiments." + os.environ.get("ENTRY", "train")
    module = importlib.import_module(entry)
    sys.argv = [entry, *sys.argv[1:]]
    cli.main(module.define_flags, module.main)
    """
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first: with pytest-xdist one worker starts on them while the others take the
    rest, instead of the longest test starting last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """An xdist worker still busy 5 s after the run ended is sent SIGINT by execnet. Landing in
    jax's gc callback during pytest's last gc.collect(), it printed an "Exception ignored ...
    KeyboardInterrupt" traceback under a green run. The worker's results are reported by now,
    so it ends quietly instead."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        signal.signal(signal.SIGINT, lambda signum, frame: os._exit(0))


def enable_x64():
    """A `with` block that computes in float64 on every jax the project supports:
    `jax.enable_x64` from jax 0.8 on, `jax.experimental.enable_x64` before it."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64 as experimental_enable_x64

    return experimental_enable_x64(True)


def tiny_config(data_dir: str, **overrides) -> ml_collections.ConfigDict:
    """`configs/default.py:tiny` reading the prepared data; overrides as `section__field=value`."""
    from configs import default

    config = default.get_config("tiny")
    config.unlock()
    config.data.data_dir = data_dir
    for key, value in overrides.items():
        section, field = key.split("__")
        config[section][field] = value
    return config


def tiny_flags(data_dir: str) -> list[str]:
    """The command-line equivalent of `tiny_config(data_dir)`."""
    return ["--config=configs/default.py:tiny", f"--config.data.data_dir={data_dir}"]


def run(
    module: str,
    *args: str,
    stdin: bytes | None = None,
    env: dict | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Runs `python -m module args` from the repository root; output as text (bytes replaced)."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    return subprocess.CompletedProcess(
        proc.args,
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


def run_here(
    module: str, *args: str, capsys, stdin: bytes | None = None
) -> subprocess.CompletedProcess:
    """Runs entry point `module` in this process, through the same flag parsing and error handling
    as `python -m module args`; returns what `run` would. `capsys` is pytest's fixture."""
    from experiments import cli

    entry = importlib.import_module(module)
    capsys.readouterr()  # only this command's output
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8")
    try:
        status = cli.run(entry.define_flags, entry.main, [module, *args])
    finally:
        sys.stdin = saved
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([module, *args], status, out, err)


def make_aclimdb(root: Path, per_class: int = 12) -> dict[str, dict[str, list[str]]]:
    """A small folder laid out as Stanford's aclImdb_v1.tar.gz; returns {split: {label: texts}}."""
    words = {"neg": "dull awful boring", "pos": "great moving superb"}
    made: dict[str, dict[str, list[str]]] = {}
    for split in ("train", "test"):
        made[split] = {}
        for label, w in words.items():
            folder = root / split / label
            folder.mkdir(parents=True)
            made[split][label] = [f"{split} review {i}: {w} film" for i in range(per_class)]
            for i, text in enumerate(made[split][label]):
                (folder / f"{i}_{7 if label == 'pos' else 2}.txt").write_text(
                    text, encoding="utf-8"
                )
    (root / "train" / "unsup").mkdir()
    (root / "train" / "unsup" / "0_0.txt").write_text("unlabelled review", encoding="utf-8")
    (root / "train" / "urls_pos.txt").write_text("http://example.invalid\n", encoding="utf-8")
    return made


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Non-zero exit, no traceback, exactly one `error:` line on stderr (the last line)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def tree_hash(directory: str, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """{relative path: sha256} of every file and directory under `directory`."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if rel.split(os.sep)[0] in exclude:
                continue
            if os.path.isdir(path):
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


def metric_rows(workdir: str) -> list[dict]:
    """metrics.jsonl without the wall-clock fields."""
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


def saved_state(workdir: str, step: int, which: str = "checkpoints") -> dict:
    """The raw train state (params, optimizer state, step, rng) of one checkpoint, on this
    process's first device whatever devices saved it."""
    import orbax.checkpoint as ocp

    from experiments.training import checkpoints

    saved = ocp.StandardCheckpointer().metadata(os.path.join(workdir, which, str(step), "state"))
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), saved.item_metadata
    )
    with checkpoints.reader(workdir, which) as mngr:
        args = ocp.args.Composite(state=ocp.args.StandardRestore(target))
        return mngr.restore(step, args=args)["state"]


@contextlib.contextmanager
def ctrl_c_at_batch(monkeypatch: pytest.MonkeyPatch, step: int):
    """Within the block, training is stopped by Ctrl-C as it fetches batch `step` (1 is the
    first), as a user's would be; the input pipeline is whole again afterwards."""
    from experiments.data import batching

    real_prefetch = batching.prefetch

    def interrupted(stream):
        for i, batch in enumerate(real_prefetch(stream), 1):
            if i == step:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(batching, "prefetch", interrupted)
    try:
        yield
    finally:
        monkeypatch.setattr(batching, "prefetch", real_prefetch)


def train_interrupted(
    monkeypatch: pytest.MonkeyPatch, config: ml_collections.ConfigDict, workdir: str, step: int
) -> None:
    """`train_and_evaluate(config, workdir)` stopped by Ctrl-C as it fetches batch `step`
    (`ctrl_c_at_batch`)."""
    from experiments import train

    with ctrl_c_at_batch(monkeypatch, step), pytest.raises(KeyboardInterrupt):
        train.train_and_evaluate(config, workdir)


def assert_trees_equal(a, b) -> None:
    """Same structure, and every leaf bitwise equal."""
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


EPS32 = float(np.finfo(np.float32).eps)  # 2**-23: float32's rounding step, relative to 1


def tol32(terms: int, scale: float = 1.0) -> float:
    """The absolute tolerance between two float32 computations of one value that round
    differently (sums in another order or in blocks, ops fused or split, vmap or jit, a float64
    reference). A sum of n terms carries a relative error of at most about n eps (Higham's
    gamma_n: n u, u = eps / 2), so a value computed through sums of `terms` terms in all (a score
    over D features, then a softmax and a weighted sum over L keys: D + 2 L; a gradient counts its
    backward's sums too) whose inputs and partial sums are at most `scale` in magnitude differs by
    at most about terms * eps * scale; a factor 4 covers both sides, exp and divisions."""
    return 4 * terms * EPS32 * scale


def assert_close32(got, want, terms: int, scale: float | None = None) -> None:
    """`got` equals `want` within `tol32(terms, scale)`; scale defaults to the largest of 1 and
    |want| (a value's error is relative to the partial sums it came from, which are at least
    about 1 here: unit-normal inputs, weights summing to 1)."""
    want = np.asarray(want, np.float64)
    if scale is None:
        scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=tol32(terms, scale), rtol=0)


def classifier_terms(cfg, length: int) -> int:
    """The sums a logit of attn's own classifier (`attn.classifier.ModelConfig` cfg) passes
    through, for `tol32`. Per (pre-LayerNorm) layer: two LayerNorms (a mean and a variance over
    d_model each), the q/k/v, output and first feed-forward projections over d_model, a score over
    a head's features (mlp's, the longest: 4 of them), a softmax and a weighted sum over the
    `length` tokens, the second feed-forward projection over d_ff. Then the final LayerNorm, the
    pooling (structured's: a hidden layer over d_model, a score over pool_hidden, a softmax and a
    weighted sum over the tokens; the others' fewer) and the head over d_model."""
    d, dh = cfg.d_model, cfg.d_model // cfg.num_heads
    layer = 7 * d + 4 * dh + 2 * length + cfg.d_ff
    return cfg.num_layers * layer + 2 * d + (d + cfg.pool_hidden + 2 * length) + d


def encoder_terms(enc, length: int) -> int:
    """The same for a classifier over a pretrained (post-LayerNorm) encoder (`enc`: its encoder
    config): the embeddings' LayerNorm; per layer the q/k/v, output and first feed-forward
    projections and two LayerNorms over d_model, a score over a head's features, a softmax and a
    weighted sum over the tokens, the feed-forward's output over its width; then the pooling (a
    mean over the tokens, or the pooler's projection over d_model) and the head over d_model."""
    d, dh = enc.d_model, enc.d_model // enc.num_heads
    return 2 * d + enc.num_layers * (7 * d + dh + 2 * length + enc.d_ff) + (length + d) + d


def _built_once(tmp_path_factory, name: str, build: Callable[[str], object]) -> str:
    """The directory `name`, filled by `build(path)` once per test session: pytest-xdist workers
    share it (the first to take the lock builds it; the others wait, then reuse it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, above each worker's own
    path, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(str(path))
            done.touch()
    return str(path)


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory) -> str:
    """A TFDS data_dir with chinese_reviews prepared (a few seconds, once per session)."""
    from experiments.data import datasets

    def prepare(path: str) -> None:
        datasets.load_splits(tiny_config(path).data, ("test",))

    return _built_once(tmp_path_factory, "tfds", prepare)


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tfds_dir) -> str:
    """A workdir after an uninterrupted in-process run of configs/default.py:tiny (6 steps).

    Read-only for tests: copy it (`trained_copy`) before anything that may write.
    """
    from experiments import train

    def run_tiny(workdir: str) -> None:
        train.train_and_evaluate(tiny_config(tfds_dir), workdir)

    return _built_once(tmp_path_factory, "trained", run_tiny)


PRETRAIN_STEPS = 6  # of the `pretrained` fixture's run


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory, tfds_dir) -> str:
    """A workdir after an uninterrupted in-process pretraining of configs/default.py:tiny (6
    steps of masked tokens). Read-only for tests."""
    from experiments.training import pipeline

    def run_tiny(workdir: str) -> None:
        pipeline.pretrain(tiny_config(tfds_dir, pretrain__max_steps=PRETRAIN_STEPS), workdir)

    return _built_once(tmp_path_factory, "pretrained", run_tiny)


_EIGHT_DEVICES = textwrap.dedent(
    """
    import sys
    import jax
    from conftest import tiny_config
    from experiments import train
    assert jax.device_count() == 8, jax.devices()
    train.train_and_evaluate(tiny_config(sys.argv[1]), sys.argv[2])
    """
)


@pytest.fixture(scope="session")
def eight_devices(tmp_path_factory, tfds_dir) -> str:
    """The workdir of `trained`'s run, on 8 devices of one process."""

    def run_tiny(workdir: str) -> None:
        env = {
            **os.environ,
            "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count=8",
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
        }
        proc = subprocess.run(
            [sys.executable, "-c", _EIGHT_DEVICES, tfds_dir, workdir],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]

    return _built_once(tmp_path_factory, "eight_devices", run_tiny)


# The key bias shifts every score of a query alike, which the softmax ignores: its gradient is
# rounding noise, which Adam scales up to steps of the learning rate in any device layout.
_NOISE_ONLY = "['params']['layer_0']['mha']['k']['b']"


def assert_same_training(workdir: str, reference: str) -> None:
    """The same run on another device layout: logged losses within 1e-5, accuracies within 1e-6,
    every checkpointed parameter and optimizer entry within 1e-5, the same test results.

    These margins are not a float32 bound (`tol32`): the layouts sum the batch in another order,
    and Adam divides each gradient by its own size, so how far that rounding moves a parameter
    depends on how small its gradient is, up to the learning rate per step (the key bias above,
    left out). 1e-5 is a margin the other entries keep in the layouts tested, not a bound."""
    rows, ref_rows = metric_rows(workdir), metric_rows(reference)
    assert [(r["step"], r["split"]) for r in rows] == [(r["step"], r["split"]) for r in ref_rows]
    for r, r1 in zip(rows, ref_rows, strict=True):
        assert r["loss"] == pytest.approx(r1["loss"], abs=1e-5), (r, r1)
        assert r["accuracy"] == pytest.approx(r1["accuracy"], abs=1e-6)
    for step in (3, 6):
        leaves = jax.tree_util.tree_leaves_with_path(saved_state(workdir, step))
        ref_leaves = jax.tree_util.tree_leaves_with_path(saved_state(reference, step))
        assert [p for p, _ in leaves] == [p for p, _ in ref_leaves]
        for (path, a), (_, b) in zip(leaves, ref_leaves, strict=True):
            name = jax.tree_util.keystr(path)
            if name != _NOISE_ONLY:
                np.testing.assert_allclose(
                    np.asarray(a), np.asarray(b), rtol=0, atol=1e-5, err_msg=name
                )
    results = []
    for w in (workdir, reference):
        with open(os.path.join(w, "eval_test.json"), encoding="utf-8") as f:
            results.append(json.load(f))
    assert results[0]["num_examples"] == results[1]["num_examples"]
    assert results[0]["confusion"] == results[1]["confusion"]  # every example counted once
    assert results[0]["step"] == results[1]["step"]


@pytest.fixture
def trained_copy(trained, tmp_path) -> str:
    workdir = str(tmp_path / "copy")
    shutil.copytree(trained, workdir)
    return workdir
