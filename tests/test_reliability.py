"""Exact resume after SIGKILL, safe checkpoints, non-finite guard, bad input, devices."""

import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import (
    ROOT,
    TRAIN_DRIVER,
    assert_one_line_error,
    assert_trees_equal,
    metric_rows,
    run,
    run_here,
    saved_state,
    tiny_config,
    tiny_flags,
    tree_hash,
)

from experiments.errors import UserError
from experiments.training import checkpoints


def _signal_when(ready, sig: int, driver: str, argv: list[str], env: dict, log, waiting_for: str):
    """Runs `python -c driver argv` (stderr to `log`), sends `sig` once `ready()` holds and waits
    for the process to end. Dying first, or not being ready within 300 s, fails the test."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", driver, *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 300
            while not ready():
                assert proc.poll() is None, log.read_text("utf-8", "replace")[-3000:]
                assert time.monotonic() < deadline, (
                    f"never reached {waiting_for}: " + (log.read_text("utf-8", "replace")[-3000:])
                )
                time.sleep(0.05)
            proc.send_signal(sig)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return proc


def _train_killed_at(pause: str, argv: list[str], tmp_path) -> str:
    """Starts training, waits until it reaches `pause`, SIGKILLs it; returns its stderr."""
    paused = tmp_path / f"paused-{pause.replace('/', '-').replace(':', '-')}"
    log = tmp_path / f"{paused.name}.log"
    env = {**os.environ, "PAUSE": pause, "PAUSED_FILE": str(paused)}
    proc = _signal_when(paused.exists, signal.SIGKILL, TRAIN_DRIVER, argv, env, log, pause)
    assert proc.returncode == -signal.SIGKILL
    return log.read_text("utf-8", "replace")


# The real `experiments.train` command line without the persistent compile cache, so that every
# run compiles; it creates COMPILING_FILE when XLA starts compiling the train step.
_COMPILE_DRIVER = textwrap.dedent(
    """
    import os, sys
    import jax
    from jax._src import compiler
    from experiments import cli, train

    jax.config.update("jax_enable_compilation_cache", False)
    real_compile = compiler.backend_compile_and_load

    def backend_compile_and_load(backend, module, *args, **kw):
        if "train_step" in str(module.operation.attributes["sym_name"]):
            open(os.environ["COMPILING_FILE"], "w").close()
        return real_compile(backend, module, *args, **kw)

    compiler.backend_compile_and_load = backend_compile_and_load
    sys.argv = ["experiments.train", *sys.argv[1:]]
    cli.main(train.define_flags, train.main)
    """
)


@pytest.mark.slow
def test_ctrl_c_after_a_checkpoint_and_during_a_resumed_compile(tfds_dir, tmp_path):
    """Ctrl-C, then Ctrl-C again while the rerun compiles its train step (XLA keeps compiling in a
    thread of its own): both exit 130, naming the last checkpoint and how to resume."""
    workdir = str(tmp_path / "run")
    argv = [*tiny_flags(tfds_dir), f"--workdir={workdir}", "--config.train.max_steps=100000"]
    compiling = tmp_path / "compiling"
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["COMPILING_FILE"] = str(compiling)
    for attempt, ready in enumerate(
        (lambda: checkpoints.latest_step(workdir, checkpoints.LAST), compiling.exists)
    ):
        err = tmp_path / f"attempt{attempt}.log"
        compiling.unlink(missing_ok=True)
        what = "a checkpoint" if attempt == 0 else "the train step's compile"
        proc = _signal_when(ready, signal.SIGINT, _COMPILE_DRIVER, argv, env, err, what)
        stderr = err.read_text("utf-8", "replace")
        assert proc.returncode == 130, stderr[-3000:]
        assert ("resuming from step" in stderr) == (attempt == 1)
        step = checkpoints.latest_step(workdir, checkpoints.LAST)
        last = stderr.strip().splitlines()[-1]
        assert last == (
            f"interrupted; the last complete checkpoint is step {step} in "
            f"{os.path.join(workdir, 'checkpoints')}; rerun the same command to resume from it"
        ), stderr[-3000:]


def _tmp_dirs(workdir: str, which: str) -> list[str]:
    return [n for n in os.listdir(os.path.join(workdir, which)) if "tmp" in n]


@pytest.mark.slow
def test_sigkill_anywhere_then_restart_is_bitwise_identical(request, tfds_dir, tmp_path):
    """Killed while saving a best and a last checkpoint, and between checkpoints; 4 restarts."""
    workdir = str(tmp_path / "run")
    argv = [*tiny_flags(tfds_dir), f"--workdir={workdir}"]

    _train_killed_at("save:best/3", argv, tmp_path)
    assert _tmp_dirs(workdir, "best") and not os.path.exists(f"{workdir}/best/3")

    err = _train_killed_at("save:checkpoints/3", argv, tmp_path)
    assert "resuming" not in err  # a half-written checkpoint is not a checkpoint: starts over
    assert os.path.exists(f"{workdir}/best/3") and _tmp_dirs(workdir, "checkpoints")
    assert checkpoints.latest_step(workdir, checkpoints.LAST) is None

    err = _train_killed_at("step:6", argv, tmp_path)
    assert "resuming" not in err  # redoes best/3, which the killed run had completed
    assert max(r["step"] for r in metric_rows(workdir)) == 4

    err = _train_killed_at("save:checkpoints/6", argv, tmp_path)
    assert "resuming from step 3 of 6" in err
    assert _tmp_dirs(workdir, "checkpoints")

    proc = run("experiments.train", *argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from step 3 of 6" in proc.stderr and "test accuracy" in proc.stdout

    assert not _tmp_dirs(workdir, "checkpoints") and not _tmp_dirs(workdir, "best")
    trained = request.getfixturevalue("trained")  # only now: another worker may be building it
    assert metric_rows(workdir) == metric_rows(trained)
    for step in (3, 6):
        assert_trees_equal(saved_state(workdir, step), saved_state(trained, step))
    (best,) = os.listdir(os.path.join(trained, "best"))
    assert os.listdir(os.path.join(workdir, "best")) == [best]
    assert_trees_equal(
        saved_state(workdir, int(best), "best"), saved_state(trained, int(best), "best")
    )
    results = []
    for w in (workdir, trained):
        with open(os.path.join(w, "eval_test.json"), encoding="utf-8") as f:
            results.append({k: v for k, v in json.load(f).items() if k != "examples_per_sec"})
    assert results[0] == results[1]


def test_nonfinite_steps_are_skipped_then_training_stops(tfds_dir, tmp_path, capsys):
    workdir = str(tmp_path / "run")
    proc = run_here(
        "experiments.train",
        *tiny_flags(tfds_dir),
        f"--workdir={workdir}",
        "--config.optim.learning_rate=1e30",
        "--config.optim.max_nonfinite=3",
        "--config.train.max_steps=12",
        capsys=capsys,
    )
    assert_one_line_error(
        proc,
        "3 consecutive steps had non-finite",
        "learning_rate",
        "last good checkpoint is step 3",
    )
    assert "skipped=1" in proc.stderr and "skipped=2" in proc.stderr  # the progress bar
    rows = [r for r in metric_rows(workdir) if r["split"] == "train"]
    # Warmup starts at 0, so step 1 is sane; step 2's huge update makes every later loss NaN.
    assert [r["skipped_steps"] for r in rows] == [0, 0, 1, 2]
    assert all(math.isnan(r["loss"]) and math.isnan(r["grad_norm"]) for r in rows[2:])
    assert all(np.isfinite(r["loss"]) for r in rows[:2])
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3"]
    state = saved_state(workdir, 3)
    assert int(state["step"]) == 3
    # The skipped steps left the parameters as step 2 made them: finite.
    assert all(np.isfinite(np.asarray(x)).all() for x in __import__("jax").tree.leaves(state))


# ---------------------------------------------------------------------------------------------
# Unwritable workdirs: refused before any data is read or anything compiled.


def _under_a_file(tmp_path) -> str:
    (tmp_path / "file").write_text("x")
    return str(tmp_path / "file" / "run")


def _make_read_only(path: str) -> None:
    if os.geteuid() != 0:
        os.chmod(path, 0o555)
        return
    # root ignores permission bits; the immutable attribute binds root too (ext4, xfs, btrfs).
    done = subprocess.run(["chattr", "+i", path], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"running as root and chattr +i is not permitted here: {done.stderr!r}")


def _read_only(tmp_path) -> str:
    path = tmp_path / "ro"
    path.mkdir()
    _make_read_only(str(path))
    return str(path)


def _full_disk(tmp_path) -> str:
    path = tmp_path / "full"
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {done.stderr!r}")
    fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill it up for real
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return str(path)


def _release(path: str) -> None:
    subprocess.run(["chattr", "-i", path], capture_output=True)
    subprocess.run(["umount", path], capture_output=True)


@pytest.mark.parametrize(
    "make, fragment",
    [
        (_under_a_file, "Not a directory"),
        (_read_only, "not writable"),
        (_full_disk, "No space left"),
    ],
    ids=["under a file", "read-only", "full disk"],
)
def test_unwritable_workdir_is_refused_before_training(
    make, fragment, tfds_dir, tmp_path, monkeypatch
):
    from experiments import train
    from experiments.data import datasets

    def no_data(*args):
        raise AssertionError("data was loaded before the workdir was checked")

    monkeypatch.setattr(datasets, "load_splits", no_data)
    workdir = make(tmp_path)
    try:
        with pytest.raises(UserError, match=fragment) as e:
            train.train_and_evaluate(tiny_config(tfds_dir), workdir)
        assert workdir in str(e.value) and "\n" not in str(e.value)
    finally:
        _release(workdir)


@pytest.mark.parametrize(
    "argv", [["experiments.evaluate"], ["experiments.visualize", "很好"]], ids=lambda a: a[0]
)
def test_commands_that_write_into_a_read_only_workdir(argv, trained, tmp_path, capsys):
    import shutil

    workdir = str(tmp_path / "ro")
    shutil.copytree(trained, workdir)
    _make_read_only(workdir)
    before = tree_hash(workdir)
    try:
        proc = run_here(argv[0], f"--workdir={workdir}", *argv[1:], capsys=capsys)
    finally:
        _release(workdir)
    assert_one_line_error(proc, workdir)
    assert tree_hash(workdir) == before


# ---------------------------------------------------------------------------------------------
# Bad input: a correct answer or a one-line UserError, and the workdir left exactly as it was.

ANSWER = None  # expected outcome: an answer, not an error
NO_KNOWN = "no known tokens"  # expected outcome: label unknown, no probability
MB_LINE = "好" * 350_000  # 1.05 MB of UTF-8

# name -> (text, None for an answer, NO_KNOWN, or a fragment of the error message)
TEXTS = {
    "empty": ("", "empty"),
    "whitespace only": (" \t\u3000 ", "empty"),
    "only unknown characters": ("𓀀𓀁𓀂", NO_KNOWN),
    "emoji": ("🤮🤮🤮🤮", NO_KNOWN),
    "nul bytes only": ("\x00\x00", NO_KNOWN),
    "another script, words apart": ("привет мир", NO_KNOWN),  # only the space is known
    "invalid utf-8": (b"\xff\xfe\xb0".decode("utf-8", "surrogateescape"), "UTF-8"),
    "nul bytes": ("好\x00看\x00", ANSWER),
    "1 MB line": (MB_LINE, ANSWER),
    "another script": ("This film was wonderful", ANSWER),
}


@pytest.fixture(scope="module")
def loaded(trained):
    from experiments import serving

    return serving.load(trained)


@pytest.mark.parametrize("case", TEXTS)
def test_predict_bad_text(case, loaded, trained):
    from experiments import predict

    text, error = TEXTS[case]
    before = tree_hash(trained)
    if error == NO_KNOWN:  # no confident answer about a text the model cannot read
        p = predict.predict_one(loaded, text, top=5)
        assert p["label"] is None and p["probability"] is None and p["known_tokens"] == 0
        assert NO_KNOWN in p["note"] and p["num_tokens"] >= 1
    elif error:
        with pytest.raises(UserError, match=error) as e:
            predict.predict_one(loaded, text, top=5)
        assert "\n" not in str(e.value)
    else:
        p = predict.predict_one(loaded, text, top=5)
        assert p["label"] in loaded.label_names and 0.5 <= p["probability"] <= 1.0
        assert 1 <= p["known_tokens"] <= p["num_tokens"] <= loaded.cfg.max_len
        assert len(p["top_tokens"]) <= 5
        assert all(np.isfinite(w) for _, w in p["top_tokens"])
    assert tree_hash(trained) == before


def test_predict_command_bad_lines_on_stdin(trained, capsys):
    """All cases at once through stdin, with trailing blank lines: one output line per input line
    in text and in JSON, one error line on stderr per bad text, and the checkpoint named."""
    from experiments import predict

    lines = [t.encode("utf-8", "surrogateescape") for t, _ in TEXTS.values()]
    before = tree_hash(trained)
    stdin = b"\n".join(lines) + b"\n\n \n"
    bad = [n for n, (_, error) in enumerate(TEXTS.values(), 1) if error not in (ANSWER, NO_KNOWN)]
    for as_json in (False, True):
        argv = [f"--workdir={trained}", *(["--json"] if as_json else [])]
        proc = run_here("experiments.predict", *argv, stdin=stdin, capsys=capsys)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        source, *errors = proc.stderr.strip().splitlines()
        assert source.startswith("answering from the best checkpoint (step "), source
        notes = [line for line in errors if line.startswith("note: ")]
        cut = list(TEXTS).index("1 MB line") + 1
        latin = list(TEXTS).index("another script") + 1  # the model read Chinese
        assert len(notes) == 2 and notes[0] == (
            f"note: text {cut}: read only the first 64 of {len(MB_LINE)} tokens; the model "
            "reads no more: its learned positions end at 64"
        )
        assert re.fullmatch(
            rf"note: text {latin}: written in Latin letters, which were \d+\.\d% of the letters "
            r"the model was trained on \(mostly CJK\), so it knows little of such text",
            notes[1],
        ), notes[1]
        errors = [line for line in errors if line not in notes]
        assert len(errors) == len(bad)
        for line, n in zip(errors, bad, strict=True):
            assert line.startswith(f"error: text {n}: "), line
        answers = proc.stdout.strip("\n").split("\n")
        if not as_json:
            assert answers.pop(0) == predict.HEADER
        assert len(answers) == len(TEXTS)  # lined up with the input
        for answer, (_, error) in zip(answers, TEXTS.values(), strict=True):
            if as_json:
                p = json.loads(answer)
                label = "error" if "error" in p else p["label"] or "unknown"
            else:
                label, _, why = answer.split("\t")
            expected = {ANSWER: ("neg", "pos"), NO_KNOWN: ("unknown",)}.get(error, ("error",))
            assert label in expected, (answer, error)
            if label == "error":
                assert error in (p["error"] if as_json else why)
    assert tree_hash(trained) == before


def test_predict_trailing_blank_line_and_half_trained_workdir(trained_copy, capsys):
    """A blank last line of stdin is no text; a workdir whose training has not finished says so."""
    os.remove(os.path.join(trained_copy, "eval_test.json"))
    proc = run_here(
        "experiments.predict", f"--workdir={trained_copy}", stdin=b"\xe5\xa5\xbd\n\n", capsys=capsys
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 2  # header and one answer
    assert "training has not finished (last checkpoint: step 6)" in proc.stderr


@pytest.fixture(scope="module")
def vis_workdir(trained, tmp_path_factory) -> str:
    """visualize rewrites curves.png in its workdir: give it its own copy."""
    import shutil

    workdir = str(tmp_path_factory.mktemp("vis") / "run")
    shutil.copytree(trained, workdir)
    return workdir


@pytest.mark.parametrize("case", TEXTS)
def test_visualize_bad_text(case, vis_workdir, tmp_path):
    from experiments import visualize

    text, error = TEXTS[case]
    out = str(tmp_path / "out")
    before = tree_hash(vis_workdir, exclude=("curves.png",))
    if error not in (ANSWER, NO_KNOWN):  # visualize draws the maps of any readable text
        with pytest.raises(UserError, match=f"text 2: .*{error}") as e:
            visualize.visualize(vis_workdir, ["很好", text], out)
        assert "\n" not in str(e.value) and not os.path.exists(out)
    else:
        written = visualize.visualize(vis_workdir, [text], out)
        assert sorted(os.listdir(out)) == [
            "attention.html",
            "text1_layer0_head0.png",
            "text1_layer0_head1.png",
        ]
        assert len(written) == 4
    assert tree_hash(vis_workdir, exclude=("curves.png",)) == before


# Data files: name -> (write(dir) -> path, None for an answer or a fragment of the error).
def _write(name: str, data: bytes):
    def make(d) -> str:
        (d / name).write_bytes(data)
        return str(d / name)

    return make


def _rows(n: int, sep: str = "\n", labels=("neg", "pos")) -> str:
    return sep.join(
        f"评论{i}号 写得{'好' if i % 2 else '差'},{labels[i % len(labels)]}" for i in range(n)
    )


def _mixed_endings(d) -> str:
    body = "".join(
        f"评论{i}号,{('neg', 'pos')[i % 2]}" + ("\r\n", "\n", "\r")[i % 3] for i in range(60)
    )
    (d / "mixed.csv").write_text("text,label\r\n" + body, encoding="utf-8")
    return str(d / "mixed.csv")


def _empty_folder(d) -> str:
    (d / "folder").mkdir()
    return str(d / "folder")


FILES = {
    "missing columns": (_write("a.csv", "text,stars\n很好,5\n".encode()), "label"),
    "header only": (_write("b.csv", b"text,label\n"), "no data rows"),
    "mixed line endings": (_mixed_endings, ANSWER),
    "label outside the label set": (
        _write("c.csv", ("text,label\n" + _rows(60, labels=("neg", "pos", "meh"))).encode()),
        "meh",
    ),
    "empty folder": (_empty_folder, "folder"),
    "missing file": (lambda d: str(d / "nope.csv"), "does not exist"),
    "binary file": (_write("d.csv", bytes(range(256)) * 64), "binary"),
    "empty file": (_write("e.csv", b""), "empty"),
}


def _file_config(path: str):
    import ml_collections

    from configs import default

    data = default.get_config("tiny").data.to_dict()
    data.update(dataset="file", path=path, label_names=("neg", "pos"))
    return ml_collections.ConfigDict(data)


@pytest.mark.parametrize("case", FILES)
def test_data_loader_bad_file(case, tmp_path):
    from experiments.data import datasets

    make, error = FILES[case]
    path = make(tmp_path)
    before = tree_hash(str(tmp_path))
    if error:
        with pytest.raises(UserError, match=error) as e:
            datasets.load_splits(_file_config(path), ("train",))
        assert "\n" not in str(e.value)
    else:
        texts, labels, names = datasets.load_splits(_file_config(path), ("train",))["train"]
        assert names == ("neg", "pos") and len(texts) == len(labels) > 30
        assert all("\r" not in t and "\n" not in t for t in texts)
    assert tree_hash(str(tmp_path)) == before


# Evaluate: broken workdirs, and the data its config points at.
def _set_data(path_of):
    def make(workdir: str, d) -> None:
        with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        config["data"].update(dataset="file", path=path_of(d))
        with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)

    return make


def _corrupt(rel: str, data: bytes):
    def make(workdir: str, d) -> None:
        with open(os.path.join(workdir, rel), "wb") as f:
            f.write(data)

    return make


def _truncate_checkpoint(workdir: str, d) -> None:
    (step,) = os.listdir(os.path.join(workdir, "best"))
    root = os.path.join(workdir, "best", step, "state")
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "r+b") as f:
                f.truncate(os.path.getsize(f.name) // 2)


EVAL_CASES = {
    "binary config.json": (_corrupt("config.json", bytes(range(256))), "config.json"),
    "no vocabulary": (lambda w, d: os.remove(os.path.join(w, "vocab.txt")), "vocab"),
    "truncated checkpoint": (_truncate_checkpoint, "checkpoint"),
    **{f"data: {k}": (_set_data(make), error) for k, (make, error) in FILES.items()},
}


@pytest.mark.parametrize("case", EVAL_CASES)
def test_evaluate_bad_workdir_or_data(case, trained_copy, tmp_path):
    from experiments import evaluate

    make, error = EVAL_CASES[case]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    make(trained_copy, data_dir)
    before = tree_hash(trained_copy)
    if error:
        with pytest.raises(UserError, match=error) as e:
            evaluate.evaluate_workdir(trained_copy, "train")
        assert "\n" not in str(e.value)
        assert tree_hash(trained_copy) == before
    else:
        result = evaluate.evaluate_workdir(trained_copy, "train")
        assert result["num_examples"] > 30 and 0 <= result["accuracy"] <= 1
        after = tree_hash(trained_copy)
        assert after.pop("evaluate_train.json") and after == before  # the one file evaluate writes


# ---------------------------------------------------------------------------------------------
# Multi-device: a batch that does not split over the devices is refused before any work.


def test_batch_not_divisible_by_eight_devices(tfds_dir, tmp_path, capsys, monkeypatch):
    from experiments import parallel

    monkeypatch.setattr(parallel.jax, "device_count", lambda: 8)  # checked before any use
    workdir = str(tmp_path / "run")
    proc = run_here(
        "experiments.train",
        *tiny_flags(tfds_dir),
        f"--workdir={workdir}",
        "--config.data.batch_size=12",
        capsys=capsys,
    )
    assert_one_line_error(proc, "config.data.batch_size=12", "8 devices", "multiple of 8")
    assert not os.path.exists(workdir)  # nothing was done, and the workdir it made is gone
