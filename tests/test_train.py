"""A tiny end-to-end run on the embedded data, resume, multi-device, model mismatch."""

import itertools
import json
import os
import re
import shutil

import jax
import numpy as np
import pytest
from conftest import (
    assert_same_training,
    assert_trees_equal,
    metric_rows,
    saved_state,
    tiny_config,
    train_interrupted,
    tree_hash,
)

from attn import classifier
from experiments import evaluate, parallel, predict, serving, train, visualize, workdirs
from experiments.data import encoding, tokenizers
from experiments.errors import UserError
from experiments.explain import maps
from experiments.training import bag_prior, checkpoints, classify, loop, metrics, schedule

EVAL_KEYS = {"accuracy", "macro_f1", "loss", "confusion", "num_examples"}


def test_the_expected_time_weighs_each_batch_shape_by_how_often_it_comes():
    # Three short batches for each long one, which takes 5-7 times as long: timing only the next
    # few batches (mostly short ones) promised half the time the run took.
    counts = {("tokens", (32, 32)): 3, ("tokens", (32, 256)): 1}
    seconds = {("tokens", (32, 32)): [0.1, 0.2], ("tokens", (32, 256)): [1.3, 1.4]}
    assert loop.expected_time(counts, seconds, 1200, 12) == (
        "expected: 8-10 min for 1,200 steps at the machine's present load (0.40-0.50 s a step "
        "over its 2 batch shapes), plus 12 evaluations"
    )
    one = {"s": [0.5, 0.5]}
    assert loop.expected_time({"s": 7}, one, 100, 1).startswith("expected: about 50 s for 100 ")
    assert loop.expected_time({"s": 1}, {"s": [2.0, 2.5]}, 3000, 0).startswith(
        "expected: 1.7-2.1 h for 3,000 steps"
    )


def test_the_expected_time_times_every_batch_shape_of_the_run():
    shapes, compiled = [], []

    def step(state, batch):
        shapes.append(batch["tokens"].shape)
        return state, {}

    def batches(start):
        for i in itertools.count(start):
            yield {"tokens": np.zeros((4, 16 if i % 5 == 0 else 8), np.int32)}

    r = loop.Run(
        workdir="",
        schedule=schedule.Schedule(
            total_steps=70,
            learning_rate=1.0,
            warmup_steps=0,
            eval_every_steps=10,
            checkpoint_every_steps=10,
            log_every_steps=10,
            keep_checkpoints=1,
            patience=0,
            max_nonfinite=1,
        ),
        dp=parallel.data_parallel({"batch_size": 4, "eval_batch_size": 4}),
        meta={},
        init_state=lambda fresh: None,
        step=step,
        compile=lambda state, batch: compiled.append(batch["tokens"].shape),
        batches=batches,
        evaluate=lambda state: {},
        served=lambda state: state,
        write_run_files=lambda: None,
    )
    state = {"w": jax.numpy.zeros(3)}
    counts, first = loop._next_shapes(r, start=10)
    assert counts == {(("tokens", (4, 16)),): 12, (("tokens", (4, 8)),): 48}
    loop._compile_ahead(r, state, first)
    assert sorted(compiled) == [(4, 8), (4, 16)] and not shapes  # compiled, nothing run
    line = loop._expected_time(r, state, 10, counts, first, compiled_in=12.3)
    assert line.startswith("expected: ") and " for 60 steps " in line
    assert line.endswith("over its 2 batch shapes, compiled ahead in 12 s), plus 6 evaluations")
    assert sorted(shapes) == [(4, 8)] * 3 + [(4, 16)] * 3  # each run once, then timed twice
    assert loop._expected_time(r, state, 21, counts, first, 0.0) is None  # 49 steps left


def test_training_writes_checkpoints_metrics_and_test_results(trained):
    with open(os.path.join(trained, "eval_test.json"), encoding="utf-8") as f:
        test = json.load(f)
    assert EVAL_KEYS <= set(test)
    assert test["num_examples"] == 1726 and np.sum(test["confusion"]) == 1726
    assert test["label_names"] == ["neg", "pos"]  # as evaluate's files name them
    assert 0.0 <= test["accuracy"] <= 1.0 and np.isfinite(test["loss"])
    assert sorted(os.listdir(os.path.join(trained, "checkpoints"))) == ["3", "6"]
    assert len(os.listdir(os.path.join(trained, "best"))) == 1
    for name in ("vocab.txt", "tokenizer.json", "config.json"):
        assert os.path.getsize(os.path.join(trained, name)) > 0
    rows = metric_rows(trained)
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if r["split"] == "validation"] == [3, 6]
    assert all(np.isfinite(r["loss"]) and r["skipped_steps"] == 0 for r in rows if "grad_norm" in r)
    assert int(saved_state(trained, 6)["step"]) == 6


def test_predict_cuts_long_texts_as_training_did(trained_copy):
    text = "好" * 100 + "质量太差了"  # longer than the tiny config's 64 tokens
    config_path = os.path.join(trained_copy, "config.json")
    config = workdirs.read_json(config_path)
    assert "tail_len" in config["data"]
    head = serving.encode(serving.load(trained_copy), text)
    del config["data"]["tail_len"]  # a workdir from before the field: the start only
    workdirs.write_json(config_path, config)
    np.testing.assert_array_equal(serving.encode(serving.load(trained_copy), text), head)
    config["data"]["tail_len"] = 5
    workdirs.write_json(config_path, config)
    trained = serving.load(trained_copy)
    ids = serving.encode(trained, text)
    assert len(ids) == len(head) == trained.cfg.max_len
    np.testing.assert_array_equal(ids[-5:], trained.tokenizer.encode("质量太差了"))
    np.testing.assert_array_equal(ids[:-5], head[:-5])


def test_evaluate_predict_visualize(trained_copy, tmp_path):
    result = evaluate.evaluate_workdir(trained_copy, "validation")
    assert EVAL_KEYS <= set(result)
    assert result["num_examples"] == 1759
    with open(os.path.join(trained_copy, "evaluate_validation.json"), encoding="utf-8") as f:
        assert json.load(f)["accuracy"] == result["accuracy"]
    # The best checkpoint's validation accuracy is the one logged when it was saved.
    best = max(r["accuracy"] for r in metric_rows(trained_copy) if r["split"] == "validation")
    assert result["accuracy"] == pytest.approx(best, abs=1e-6)

    trained = serving.load(trained_copy)
    (best_step,) = os.listdir(os.path.join(trained_copy, "best"))
    assert trained.step == int(best_step)
    assert_trees_equal(trained.params, saved_state(trained_copy, int(best_step), "best")["params"])
    p = predict.predict_one(trained, "这本书很好看，推荐", top=3)
    assert p["label"] in ("neg", "pos") and 0.5 <= p["probability"] <= 1.0
    assert len(p["top_tokens"]) == 3 and p["num_tokens"] == 9
    assert {t for t, _ in p["top_tokens"]} <= set("这本书很好看，推荐")

    out = str(tmp_path / "vis")
    written = visualize.visualize(trained_copy, ["很好看", "质量太差了"], out)
    cfg = trained.cfg
    pngs = sorted(f for f in os.listdir(out) if f.endswith(".png"))
    assert pngs == sorted(
        f"text{n}_layer{layer}_head{head}.png"
        for n in (1, 2)
        for layer in range(cfg.num_layers)
        for head in range(cfg.num_heads)
    )
    assert os.path.join(out, "attention.html") in written
    assert os.path.join(trained_copy, "curves.png") in written
    for path in written:
        with open(path, "rb") as f:
            head = f.read(8)
        assert head == b"\x89PNG\r\n\x1a\n" or path.endswith(".html")
    html = open(os.path.join(out, "attention.html"), encoding="utf-8").read()
    assert "质" in html and "text 2" in html


def test_the_best_checkpoint_keeps_only_the_served_weights_and_the_step(trained):
    (best,) = os.listdir(os.path.join(trained, "best"))
    kept = saved_state(trained, int(best), "best")
    assert set(kept) == {"params", "step"} and int(kept["step"]) == int(best)
    whole = saved_state(trained, int(best))  # the last checkpoints keep what resuming needs
    assert {"params", "opt_state", "step", "rng"} <= set(whole)
    assert_trees_equal(kept["params"], whole["params"])


def test_a_workdir_whose_best_checkpoint_holds_the_whole_state_still_serves_and_reruns(
    trained_copy, tfds_dir
):
    """Workdirs written before the best checkpoint kept the served weights alone."""
    (best,) = os.listdir(os.path.join(trained_copy, "best"))
    whole = saved_state(trained_copy, int(best))
    with checkpoints.reader(trained_copy, checkpoints.BEST) as mngr:
        meta = checkpoints.read_meta(mngr, int(best))
    shutil.rmtree(os.path.join(trained_copy, "best"))
    with checkpoints.writer(trained_copy, checkpoints.BEST, 1) as mngr:
        checkpoints.save(mngr, int(best), whole, meta)
    assert_trees_equal(serving.load(trained_copy).params, whole["params"])
    with open(os.path.join(trained_copy, "eval_test.json"), encoding="utf-8") as f:
        before = json.load(f)
    again = train.train_and_evaluate(tiny_config(tfds_dir), trained_copy)  # nothing left to train
    assert (again["step"], again["confusion"]) == (before["step"], before["confusion"])
    assert again["loss"] == before["loss"]


def test_resume_after_interrupt_matches_uninterrupted_run(trained, tfds_dir, tmp_path, monkeypatch):
    workdir = str(tmp_path / "run")
    # After the step-3 checkpoint, with steps 4 and 5 done, 4 logged.
    train_interrupted(monkeypatch, tiny_config(tfds_dir), workdir, step=6)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3"]
    assert max(r["step"] for r in metric_rows(workdir)) == 4  # dropped when resuming

    train.train_and_evaluate(tiny_config(tfds_dir), workdir)
    assert metric_rows(workdir) == metric_rows(trained)
    assert_trees_equal(saved_state(workdir, 6), saved_state(trained, 6))


def test_checkpoint_of_another_model_is_refused_naming_fields(trained_copy, tfds_dir):
    before = tree_hash(trained_copy)
    config = tiny_config(tfds_dir, model__d_model=32, model__num_heads=4)
    with pytest.raises(UserError) as e:
        train.train_and_evaluate(config, trained_copy)
    msg = str(e.value)
    assert (
        "d_model: checkpoint 16 vs config 32" in msg
        and "num_heads: checkpoint 2 vs config 4" in msg
    )
    assert "d_ff" not in msg and "\n" not in msg
    assert tree_hash(trained_copy) == before


def test_refused_run_leaves_no_vocabulary_then_a_new_config_builds_its_own(tfds_dir, tmp_path):
    """A run refused for a bad model field writes no tokenizer or config (it is refused before
    the workdir is made), so the next run in the same workdir builds the vocabulary its own config
    asks for."""
    workdir = str(tmp_path / "run")
    with pytest.raises(UserError, match="pooling"):
        train.train_and_evaluate(tiny_config(tfds_dir, model__pooling="avg"), workdir)
    assert not os.path.exists(workdir)
    train.train_and_evaluate(tiny_config(tfds_dir, data__min_freq=50, train__max_steps=1), workdir)
    tok = tokenizers.load_tokenizer(workdir)
    assert tok.min_freq == 50
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["data"]["min_freq"] == 50


def test_a_rerun_with_other_label_names_names_that_field(tmp_path):
    """Skipping a small class declared before also changes num_classes; the refusal names the
    data field the user changed, not the model difference it causes."""
    rows = [f"review {i},{'pos' if i % 2 else 'neg'}" for i in range(200)] + ["review x,meh"]
    path = tmp_path / "r.csv"
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    workdir = str(tmp_path / "run")
    config = tiny_config("", data__dataset="file", data__path=str(path), train__max_steps=1)
    config.data.label_names = ("meh", "neg", "pos")
    train.train_and_evaluate(config, workdir)
    before = tree_hash(workdir)
    config.data.label_names = ("neg", "pos")
    workdir_said = "data.label_names: workdir ['meh', 'neg', 'pos'] vs config"
    with pytest.raises(UserError, match=re.escape(workdir_said)):
        train.train_and_evaluate(config, workdir)
    assert tree_hash(workdir) == before


def test_resume_may_change_only_how_long_and_how_often(trained_copy, tfds_dir):
    config = tiny_config(tfds_dir, train__max_steps=12, train__eval_every_steps=4)
    workdirs.check_same_run(config, trained_copy)  # training longer is the same run
    for field, value in (("data__batch_size", 8), ("train__seed", 1), ("data__lowercase", False)):
        with pytest.raises(UserError, match=field.replace("__", ".")):
            workdirs.check_same_run(tiny_config(tfds_dir, **{field: value}), trained_copy)


@pytest.mark.parametrize(
    "field, old, new",
    [
        ("data.tail_len", 0, 5),
        ("optim.bag_init", "zeros", "naive_bayes"),
        ("optim.adversarial_relative", False, True),
        ("data.bag_len", 0, 128),
        ("data.label_names", [], ["neg", "pos"]),
    ],
)
def test_resume_reads_a_field_the_workdir_predates_as_its_old_value(
    trained_copy, tfds_dir, field, old, new
):
    """A workdir written before a field existed ran as its old value (e.g. texts cut at the
    start only, tail_len 0): resuming it with a config that differs would silently change it."""
    config_path = os.path.join(trained_copy, "config.json")
    saved = workdirs.read_json(config_path)
    section, name = field.split(".")
    del saved[section][name]
    workdirs.write_json(config_path, saved)
    override = f"{section}__{name}"
    workdirs.check_same_run(tiny_config(tfds_dir, **{override: old}), trained_copy)
    with pytest.raises(UserError, match=re.escape(f"{field}: workdir {old!r} vs config {new!r}")):
        workdirs.check_same_run(tiny_config(tfds_dir, **{override: new}), trained_copy)


@pytest.mark.slow
def test_eight_devices_train_like_one(request, eight_devices):
    assert_same_training(eight_devices, request.getfixturevalue("trained"))


def test_weight_average_is_what_evaluate_and_predict_use(tfds_dir, tmp_path):
    workdir = str(tmp_path / "ema")
    train.train_and_evaluate(tiny_config(tfds_dir, optim__ema_decay=0.9), workdir)
    best_step = int(os.listdir(os.path.join(workdir, "best"))[0])
    state = saved_state(workdir, best_step)  # the last checkpoints hold it too, whole
    loaded = serving.load(workdir)
    assert_trees_equal(loaded.params, state["ema"])
    assert_trees_equal(saved_state(workdir, best_step, which="best")["ema"], state["ema"])
    gap = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), state["ema"], state["params"])
    assert max(jax.tree.leaves(gap)) > 0  # the average really differs from the last weights
    # The logged best validation accuracy was computed with the average.
    result = evaluate.evaluate_workdir(workdir, "validation")
    best = max(r["accuracy"] for r in metric_rows(workdir) if r["split"] == "validation")
    assert result["accuracy"] == pytest.approx(best, abs=1e-6)


def _naive_bayes_reference(workdir: str, cfg) -> np.ndarray:
    """The table from the training texts one at a time: distinct bag ids per text, per class."""
    data = encoding.load(
        workdirs.read_config(os.path.join(workdir, "config.json")).data,
        ("train",),
        add_cls=False,
        workdir=workdir,
    ).splits["train"]
    counts = np.zeros((cfg.bag_buckets, cfg.num_classes))
    read = data.ids if data.bag_ids is None else data.bag_ids
    # One padded matrix hashed at once (one shape to compile), then each text's real positions.
    tokens_BxL = np.zeros((len(read), max(map(len, read))), np.int32)
    for row, ids in enumerate(read):
        tokens_BxL[row, : len(ids)] = ids
    ids_OxBxL = np.asarray(classifier.bag_ids(tokens_BxL, cfg))
    for row, (ids, label) in enumerate(zip(read, data.labels, strict=True)):
        for order_ids in ids_OxBxL[:, row, : len(ids)]:
            counts[np.unique(order_ids), label] += 1  # once per text and n-gram order
    p = (counts + 1) / (counts + 1).sum(0)
    table = np.log(p) - np.log(p).mean(1, keepdims=True)
    return np.where(counts.sum(1, keepdims=True) > 0, table, 0.0)


@pytest.mark.parametrize("bag_len", [0, 128])
def test_the_bag_can_start_from_naive_bayes_counts_of_the_training_split(
    tfds_dir, tmp_path, monkeypatch, bag_len
):
    workdir = str(tmp_path / "nb")
    # A learning rate of 1e-9: the checkpoint after one step holds the start within 1e-8.
    config = tiny_config(
        tfds_dir,
        model__bag_buckets=512,
        optim__bag_init="naive_bayes",
        optim__learning_rate=1e-9,
        train__max_steps=1,
        data__bag_len=bag_len,  # 128: the counts include characters beyond max_len (64)
    )
    train.train_and_evaluate(config, workdir)
    loaded = serving.load(workdir)
    start = np.asarray(saved_state(workdir, 1)["params"]["bag"])
    np.testing.assert_allclose(start, _naive_bayes_reference(workdir, loaded.cfg), atol=1e-5)
    assert np.abs(start).max() > 0.1
    # Resuming restores the table from the checkpoint; counting again would be wasted work.
    monkeypatch.setattr(bag_prior, "naive_bayes", lambda *a: pytest.fail("recounted"))
    with config.unlocked():
        config.train.max_steps = 2
    train.train_and_evaluate(config, workdir)
    assert int(saved_state(workdir, 2)["step"]) == 2
    monkeypatch.undo()
    refused = str(tmp_path / "refused")
    with pytest.raises(UserError, match="optim.bag_init=naive_bayes needs a bag"):
        train.train_and_evaluate(tiny_config(tfds_dir, optim__bag_init="naive_bayes"), refused)
    with pytest.raises(UserError, match="optim.bag_init must be one of"):
        train.train_and_evaluate(tiny_config(tfds_dir, optim__bag_init="nb"), refused)
    with pytest.raises(UserError, match="data.bag_len > 0 needs a bag"):
        train.train_and_evaluate(tiny_config(tfds_dir, data__bag_len=128), refused)
    with pytest.raises(UserError, match=r"data.bag_len must be 0 or an integer >= max_len \(64\)"):
        train.train_and_evaluate(
            tiny_config(tfds_dir, model__bag_buckets=64, data__bag_len=32), refused
        )


def test_a_bag_that_reads_more_is_read_alike_by_training_evaluate_and_predict(tfds_dir, tmp_path):
    workdir = str(tmp_path / "longbag")
    config = tiny_config(
        tfds_dir, model__bag_buckets=512, optim__bag_init="naive_bayes", data__bag_len=256
    )
    train.train_and_evaluate(config, workdir)
    best = max(r["accuracy"] for r in metric_rows(workdir) if r["split"] == "validation")
    assert evaluate.evaluate_workdir(workdir, "validation")["accuracy"] == pytest.approx(best)
    loaded = serving.load(workdir)
    d = loaded.config.data
    split = encoding.load(d, ("validation",), add_cls=False, tokenizer=loaded.tokenizer)
    s = split.splits["validation"]
    longer = [i for i in range(len(s.ids)) if len(s.bag_ids[i]) > len(s.ids[i])][:3]
    assert len(longer) == 3  # texts of more than max_len (64) characters
    dp = parallel.data_parallel(d)
    probs_NxC, _ = classify.probabilities(
        loaded.params, loaded.cfg, s.ids, s.labels, data=d, dp=dp, bag_ids=s.bag_ids
    )
    for i in longer:
        got = predict.predict_one(loaded, s.texts[i], top=1)
        assert got["probability"] == pytest.approx(float(probs_NxC[i].max()), abs=1e-5)
        cut_only = maps.analyse(loaded.params, loaded.cfg, s.ids[i], None)["probs"]
        assert not np.allclose(cut_only, probs_NxC[i], atol=1e-4)  # the rest of the text counts


def test_training_stops_early_when_validation_stops_improving(tfds_dir, tmp_path, capsys):
    """train.patience=2: the run ends at the second evaluation in a row that does not improve on
    the kept one; its rerun trains no further and gives the same results."""
    workdir = str(tmp_path / "run")
    config = tiny_config(tfds_dir, train__max_steps=60, train__patience=2)
    result = train.train_and_evaluate(config, workdir)
    rows = metrics.read(workdir)
    best, best_loss, stale, stop = metrics.NO_BEST, None, 0, None
    for row in (r for r in rows if r["split"] == "validation"):
        if metrics.improves(row, best, best_loss):
            best, best_loss, stale = row["accuracy"], row["loss"], 0
        else:
            stale += 1
        if stale == 2:
            stop = row["step"]
            break
    assert stop is not None and stop < 60, rows
    assert max(r["step"] for r in rows) == stop
    assert checkpoints.latest_step(workdir, checkpoints.LAST) == stop
    out = capsys.readouterr()
    assert "stopping early" in out.out
    assert f"test (step {result['step']}):" in out.err  # the test split's own progress bar
    again = train.train_and_evaluate(config, workdir)
    drop = lambda r: {k: v for k, v in r.items() if k != "examples_per_sec"}
    assert drop(again) == drop(result)
    assert metrics.read(workdir) == rows
