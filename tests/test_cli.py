"""The commands evaluate, predict and visualize, and one-line errors for user mistakes: checked in
this process through the same flag parsing and error handling, with `predict` and a refused
resume also run as real processes."""

import csv
import dataclasses
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import (
    ROOT,
    assert_one_line_error,
    classifier_terms,
    run,
    run_here,
    tiny_flags,
    tol32,
    tree_hash,
)

from experiments import cli, evaluate, predict, serving, workdirs
from experiments.data import datasets, scripts
from experiments.explain import maps


def test_evaluate_predict_visualize_commands(trained_copy, capsys):
    training_result = os.path.join(trained_copy, "eval_test.json")
    with open(training_result, "rb") as f:
        written_by_training = f.read()
    for checkpoint, name in (
        ("best", "evaluate_test.json"),
        ("checkpoints", "evaluate_test_last.json"),
    ):
        argv = [f"--workdir={trained_copy}", "--split=test", f"--checkpoint={checkpoint}"]
        proc = run_here("experiments.evaluate", *argv, capsys=capsys)
        assert proc.returncode == 0, proc.stderr
        with open(os.path.join(trained_copy, name), encoding="utf-8") as f:
            result = json.load(f)
        assert {"accuracy", "macro_f1", "loss", "confusion", "num_examples"} <= set(result)
        assert result["num_examples"] == 1726 and result["label_names"] == ["neg", "pos"]
        assert f"{result['accuracy']:.4f}" in proc.stdout and "confusion" in proc.stdout
        assert f"written: {os.path.join(trained_copy, name)}" in proc.stdout
    # Training's own result stays as it wrote it, and the best checkpoint scores the same.
    with open(training_result, "rb") as f:
        assert f.read() == written_by_training
    training = json.loads(written_by_training)
    with open(os.path.join(trained_copy, "evaluate_test.json"), encoding="utf-8") as f:
        result = json.load(f)
    assert training["label_names"] == ["neg", "pos"]
    assert (training["accuracy"], training["confusion"]) == (
        result["accuracy"],
        result["confusion"],
    )

    # A real process: stdout, stderr and the exit status as a shell sees them.
    proc = run("experiments.predict", f"--workdir={trained_copy}", "--top=2", "很好看", "太差了")
    assert proc.returncode == 0, proc.stderr
    header, *lines = proc.stdout.strip().splitlines()
    assert header.startswith("label\tprobability\t") and len(lines) == 2
    for line, text in zip(lines, ("很好看", "太差了"), strict=True):
        label, prob, top = line.split("\t")
        assert label in ("neg", "pos") and 0.5 <= float(prob) <= 1.0
        tokens = [t.rsplit("(", 1)[0] for t in top.split(" ")]
        assert len(tokens) == 2 and set(tokens) <= set(text)

    out = os.path.join(trained_copy, "visualize")
    proc = run_here("experiments.visualize", f"--workdir={trained_copy}", "很好看", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    written = proc.stdout.split()
    assert sorted(os.listdir(out)) == [
        "attention.html",
        "text1_layer0_head0.png",
        "text1_layer0_head1.png",
    ]
    assert written == [
        os.path.join(out, "text1_layer0_head0.png"),
        os.path.join(out, "text1_layer0_head1.png"),
        os.path.join(out, "attention.html"),
        os.path.join(trained_copy, "curves.png"),
    ]


def test_evaluate_on_a_labelled_file_matches_the_split_it_holds(trained_copy, tmp_path, capsys):
    config = workdirs.read_config(os.path.join(trained_copy, "config.json"))
    texts, labels, names = datasets.load_splits(config.data, ("test",))["test"]
    path = tmp_path / "held.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(
            [("review", "label"), *((t, names[y]) for t, y in zip(texts, labels, strict=True))]
        )
    split = evaluate.evaluate_workdir(trained_copy, "test")
    argv = [f"--workdir={trained_copy}", f"--path={path}"]
    proc = run_here("experiments.evaluate", *argv, "--text_field=review", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(trained_copy, "evaluate_file_held.json"), encoding="utf-8") as f:
        got = json.load(f)
    # Every row, whatever split its hash gives it: the same texts score as the split does.
    assert got["num_examples"] == split["num_examples"] == len(texts)
    assert (got["accuracy"], got["confusion"]) == (split["accuracy"], split["confusion"])
    # The same texts in other batches: each loss within the model's float32 error, and their mean.
    loaded = serving.load(trained_copy)
    terms = classifier_terms(loaded.cfg, loaded.config.data.max_len) + len(texts)
    assert got["loss"] == pytest.approx(split["loss"], abs=tol32(terms, max(1, split["loss"])))
    assert got["path"] == str(path)
    assert f"{path} (every row)" in proc.stdout and "evaluate_file_held.json" in proc.stdout
    # The training run's column names by default; labels the model does not know are bad rows.
    # ... and the message names this command's flags, not the training config's fields.
    assert_one_line_error(
        run_here("experiments.evaluate", *argv, capsys=capsys),
        f"error: --path={str(path)!r}: no column 'text' (--text_field)",
    )
    path.write_text(
        "text,label\n" + "".join(f"{t},{y}\n" for t, y in zip("好差", "10", strict=True))
    )
    assert_one_line_error(
        run_here("experiments.evaluate", *argv, capsys=capsys), "--path=", "unknown label '1'"
    )


def test_a_text_in_a_script_the_model_hardly_saw_says_so(trained_copy):
    """The Chinese model answered English confidently; its vocabulary has Latin letters, so the
    "mostly unknown" note never fired. Training records its texts' scripts; an older workdir
    without the record skips the check."""
    assert scripts.script_shares(["好的 ok", "Да 1 😀"]) == {
        "letters": 6,
        "shares": {"CJK": 2 / 6, "LATIN": 2 / 6, "CYRILLIC": 2 / 6},
    }
    trained = serving.load(trained_copy)
    shares = trained.scripts["shares"]
    assert next(iter(shares)) == "CJK" and shares.get("LATIN", 0.0) < scripts.RARE_SCRIPT
    english = "This product is great, I love it"
    p = predict.predict_one(trained, english, top=3)
    assert p["label"] in ("neg", "pos")
    assert p["note"] == (
        f"written in Latin letters, which were {shares.get('LATIN', 0.0):.1%} of the letters the "
        "model was trained on (mostly CJK), so it knows little of such text"
    )
    assert "note" not in predict.predict_one(trained, "质量很好，很满意 great", top=3)  # mostly CJK
    os.remove(os.path.join(trained_copy, scripts.SCRIPTS_FILE))
    assert "note" not in predict.predict_one(serving.load(trained_copy), english, top=3)


def test_an_answer_that_reads_less_than_it_seems_says_so(trained_copy, capsys):
    """A text cut to max_len (64 here) and one mostly outside the vocabulary each get a note: in
    predict's JSON and on stderr, with stdout still one line per text, and in visualize."""
    trained = serving.load(trained_copy)
    half, mostly, long = "好看𓀀𓀀", "好𓀀𓀀𓀀", "好" * 300  # 𓀀 is outside the vocabulary
    assert "note" not in predict.predict_one(trained, half, top=3)  # half unknown: no note
    p = predict.predict_one(trained, mostly, top=3)
    assert p["label"] in ("neg", "pos") and p["known_tokens"] == 1
    assert [w for w, _ in p["top_tokens"]] == ["好"]  # never the unknown tokens
    assert p["note"] == (
        "mostly unknown: 3 of 4 tokens read are outside the vocabulary, so the answer rests on "
        "the other 1"
    )
    p = predict.predict_one(trained, long, top=3)
    assert (p["num_tokens"], p["text_tokens"]) == (64, 300)
    assert p["note"] == (
        "read only the first 64 of 300 tokens; the model reads no more: its learned positions "
        "end at 64"
    )

    stdin = "\n".join([half, mostly, long]).encode()
    for as_json in (False, True):
        argv = [f"--workdir={trained_copy}", *(["--json"] if as_json else [])]
        proc = run_here("experiments.predict", *argv, stdin=stdin, capsys=capsys)
        assert proc.returncode == 0, proc.stderr
        assert len(proc.stdout.strip().splitlines()) == 3 + (not as_json)
        notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
        assert notes == [
            "note: text 2: mostly unknown: 3 of 4 tokens read are outside the vocabulary, so the "
            "answer rests on the other 1",
            "note: text 3: read only the first 64 of 300 tokens; the model reads no more: its "
            "learned positions end at 64",
        ]
        if as_json:
            answers = [json.loads(line) for line in proc.stdout.splitlines()]
            assert ["note" in a for a in answers] == [False, True, True]

    proc = run_here("experiments.visualize", f"--workdir={trained_copy}", half, long, capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "note: text 2: read only the first 64 of 300 tokens"
    with open(os.path.join(trained_copy, "visualize", "attention.html"), encoding="utf-8") as f:
        assert "(read only the first 64 of 300 tokens)" in f.read()
    proc = run_here(
        "experiments.predict", f"--workdir={trained_copy}", "--max_len=65", long, capsys=capsys
    )
    assert_one_line_error(
        proc,
        "--max_len=65: the model reads at most 64 tokens (its learned positions end there; to "
        "read more, train with a longer data.max_len)",
    )


def test_a_cut_note_names_the_tail_and_what_the_bag_read(trained_copy):
    trained = serving.load(trained_copy)
    config = workdirs.read_config(os.path.join(trained_copy, "config.json"))
    config.data.tail_len, config.data.bag_len = 48, 256
    with_tail = dataclasses.replace(trained, config=config)
    ids = serving.encode(with_tail, "好" * 300)
    assert serving.reading(with_tail, "好" * 300, ids).notes == [
        "read only the first 16 and last 48 of 300 tokens"
    ]
    with_bag = dataclasses.replace(with_tail, cfg=dataclasses.replace(trained.cfg, bag_buckets=64))
    assert serving.reading(with_bag, "好" * 300, ids).notes == [
        "read only the first 16 and last 48 of 300 tokens (its bag: the first 64 and last 192)"
    ]
    assert serving.reading(with_bag, "好" * 200, ids).notes == [
        "read only the first 16 and last 48 of 200 tokens (its bag: all)"
    ]
    assert serving.reading(with_tail, "好" * 100, ids).notes == [
        "read the first 16 and last 48 of 100 tokens"  # more than half read: no "only"
    ]


def test_predict_line_shows_small_attention_shares():
    # Over a 512-token review every share is about 0.002; two decimals printed them all as 0.00.
    p = {"label": "pos", "probability": 0.9, "top_tokens": [["great", 0.0042], ["a", 0.31]]}
    assert predict.format_line(p) == "pos\t0.900\tgreat(0.0042) a(0.31)"


def _no_checkpoint(trained, tmp_path) -> str:
    workdir = tmp_path / "fresh"
    workdir.mkdir()
    shutil.copy(os.path.join(trained, "config.json"), workdir)
    return str(workdir)


def _empty(trained, tmp_path) -> str:
    (tmp_path / "empty").mkdir()
    return str(tmp_path / "empty")


# (command line with {w} = a workdir made by `make`, {t} = the TFDS data_dir; message fragments)
CASES = {
    "missing workdir": (
        None,
        ["experiments.evaluate", "--workdir={w}"],
        ["does not exist", "train first"],
    ),
    "predict without workdir flag": (None, ["experiments.predict", "很好"], ["--workdir"]),
    "not a workdir": (_empty, ["experiments.predict", "--workdir={w}", "很好"], ["config.json"]),
    "no checkpoint": (_no_checkpoint, ["experiments.evaluate", "--workdir={w}"], ["no checkpoint"]),
    "visualize without text": (
        "trained",
        ["experiments.visualize", "--workdir={w}"],
        ["at least one text"],
    ),
    "wrong config path": (
        None,
        ["experiments.train", "--config=configs/nope.py", "--workdir={w}"],
        ["configs/nope.py", "No such file"],
    ),
    "unknown config variant": (
        None,
        ["experiments.train", "--config=configs/default.py:huge", "--workdir={w}"],
        ["unknown variant 'huge'", "tiny"],
    ),
    "unknown dataset": (
        None,
        [
            "experiments.train",
            "--config=configs/default.py:tiny",
            "--workdir={w}",
            "--config.data.dataset=imbd",
        ],
        ["'imbd' is unknown", "imdb_reviews"],
    ),
    "misspelt override": (
        None,
        [
            "experiments.train",
            "--config=configs/default.py:tiny",
            "--workdir={w}",
            "--config.model.num_layer=2",
        ],
        ["unknown config field 'model.num_layer'", 'Did you mean "num_layers"'],
    ),
    "override of a field that does not exist": (
        None,
        [
            "experiments.train",
            "--config=configs/default.py:tiny",
            "--workdir={w}",
            "--config.model.depth=2",
        ],
        ["unknown config field 'model.depth'", "config.model has bag_buckets, bag_dropout"],
    ),
    "bad override value": (
        None,
        [
            "experiments.train",
            "--config=configs/default.py:tiny",
            "--workdir={w}",
            "--config.model.d_model=big",
        ],
        ["d_model", "big"],
    ),
    "invalid model field": (
        None,
        [
            "experiments.train",
            "--config=configs/default.py:tiny",
            "--workdir={w}",
            "--config.data.data_dir={t}",
            "--config.model.pooling=avg",
        ],
        ["pooling", "avg"],
    ),
    "optimizer value out of range": (
        None,
        [
            "experiments.train",
            "--config=configs/default.py:tiny",
            "--workdir={w}",
            "--config.optim.ema_decay=1.0",
        ],
        ["config.optim.ema_decay", "[0, 1)", "1.0"],
    ),
    "checkpoint of another model": (
        "copy",
        ["experiments.train", *tiny_flags("{t}"), "--workdir={w}", "--config.model.d_model=32"],
        ["d_model: checkpoint 16 vs config 32"],
    ),
    "resume with another tokenizer": (
        "copy",
        ["experiments.train", *tiny_flags("{t}"), "--workdir={w}", "--config.data.tokenizer=word"],
        ["data.tokenizer: workdir 'char' vs config 'word'"],
    ),
    "resume with another vocabulary cut": (
        "copy",
        ["experiments.train", *tiny_flags("{t}"), "--workdir={w}", "--config.data.min_freq=50"],
        ["data.min_freq: workdir 2 vs config 50"],
    ),
    "resume with another learning rate": (
        "copy",
        [
            "experiments.train",
            *tiny_flags("{t}"),
            "--workdir={w}",
            "--config.optim.learning_rate=1",
        ],
        ["optim.learning_rate: workdir 0.005 vs config 1.0"],
    ),
    "resume with the weight average switched on": (
        "copy",
        ["experiments.train", *tiny_flags("{t}"), "--workdir={w}", "--config.optim.ema_decay=0.9"],
        ["optim.ema_decay: workdir 0.0 vs config 0.9"],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_user_error_is_one_line(case, request, tmp_path, tfds_dir, capsys):
    make, argv, fragments = CASES[case]
    if make is None:
        workdir = str(tmp_path / "w")
    elif make == "trained":
        workdir = request.getfixturevalue("trained")
    elif make == "copy":
        workdir = request.getfixturevalue("trained_copy")
    else:
        workdir = make(request.getfixturevalue("trained"), tmp_path)
    before = tree_hash(workdir) if os.path.isdir(workdir) else None
    proc = run_here(*(a.format(w=workdir, t=tfds_dir) for a in argv), capsys=capsys)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc, *fragments)
    if before is not None:
        assert tree_hash(workdir) == before


def test_refused_resume_exits_cleanly(trained_copy, tfds_dir):
    """A run refused before its first save exits with one line and nothing else on stderr, even
    though a half-written save was deleted when the run started."""
    os.makedirs(os.path.join(trained_copy, "checkpoints", "9.orbax-checkpoint-tmp-1"))
    before = tree_hash(trained_copy)
    # A model field: the config check leaves it to the checkpoint, read after the cleanup.
    argv = [*tiny_flags(tfds_dir), f"--workdir={trained_copy}", "--config.model.d_ff=64"]
    proc = run("experiments.train", *argv)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: workdir {trained_copy!r} holds a checkpoint of a different model "
        "(d_ff: checkpoint 32 vs config 64); use a new --workdir or the original config"
    ]
    assert tree_hash(trained_copy) == {k: v for k, v in before.items() if "tmp" not in k}


def test_output_into_a_closed_pipe_ends_quietly(trained):
    """`predict ... | head -0`: the reader is gone before the first line; no error, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.predict", f"--workdir={trained}", "很好"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode("utf-8", "replace")
    proc.wait(timeout=300)
    assert proc.returncode == 141, err
    assert "error" not in err and "Traceback" not in err and "Exception" not in err, err


def test_a_run_refused_before_writing_leaves_no_workdir(tmp_path, tfds_dir, capsys):
    """A bad config or file refuses the run after the workdir was made; it is removed again, but
    only when this run made it."""
    bad = tmp_path / "one_label.csv"
    bad.write_text("text,label\n" + "".join(f"text {i},pos\n" for i in range(30)), "utf-8")
    workdir = tmp_path / "new"
    args = ("--config=configs/csv.py", f"--config.data.path={bad}", f"--workdir={workdir}")
    proc = run_here("experiments.train", *args, capsys=capsys)
    assert proc.returncode == 2 and "every row has the label 'pos'" in proc.stderr
    assert not workdir.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    args = (*tiny_flags(tfds_dir), f"--workdir={mine}", "--config.model.pooling=avg")
    assert run_here("experiments.train", *args, capsys=capsys).returncode == 2
    assert mine.is_dir()  # the user's own folder stays, even empty


@pytest.mark.slow
def test_a_slow_xdist_worker_teardown_ends_without_a_traceback(tmp_path):
    """`make test` runs pytest-xdist, whose workers get SIGINT when they have not exited 5 s after
    the run. A teardown that spends that long in gc (and so in jax's gc callback) must still end
    quietly; the suite's conftest loaded as a plugin does that."""
    (tmp_path / "slow_teardown.py").write_text(
        textwrap.dedent(
            """
            import gc, os, time
            import pytest

            @pytest.hookimpl(trylast=True)
            def pytest_unconfigure(config):
                if os.environ.get("PYTEST_XDIST_WORKER"):
                    garbage = [[i] for i in range(200_000)]
                    deadline = time.monotonic() + 8
                    while time.monotonic() < deadline:
                        gc.collect()
            """
        ),
        "utf-8",
    )
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n", "utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(tmp_path)])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "-p", "conftest", "-p", "slow_teardown"]
        + ["-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path / "test_one.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert "KeyboardInterrupt" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_second_process_compiles_nothing_new(trained, tfds_dir, tmp_path):
    """The commands keep compiled programs in the user's cache directory: a second train and
    predict of the same shapes find every program there and write no new one."""
    env = {
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "JAX_COMPILATION_CACHE_DIR": "",  # the tests' own cache off: the default place
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",  # every program, however quick
    }
    kept = tmp_path / "cache" / "attn" / "jax"
    help_text = " ".join(run("experiments.predict", "--help", env=env).stdout.split())
    assert f"Compiled programs are kept between runs in {kept} " in help_text
    written = []
    for n in range(2):
        workdir = str(tmp_path / f"run{n}")
        proc = run("experiments.train", *tiny_flags(tfds_dir), f"--workdir={workdir}", env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        proc = run("experiments.predict", f"--workdir={trained}", "很好看", "太差了", env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        written.append(sorted(os.listdir(kept)))
    assert written[0] and written[1] == written[0]


def test_texts_of_one_bucket_share_one_compiled_predict(trained_copy):
    """predict pads a text to its training bucket (configs/default.py:tiny has one, 64), so a new
    text length compiles nothing; padded keys are masked, so the answer is the unpadded one up to
    the order of float32 sums over at most 64 positions."""
    trained = serving.load(trained_copy)
    texts = ["质量" * 11 + "很好", "质量" * 13 + "太差了，不满意"]  # 23 and 34 tokens with CLS
    compiled = maps._forward._cache_size()
    answers = [predict.predict_one(trained, text, top=3) for text in texts]
    assert maps._forward._cache_size() - compiled <= 1
    for text, p in zip(texts, answers, strict=True):
        ids_L = serving.encode(trained, text)
        unpadded = maps.analyse(trained.params, trained.cfg, ids_L, None)["probs"].max()
        assert p["probability"] == pytest.approx(float(unpadded), abs=1e-5)


@pytest.mark.parametrize(
    "module, listed",
    [
        ("train", ["--config", "--workdir", "--print_config", "--num_processes"]),
        ("pretrain", ["--config", "--workdir", "--num_processes"]),
        ("evaluate", ["--workdir", "--split", "--num_processes"]),
    ],
)
def test_help_lists_every_flag_of_the_command(module, listed):
    # absl's --help lists the main module's key flags: those defined in experiments.cli and
    # experiments.parallel were missing from train's, --config and --workdir among them.
    from absl import flags

    entry = importlib.import_module(f"experiments.{module}")
    fv = flags.FlagValues()
    cli.define_key_flags(entry.define_flags, fv, "the_command")
    shown = fv.module_help("the_command")
    for flag in listed:
        assert f"  {flag}:" in shown or f"  --[no]{flag[2:]}:" in shown, shown


def test_print_config_marks_what_a_checkpoint_decides(capsys):
    # configs/finetune.py printed model.d_model = 64 and num_layers = 1, attn's own model's.
    proc = run_here(
        "experiments.train", "--config=configs/finetune.py", "--print_config", capsys=capsys
    )
    assert proc.returncode == 0, proc.stderr
    values = {
        name.strip(): value.strip()
        for name, value in (line.split(" # ")[0].split(" = ") for line in proc.stdout.splitlines())
    }
    for name in ("model.d_model", "model.num_layers", "model.num_heads", "data.max_vocab"):
        assert values[name] == "(the checkpoint's)", name
    # No checkpoint named: the rate its width chooses stays marked, as the data's fields do.
    assert values["model.dropout"] == "0.1" and values["optim.learning_rate"] == "-1.0"
    proc = run_here(
        "experiments.train", "--config=configs/default.py", "--print_config", capsys=capsys
    )
    assert "(the checkpoint's)" not in proc.stdout
