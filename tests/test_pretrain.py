"""Masked-token pretraining runs and fine-tuning from them: the workdir, the round trip, the
refusals, exact resume, and the unlabeled text sources."""

import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import (
    PRETRAIN_STEPS,
    assert_one_line_error,
    assert_trees_equal,
    make_aclimdb,
    metric_rows,
    run,
    run_here,
    saved_state,
    tiny_config,
    tiny_flags,
)

from experiments import train
from experiments.data import datasets, tokenizers, unlabeled
from experiments.errors import UserError
from experiments.training import (
    checkpoints,
    loop,
    masked_tokens,
    optim,
    pipeline,
    schedule,
    warm_start,
)


def _best_step(workdir: str) -> int:
    return checkpoints.latest_step(workdir, checkpoints.BEST)


def test_pretraining_writes_a_workdir_like_training(pretrained):
    for name in ("config.json", "tokenizer.json", "vocab.txt", "metrics.jsonl", "pretrain.json"):
        assert os.path.exists(os.path.join(pretrained, name)), name
    assert checkpoints.latest_step(pretrained, checkpoints.LAST) == PRETRAIN_STEPS
    with checkpoints.reader(pretrained, checkpoints.LAST) as mngr:
        meta = checkpoints.read_meta(mngr, PRETRAIN_STEPS)
    assert meta["objective"] == checkpoints.MASKED_LM and meta["model"]["bag_buckets"] == 0
    rows = metric_rows(pretrained)
    assert {r["split"] for r in rows} == {"train", "validation"}
    with open(os.path.join(pretrained, "pretrain.json"), encoding="utf-8") as f:
        result = json.load(f)
    best = [r for r in rows if r["split"] == "validation" and r["step"] == _best_step(pretrained)]
    assert result["accuracy"] == best[0]["accuracy"] and result["loss"] == best[0]["loss"]
    assert result["num_targets"] > 0 and 0 <= result["accuracy"] <= 1
    # The params hold the classifier's encoder beside the head that predicts hidden tokens.
    params = saved_state(pretrained, PRETRAIN_STEPS)["params"]
    assert {"embed", "layer_0", "final_ln", masked_tokens.HEAD} <= set(params)


def _starting_state(config, workdir, monkeypatch) -> dict:
    """The state a training run of `config` would start from (fresh), without training."""

    class Started(Exception):
        pass

    def capture(r: loop.Run):
        raise Started(r.init_state(True))

    monkeypatch.setattr(loop, "run", capture)
    with pytest.raises(Started) as got:
        train.train_and_evaluate(config, workdir)
    return got.value.args[0]


def test_pretraining_runs_on_its_own_schedule_without_rewriting_the_config(
    tfds_dir, tmp_path, monkeypatch
):
    config = tiny_config(
        tfds_dir,
        pretrain__max_steps=7,
        pretrain__learning_rate=0.5,
        pretrain__warmup_steps=3,
        train__patience=2,
    )
    given = config.to_dict()
    peaks = []
    make_optimizer = optim.make_optimizer

    def recorded(*args, **kw):
        peaks.append((kw["learning_rate"], kw["warmup_steps"]))
        return make_optimizer(*args, **kw)

    class Started(Exception):
        pass

    def capture(r: loop.Run):
        raise Started(r.schedule)

    monkeypatch.setattr(optim, "make_optimizer", recorded)
    monkeypatch.setattr(loop, "run", capture)
    with pytest.raises(Started) as got:
        pipeline.pretrain(config, str(tmp_path / "p"))
    p, t = config.pretrain, config.train
    assert t.patience and (config.optim.learning_rate, config.optim.warmup_steps) != (0.5, 3)
    assert got.value.args[0] == schedule.Schedule(
        total_steps=7,
        learning_rate=0.5,
        warmup_steps=3,
        eval_every_steps=p.eval_every_steps,
        checkpoint_every_steps=p.checkpoint_every_steps,
        log_every_steps=t.log_every_steps,
        keep_checkpoints=t.keep_checkpoints,
        patience=0,  # more pretraining does not hurt
        max_nonfinite=config.optim.max_nonfinite,
    )
    assert peaks == [(0.5, 3)] and config.to_dict() == given


def test_finetuning_starts_from_the_pretrained_encoder(pretrained, tfds_dir, tmp_path, monkeypatch):
    pre = saved_state(pretrained, _best_step(pretrained), "best")["params"]
    warm = _starting_state(
        tiny_config(tfds_dir, model__init_from=pretrained), str(tmp_path / "warm"), monkeypatch
    )["params"]
    cold = _starting_state(tiny_config(tfds_dir), str(tmp_path / "cold"), monkeypatch)["params"]
    assert set(warm) == set(cold)
    for name in warm:
        if warm_start.is_encoder(name):
            assert_trees_equal(warm[name], pre[name])
            assert not np.array_equal(warm["embed"]["tokens"], cold["embed"]["tokens"])
        else:  # pooling and head start as a fresh run's
            assert_trees_equal(warm[name], cold[name])


def test_a_finetuned_workdir_serves_like_any_other(pretrained, tfds_dir, tmp_path, capsys):
    workdir = str(tmp_path / "ft")
    argv = [*tiny_flags(tfds_dir), f"--workdir={workdir}", f"--config.model.init_from={pretrained}"]
    proc = run_here("experiments.train", *argv, capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert f"encoder from the best checkpoint (step {_best_step(pretrained)})" in proc.stderr
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["model"]["init_from"] == pretrained
    for name in ("vocab.txt", "tokenizer.json"):  # the tokenizer is the pretrained one's
        with (
            open(os.path.join(workdir, name), "rb") as a,
            open(os.path.join(pretrained, name), "rb") as b,
        ):
            assert a.read() == b.read()
    proc = run_here("experiments.predict", f"--workdir={workdir}", "很好", capsys=capsys)
    assert proc.returncode == 0 and len(proc.stdout.strip().splitlines()) == 2, proc.stderr
    proc = run_here(
        "experiments.evaluate", f"--workdir={workdir}", "--split=validation", capsys=capsys
    )
    assert proc.returncode == 0 and "accuracy" in proc.stdout, proc.stderr
    # Resuming with another source is another run.
    other = run_here("experiments.train", *argv[:-1], "--config.model.init_from=", capsys=capsys)
    assert_one_line_error(other, "model.init_from")


@pytest.mark.parametrize(
    "case",
    ["missing", "no config", "another encoder", "another tokenizer", "both", "no length"],
)
def test_refusals_name_the_field(case, pretrained, tfds_dir, tmp_path, capsys):
    workdir = str(tmp_path / "run")
    flags = [
        *tiny_flags(tfds_dir),
        f"--workdir={workdir}",
        f"--config.model.init_from={pretrained}",
    ]
    entry, want = "experiments.train", ()
    if case == "missing":
        flags[-1] = f"--config.model.init_from={tmp_path / 'nowhere'}"
        want = ("model.init_from=", "does not exist")
    elif case == "no config":
        (tmp_path / "empty").mkdir()
        flags[-1] = f"--config.model.init_from={tmp_path / 'empty'}"
        want = ("has no config.json",)
    elif case == "another encoder":
        flags += ["--config.model.d_model=32", "--config.model.num_layers=2"]
        want = ("holds another encoder", "d_model: 32 vs 16 there", "num_layers: 2 vs 1 there")
    elif case == "another tokenizer":
        flags += ["--config.data.max_vocab=100"]
        want = ("another tokenizer or length", "data.max_vocab: 100 vs 8000 there")
    elif case == "both":
        flags += [f"--config.model.embeddings_from={tmp_path / 'v.txt'}"]
        want = ("model.init_from and model.embeddings_from are both set",)
    elif case == "no length":
        entry, flags = "experiments.pretrain", flags[:-1]
        want = ("config.pretrain.num_epochs and max_steps are 0",)
    proc = run_here(entry, *flags, capsys=capsys)
    assert_one_line_error(proc, *want)
    assert not os.path.exists(workdir)  # a refused run leaves nothing behind


@pytest.mark.parametrize(
    "more",
    [
        [],
        ["--config.model.pretrained=tests/data/bert/tiny_bert"],
        ["--config.model.pretrained=tests/data/bert/tiny_bert", "--config.pretrain.max_steps=10"],
    ],
)
def test_pretraining_a_checkpoints_encoder_is_refused_saying_what_to_run(more, tmp_path, capsys):
    # It asked for pretrain.num_epochs first, then to start from configs/finetune.py, the config
    # in use.
    workdir = str(tmp_path / "run")
    flags = ["--config=configs/finetune.py", f"--workdir={workdir}", *more]
    proc = run_here("experiments.pretrain", *flags, capsys=capsys)
    assert_one_line_error(
        proc, "does not pretrain a checkpoint's encoder", "python -m experiments.train"
    )
    assert "start from configs/finetune.py" not in proc.stderr
    assert not os.path.exists(workdir)


def test_a_pretraining_workdir_does_not_answer_as_a_classifier(pretrained, capsys):
    proc = run_here("experiments.predict", f"--workdir={pretrained}", "很好", capsys=capsys)
    assert_one_line_error(proc, "is a pretraining workdir", "--config.model.init_from=")


@pytest.mark.slow
def test_pretraining_killed_mid_way_resumes_bit_exactly(pretrained, tfds_dir, tmp_path):
    from test_reliability import _train_killed_at

    workdir = str(tmp_path / "run")
    argv = [
        *tiny_flags(tfds_dir),
        f"--workdir={workdir}",
        f"--config.pretrain.max_steps={PRETRAIN_STEPS}",
    ]
    os.environ["ENTRY"] = "pretrain"
    try:
        _train_killed_at("step:5", argv, tmp_path)
    finally:
        del os.environ["ENTRY"]
    assert checkpoints.latest_step(workdir, checkpoints.LAST) == 3
    proc = run("experiments.pretrain", *argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from step 3 of {PRETRAIN_STEPS}" in proc.stderr
    curves = os.path.join(workdir, "curves.png")
    assert f"curves: {curves}" in proc.stderr and os.path.getsize(curves) > 0
    assert metric_rows(workdir) == metric_rows(pretrained)
    for step in (3, 6):
        assert_trees_equal(saved_state(workdir, step), saved_state(pretrained, step))
    with (
        open(os.path.join(workdir, "pretrain.json")) as a,
        open(os.path.join(pretrained, "pretrain.json")) as b,
    ):
        assert json.load(a) == json.load(b)


def test_train_pretrains_first_when_asked(pretrained, tfds_dir, tmp_path):
    """train with config.pretrain set runs the same pretraining into WORKDIR/pretrain, then
    fine-tunes from it: the same as pretrain, then train with init_from."""
    workdir = str(tmp_path / "both")
    both = train.train_and_evaluate(
        tiny_config(tfds_dir, pretrain__max_steps=PRETRAIN_STEPS), workdir
    )
    inner = os.path.join(workdir, "pretrain")
    assert metric_rows(inner) == metric_rows(pretrained)
    with open(os.path.join(inner, "curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert_trees_equal(saved_state(inner, PRETRAIN_STEPS), saved_state(pretrained, PRETRAIN_STEPS))
    apart = train.train_and_evaluate(
        tiny_config(tfds_dir, model__init_from=inner), str(tmp_path / "apart")
    )
    strip = lambda r: {k: v for k, v in r.items() if k != "examples_per_sec"}
    assert strip(both) == strip(apart)


def test_unlabeled_sources_add_texts_and_drop_held_out_ones(tfds_dir, tmp_path, capsys):
    base = tiny_config(tfds_dir).data
    splits = datasets.load_splits(base)
    val_text, test_text, train_text = (splits[s][0][0] for s in ("validation", "test", "train"))
    lines = tmp_path / "more.txt"
    lines.write_text(f"一段新的评论\n\n{val_text}\n一段新的评论\n{train_text}\n另一段\n", "utf-8")
    table = tmp_path / "more.csv"
    table.write_text(f'text,stars\n"表格里的,评论",5\n{test_text},1\n', "utf-8")
    folder = tmp_path / "aclImdb"
    make_aclimdb(folder)
    config = tiny_config(tfds_dir, data__unlabeled=(str(lines), str(table), str(folder)))
    texts = unlabeled.load(config.data)
    n = len(splits["train"][0])
    assert texts.train[:n] == splits["train"][0]
    assert texts.train[n:] == ["一段新的评论", "另一段", "表格里的,评论", "unlabelled review"]
    assert texts.validation == splits["validation"][0]
    assert "2 dropped because they occur in validation or test" in texts.summary
    assert f"2 from {lines}" in texts.summary and f"1 from {folder}" in texts.summary


def test_unlabeled_tfds_split_on_mock_data(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "unreachable", lambda host, port: None)
    with tfds.testing.mock_data(num_examples=7):
        got = unlabeled.read("tfds:imdb_reviews:unsupervised", data_dir=str(tmp_path))
    assert len(got) == 7 and all(isinstance(t, str) and t for t in got)


@pytest.mark.parametrize(
    "source, want",
    [
        ("nowhere.txt", "does not exist"),
        ("empty.txt", "is empty"),
        ("notes.md", "unknown file type '.md'"),
        ("tfds:imdb_reviews", "expected tfds:<name>:<split>"),
        ("tfds:nope:train", "'nope' is unknown here"),
    ],
)
def test_unlabeled_source_errors(source, want, tmp_path):
    (tmp_path / "empty.txt").write_text("", "utf-8")
    (tmp_path / "notes.md").write_text("a note", "utf-8")
    path = source if source.startswith("tfds:") else str(tmp_path / source)
    with pytest.raises(UserError, match=want):
        unlabeled.read(path)


def test_pretraining_reads_its_tokenizer_from_all_its_texts(tfds_dir, tmp_path):
    extra = tmp_path / "more.txt"
    extra.write_text("\n".join(["齉齉齉"] * 3), "utf-8")  # a character the reviews never use
    config = tiny_config(tfds_dir, pretrain__max_steps=1, data__unlabeled=(str(extra),))
    config.unlock()
    config.pretrain.eval_every_steps = config.pretrain.checkpoint_every_steps = 1
    workdir = str(tmp_path / "p")
    pipeline.pretrain(config, workdir)
    assert "齉" in tokenizers.load_tokenizer(workdir).vocab


def test_vectors_file_becomes_the_token_table(tfds_dir, tmp_path, monkeypatch):
    path = tmp_path / "vec.txt"
    path.write_text(
        "2 16\n好 " + " ".join(["1"] * 16) + "\n差 " + " ".join(["-1"] * 16) + "\n", "utf-8"
    )
    state = _starting_state(
        tiny_config(tfds_dir, model__embeddings_from=str(path)), str(tmp_path / "run"), monkeypatch
    )
    table = np.asarray(state["params"]["embed"]["tokens"])
    tok = tokenizers.build_tokenizer(
        "char",
        datasets.load_splits(tiny_config(tfds_dir).data, ("train",))["train"][0],
        lowercase=True,
        min_freq=2,
        max_vocab=8000,
    )
    good, bad = tok.vocab.index("好"), tok.vocab.index("差")
    # The two rows point in opposite directions, whatever scale the loader gives them.
    cos = table[good] @ table[bad] / np.linalg.norm(table[good]) / np.linalg.norm(table[bad])
    assert cos == pytest.approx(-1.0, abs=1e-5)
    assert np.isfinite(table).all()


def test_warm_lr_scale_zero_freezes_what_the_run_starts_from(
    pretrained, tfds_dir, tmp_path, monkeypatch
):
    config = tiny_config(tfds_dir, model__init_from=pretrained, optim__warm_lr_scale=0.0)
    workdir = str(tmp_path / "frozen")
    train.train_and_evaluate(config, workdir)
    end = saved_state(workdir, 6)["params"]
    pre = saved_state(pretrained, _best_step(pretrained), "best")["params"]
    start = _starting_state(config, str(tmp_path / "start"), monkeypatch)["params"]
    assert {n for n in end if warm_start.is_encoder(n)} == {"embed", "layer_0", "final_ln"}
    for name in end:
        if warm_start.is_encoder(name):
            assert_trees_equal(end[name], pre[name])
    assert not np.array_equal(end["head"]["w"], start["head"]["w"])  # the rest trains
