"""Fine-tuning a pretrained checkpoint (configs/finetune.py, model.pretrained) end to end on
tests/data/bert/tiny_bert: the train command, exact resume, step-0 params, evaluate and predict
on the result, predict --explain, visualize and faithfulness on it, the checkpoint's tokenizer
saved and read back, the bag of n-grams beside the
encoder, and what is refused."""

import functools
import json
import os
import random
import shutil
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import (
    ROOT,
    _built_once,
    assert_close32,
    assert_one_line_error,
    assert_trees_equal,
    encoder_terms,
    metric_rows,
    run_here,
    saved_state,
    tol32,
    train_interrupted,
)
from safetensors import safe_open

from attn import bert, encoder_classifier
from attn.encoders import heads
from configs import finetune as finetune_config
from experiments import cli, evaluate, parallel, predict, serving, train
from experiments.data import checkpoint_tokenizer, chosen, encoding, tokenizers
from experiments.errors import UserError
from experiments.explain import faithfulness, maps, ranking
from experiments.exporting import hub_dir
from experiments.training import baseline, checkpoints, classify, finetune, optim, workdir_reader

TINY_BERT = ROOT / "tests" / "data" / "bert" / "tiny_bert"
POS = ["great", "superb", "moving", "good", "loved", "wonderful", "best", "fun"]
NEG = ["awful", "boring", "dull", "bad", "hated", "terrible", "worst"]


def _write_csv(path: Path, n: int = 160) -> str:
    r = random.Random(0)
    rows = []
    for i in range(n):
        label = i % 2
        a, b = r.sample(POS if label else NEG, 2)
        rows.append(f"the film {i} was {a} and {b},{'pos' if label else 'neg'}")
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


def _flags(csv: str, *more: str) -> list[str]:
    return [
        "--config=configs/finetune.py:tiny",
        f"--config.model.pretrained={TINY_BERT}",
        f"--config.data.path={csv}",
        *more,
    ]


def _config(csv: str, **overrides):
    config = finetune_config.get_config("tiny")
    config.unlock()
    config.data.path = csv
    config.model.pretrained = str(TINY_BERT)
    for key, value in overrides.items():
        section, field = key.split("__")
        config[section][field] = value
    return config


@pytest.fixture(scope="module")
def csv(tmp_path_factory) -> str:
    return _write_csv(tmp_path_factory.mktemp("ft_data") / "reviews.csv")


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, csv) -> str:
    """A workdir of `python -m experiments.train --config=configs/finetune.py:tiny` (6 steps),
    run in this process. Read-only for tests."""

    def run(workdir: str) -> None:
        status = cli.run(
            train.define_flags, train.main, ["train", *_flags(csv), f"--workdir={workdir}"]
        )
        assert status == 0

    return _built_once(tmp_path_factory, "finetuned", run)


def test_the_train_command_fine_tunes_and_writes_a_servable_workdir(finetuned):
    with open(os.path.join(finetuned, "eval_test.json"), encoding="utf-8") as f:
        test = json.load(f)
    assert test["label_names"] == ["neg", "pos"] and test["num_examples"] > 0
    assert sorted(os.listdir(os.path.join(finetuned, "checkpoints"))) == ["3", "6"]
    rows = metric_rows(finetuned)
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert all(np.isfinite(r["loss"]) for r in rows)
    state = saved_state(finetuned, 6)
    assert set(state["params"]) == {"encoder", "head"}
    loaded, _ = bert.load(TINY_BERT)
    trained_enc = state["params"]["encoder"]
    assert not np.array_equal(trained_enc["layer_1"]["ff1"]["w"], loaded["layer_1"]["ff1"]["w"])
    meta = checkpoints.read_meta(checkpoints.reader(finetuned, "checkpoints"), 6)
    assert meta["family"] == "bert" and meta["model"]["encoder"]["d_model"] == 32


def test_evaluate_and_predict_serve_the_fine_tuned_workdir(finetuned, tmp_path, capsys):
    workdir = str(tmp_path / "copy")
    shutil.copytree(finetuned, workdir)
    trained = serving.load(workdir)
    (best,) = os.listdir(os.path.join(workdir, "best"))
    assert_trees_equal(trained.params, saved_state(workdir, int(best), "best")["params"])
    result = evaluate.evaluate_workdir(workdir, "validation")
    best_val = max(r["accuracy"] for r in metric_rows(workdir) if r["split"] == "validation")
    assert result["accuracy"] == pytest.approx(best_val, abs=1e-6)
    p = predict.predict_one(trained, "the film was great and moving", top=3)
    assert p["label"] in ("neg", "pos") and 0.5 <= p["probability"] <= 1.0
    assert p["num_tokens"] == 8  # [CLS] 6 words [SEP]
    # The text's own tokens, as --explain's attention ranking lists them: no [CLS] or [SEP].
    assert {t for t, _ in p["top_tokens"]} <= {"the", "film", "was", "great", "and", "moving"}
    listed = ranking.explain(trained, "the film was great and moving", 3)["attention"]
    assert [t for t, _ in p["top_tokens"]] == [t for t, _ in listed]
    proc = run_here("experiments.predict", f"--workdir={workdir}", "a dull film", capsys=capsys)
    assert proc.returncode == 0 and proc.stdout.splitlines()[1].split("\t")[0] in ("neg", "pos")
    proc = run_here("experiments.evaluate", f"--workdir={workdir}", capsys=capsys)
    assert proc.returncode == 0 and "accuracy" in proc.stdout


def test_predict_lists_whole_words_never_pieces_special_or_unknown_tokens(finetuned):
    """tiny_bert's vocabulary cuts "toaster" into six pieces and has no emoji: predict lists the
    word, with the sum of its pieces' attention, and leaves [UNK], [CLS] and [SEP] out."""
    trained = serving.load(finetuned)
    text = "the toaster was great 😀"
    ids_L = serving.encode(trained, text)
    tokens = trained.tokenizer.tokens(ids_L.tolist())
    assert tokens == ["[CLS]", "the", "t", "##o", "##a", "##s", "##t", "##er", "was"] + [
        "great",
        "[UNK]",
        "[SEP]",
    ]
    p = predict.predict_one(trained, text, top=10)
    assert sorted(w for w, _ in p["top_tokens"]) == ["great", "the", "toaster", "was"]
    received_L = maps.analyse(trained.params, trained.cfg, ids_L, None, trained.config.data)[
        "received"
    ]
    got = dict(p["top_tokens"])
    assert got["toaster"] == pytest.approx(float(received_L[2:8].sum()), rel=1e-6)
    assert got["was"] == pytest.approx(float(received_L[8]), rel=1e-6)
    assert [w for w, _ in p["top_tokens"]] == sorted(got, key=lambda w: -got[w])


def test_a_long_text_is_said_to_be_read_in_part_and_max_len_reads_more(finetuned, capsys):
    """The tiny fine-tune reads 32 tokens (its data.max_len); tiny_bert's positions allow 40."""
    trained = serving.load(finetuned)
    long_text = "the film was great and moving " * 20  # 120 tokens
    p = predict.predict_one(trained, long_text, top=3)
    assert p["num_tokens"] == 32 and p["note"] == (
        "read only the first 22 and last 8 of 120 tokens; it reads 32 tokens (max_len): "
        "--max_len=40 reads as much as its encoder's positions allow"
    )
    longer = serving.reading_up_to(trained, 40)
    p = predict.predict_one(longer, long_text, top=3)
    assert p["num_tokens"] == 40 and p["note"] == (
        "read only the first 30 and last 8 of 120 tokens; the model reads no more: its "
        "encoder's positions end at 40"
    )
    short = predict.predict_one(trained, "the film was great and moving " * 6, top=3)  # 36
    assert short["note"] == (
        "read the first 22 and last 8 of 36 tokens; it reads 32 tokens (max_len): --max_len=38 "
        "reads all of it"
    )
    proc = run_here(
        "experiments.predict", f"--workdir={finetuned}", "--max_len=40", long_text, capsys=capsys
    )
    assert proc.returncode == 0 and "note: text 1: read only the first 30 and last 8" in proc.stderr
    proc = run_here(
        "experiments.predict", f"--workdir={finetuned}", "--max_len=41", long_text, capsys=capsys
    )
    assert_one_line_error(
        proc, "--max_len=41: the model reads at most 40 tokens (its encoder's positions end there)"
    )


def test_the_explaining_commands_serve_the_fine_tuned_workdir(finetuned, tmp_path, capsys):
    """predict --explain, visualize (its step-by-step figure included) and faithfulness read the
    encoder's own attention, and never rank or erase [CLS] and [SEP], which are no word."""
    workdir = str(tmp_path / "copy")
    shutil.copytree(finetuned, workdir)
    proc = run_here(
        "experiments.predict",
        f"--workdir={workdir}",
        "--explain",
        "--json",
        "a dull film",
        capsys=capsys,
    )
    assert proc.returncode == 0
    e = json.loads(proc.stdout)["explain"]
    assert e["removed"] == 3 and 0.0 <= e["without_attended"] <= 1.0
    assert (
        {t for t, _ in e["attention"]}
        == {t for t, _ in e["leave_one_out"]}
        == {
            "a",
            "dull",
            "film",
        }
    )
    proc = run_here(
        "experiments.visualize",
        f"--workdir={workdir}",
        "--steps",
        "--layer=1",
        "--head=3",
        "a dull film",
        capsys=capsys,
    )
    assert proc.returncode == 0, proc.stderr
    out = os.path.join(workdir, "visualize")
    heads = {f"text1_layer{lay}_head{h}.png" for lay in (0, 1) for h in range(4)}
    assert set(os.listdir(out)) == heads | {"text1_steps_layer1_head3.png", "attention.html"}
    with open(os.path.join(out, "attention.html"), encoding="utf-8") as f:
        html = f.read()
    assert "layer 1 head 3 of 4 | score scaled_dot" in html
    trained = serving.load(workdir)
    ids = serving.encode(trained, "a dull film")
    steps = maps.attention_steps(trained.params, trained.cfg, ids, 1)
    drawn = maps.analyse(trained.params, trained.cfg, ids, None)["attention"][1]
    # Two float32 paths to layer 1's weights (the step-by-step one and the forward pass) round
    # apart by up to the encoder's float32 error: a fixed 1e-6 once failed at 1.19e-6.
    assert_close32(steps.weights_HxLxL, drawn, encoder_terms(trained.cfg.encoder, len(ids)))
    proc = run_here(
        "experiments.visualize", f"--workdir={workdir}", "--layer=2", "a film", capsys=capsys
    )
    assert_one_line_error(proc, "the model has 2 layer(s)")
    result = faithfulness.faithfulness(workdir, "test", limit=6)
    assert result["unavailable"] == {} and set(result["methods"]) == set(faithfulness.METHODS)
    loaded = encoding.load(
        trained.config.data, ("test",), add_cls=False, tokenizer=trained.tokenizer
    )
    drawn_ids = [
        loaded.splits["test"].ids[i] for i in faithfulness.sample(len(loaded.splits["test"].ids), 6)
    ]
    words = [len(ids) - 2 for ids in drawn_ids]  # [CLS] and [SEP] are no candidates
    assert result["num_texts"] == 6 and result["median_tokens"] == np.median(words)


def test_export_writes_a_classifier_that_predict_reads_back_as_the_workdir(
    finetuned, tmp_path, capsys
):
    """python -m experiments.export of the mean-pooled fine-tune: config.json names the class,
    labels and family transformers needs, the weights are the served ones alone, and predict
    --pretrained on the directory answers as predict --workdir does (the same float32
    computation, padded to other lengths: rounding apart)."""
    out = tmp_path / "exported"
    proc = run_here("experiments.export", f"--workdir={finetuned}", f"--out={out}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    hf = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert hf["architectures"] == [heads.MEAN_POOLED] and hf["model_type"] == "bert"
    assert hf["num_labels"] == 2 and hf["problem_type"] == "single_label_classification"
    assert hf["id2label"] == {"0": "neg", "1": "pos"} and hf["label2id"] == {"neg": 0, "pos": 1}
    assert hf["auto_map"]["AutoModelForSequenceClassification"].endswith(heads.MEAN_POOLED)
    written = {"model.safetensors", "vocab.txt", "tokenizer_config.json", "README.md"}
    assert written | {hub_dir.MODELING_FILE} <= set(os.listdir(out))
    trained = serving.load(finetuned)
    want = encoder_classifier.checkpoint_tensors(trained.params, trained.cfg)
    with safe_open(out / "model.safetensors", "np") as f:  # the served weights, nothing more
        assert set(f.keys()) == set(want)
        for name in want:
            np.testing.assert_array_equal(f.get_tensor(name), want[name], err_msg=name)
    texts = ["a dull film", "the film was great and moving", "the film 7 was bad"]
    answers = []
    for source in (f"--workdir={finetuned}", f"--pretrained={out}"):
        proc = run_here("experiments.predict", source, "--json", *texts, capsys=capsys)
        assert proc.returncode == 0, proc.stderr
        answers.append([json.loads(line) for line in proc.stdout.splitlines()])
    for ours, exported in zip(*answers, strict=True):
        assert ours["label"] == exported["label"]
        assert exported["probability"] == pytest.approx(ours["probability"], abs=1e-5)


def test_what_export_cannot_write_is_refused_in_one_line(finetuned, pretrained, tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine", encoding="utf-8")
    older = tmp_path / "older"  # no copy of the checkpoint's config.json, and its source gone
    shutil.copytree(finetuned, older)
    os.remove(older / checkpoint_tokenizer.SUBDIR / checkpoint_tokenizer.CONFIG)
    config = json.loads((older / "config.json").read_text(encoding="utf-8"))
    config["model"]["pretrained"] = str(tmp_path / "moved")
    (older / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for workdir, out, fragments in (
        (finetuned, full, ["exists and is not an empty directory"]),
        (pretrained, tmp_path / "mlm", ["pretraining workdir", "fine-tune it first"]),
        (older, tmp_path / "old", ["keeps no copy", "config.json"]),
    ):
        proc = run_here("experiments.export", f"--workdir={workdir}", f"--out={out}", capsys=capsys)
        assert_one_line_error(proc, *fragments)
    assert sorted(os.listdir(tmp_path)) == ["full", "older"]
    assert os.listdir(full) == ["keep.txt"]


def test_resume_after_interrupt_matches_the_uninterrupted_run(
    finetuned, csv, tmp_path, monkeypatch
):
    workdir = str(tmp_path / "run")
    train_interrupted(monkeypatch, _config(csv), workdir, step=5)  # after the step-3 checkpoint
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3"]
    train.train_and_evaluate(_config(csv), workdir)
    assert metric_rows(workdir) == metric_rows(finetuned)
    assert_trees_equal(saved_state(workdir, 6), saved_state(finetuned, 6))


def test_the_run_starts_from_the_checkpoint_bit_for_bit(csv, tmp_path):
    """A frozen encoder (warm_lr_scale 0) is still, after 3 steps through the loop and a
    checkpoint, exactly the checkpoint's; the head has moved."""
    loaded, enc = bert.load(TINY_BERT)
    pre = finetune.load(_config(csv))
    cfg = finetune.model_config(_config(csv), enc, 2)
    assert_trees_equal(finetune.init_params(pre, cfg)(jax.random.key(0), True)["encoder"], loaded)
    workdir = str(tmp_path / "frozen")
    config = _config(csv, optim__warm_lr_scale=0.0, train__max_steps=3)
    train.train_and_evaluate(config, workdir)
    state = saved_state(workdir, 3)
    assert_trees_equal(state["params"]["encoder"], loaded)
    head0 = finetune.init_params(pre, cfg)(jax.random.split(jax.random.PRNGKey(0))[0], True)
    assert not np.array_equal(state["params"]["head"]["w"], head0["head"]["w"])


def test_a_frozen_encoder_is_not_differentiated(csv):
    """warm_lr_scale 0: the train step holds the encoder constant, so its gradients are zeros
    and its backward pass is not compiled (under half the full step's FLOPs), while the head's
    gradient is the full step's."""
    _, enc = bert.load(TINY_BERT)
    config = _config(csv, optim__warm_lr_scale=0.0)
    pre = finetune.load(config)
    cfg = finetune.model_config(config, enc, 2)
    tx = optim.make_optimizer(config.optim, 10, finetune.warm)
    state = optim.state_of(
        finetune.init_params(pre, cfg)(jax.random.key(0), True), tx, jax.random.key(1)
    )
    r = np.random.default_rng(0)
    batch = {
        "tokens": r.integers(5, enc.vocab_size, (4, 16)).astype(np.int32),
        "label": np.array([0, 1, 0, 1], np.int32),
        "weight": np.ones(4, np.float32),
    }
    kw = dict(cfg=cfg, tx=tx, label_smoothing=0.0, penalty_weight=0.0)
    steps = {
        name: jax.jit(functools.partial(classify.train_step, **kw, **extra))
        for name, extra in (("full", {}), ("frozen", {"frozen": finetune.warm}))
    }
    flops = {
        name: step.lower(state, batch).compile().cost_analysis()["flops"]
        for name, step in steps.items()
    }
    assert flops["frozen"] < 0.5 * flops["full"]  # about a third here
    (full, m_full), (frozen, m_frozen) = (steps[n](state, batch) for n in ("full", "frozen"))
    assert_trees_equal(frozen["params"]["encoder"], state["params"]["encoder"])
    # One Adam step: the init plus the learning rate times the gradient's sign (g / (|g| + 1e-8),
    # whatever the clipping and the gradient's own rounding), a few float32 operations on w.
    w = full["params"]["head"]["w"]
    assert_close32(frozen["params"]["head"]["w"], w, 8, scale=np.abs(w).max())
    assert m_frozen["loss"] == pytest.approx(
        float(m_full["loss"]), abs=tol32(encoder_terms(enc, 16))
    )


def test_attention_off_and_random_weights_train_through_the_same_command(csv, tmp_path):
    """pretrained_layers=0 trains the checkpoint's embeddings alone, pooled (the served config
    says 0 layers); pretrained_init=random starts the same architecture from random weights."""
    loaded, enc = bert.load(TINY_BERT)
    off = str(tmp_path / "off")
    train.train_and_evaluate(
        _config(csv, model__pretrained_layers=0, train__max_steps=3, optim__warm_lr_scale=0.0),
        off,
    )
    state = saved_state(off, 3)
    assert sorted(state["params"]["encoder"]) == sorted(k for k in loaded if k[:6] != "layer_")
    assert_trees_equal(state["params"]["encoder"]["embed"], loaded["embed"])
    assert serving.load(off).cfg.encoder.num_layers == 0
    rand = _config(csv, model__pretrained_init="random")
    pre = finetune.load(rand)
    assert pre.random and pre.describe().startswith("training from random weights")
    params = finetune.init_params(pre, finetune.model_config(rand, enc, 2))(jax.random.key(0), True)
    assert jax.tree.structure(params["encoder"]) == jax.tree.structure(loaded)
    assert not np.array_equal(params["encoder"]["embed"]["tokens"], loaded["embed"]["tokens"])
    assert finetune.load(_config(csv, model__pretrained_layers=1)).encoder.num_layers == 1
    with pytest.raises(UserError, match="pretrained_layers=3: .* has 2 layers"):
        finetune.load(_config(csv, model__pretrained_layers=3))


def test_a_fine_tune_fits_its_tfidf_baseline_on_the_texts_words(csv, tmp_path, capsys):
    """The checkpoint's tokenizer has no n-grams of its own: the baseline takes the words of
    English text and the characters of Chinese, as data.tokenizer=auto would."""
    workdir = str(tmp_path / "b")
    result = train.train_and_evaluate(
        _config(csv, train__baseline=True, train__max_steps=2), workdir
    )
    assert result["baseline"]["features"].startswith("word 1-2-grams")
    with open(os.path.join(workdir, "baseline.json"), encoding="utf-8") as f:
        assert json.load(f)["num_train"] > 0
    assert "baseline: fitting word 1-2-gram TF-IDF" in capsys.readouterr().err
    assert baseline.features("pretrained", ["这本书很好看，值得一读"]) == ("char", (1, 3))


def test_layer_decay_and_the_linear_schedule():
    scales = finetune.layer_scales(("layer_0", "layer_1"), decay=0.5)
    params = {
        "encoder": {
            "embed": {"t": 0},
            "layer_0": {"w": 0},
            "layer_1": {"w": 0},
            "pooler": {"w": 0},
        },
        "head": {"w": 0},
    }
    got = scales(params)
    assert got["encoder"] == {
        "embed": {"t": 0.125},
        "layer_0": {"w": 0.25},
        "layer_1": {"w": 0.5},
        "pooler": {"w": 1.0},
    }
    assert got["head"] == {"w": 1.0} and finetune.layer_scales(("layer_0",), 1.0) is None
    # One entry read at all 3 depths (ALBERT's shared layer) learns at the top depth's factor.
    shared = finetune.layer_scales(("layer_0",) * 3, decay=0.5)(params)["encoder"]
    assert shared["embed"] == {"t": 0.0625} and shared["layer_0"] == {"w": 0.5}
    config = finetune_config.get_config("tiny")
    lr = config.optim.learning_rate
    schedule = optim._schedule(config.optim, lr, warmup=2, total=10)
    assert [float(schedule(s)) for s in (0, 2, 6, 10)] == pytest.approx([0.0, lr, lr / 2, 0.0])


def test_layer_decay_scales_each_layers_update(csv, tmp_path):
    """Through make_optimizer: one Adam step moves layer 0 by decay**2 of what the head moves
    (Adam's first step is lr * sign, so the ratio is the factor)."""
    config = _config(csv, optim__layer_decay=0.5, optim__weight_decay=0.0, optim__warmup_steps=0)
    scales = finetune.layer_scales(("layer_0", "layer_1"), 0.5)
    tx = optim.make_optimizer(config.optim, 10, finetune.warm, scales)
    params = {
        "encoder": {"layer_0": {"w": np.zeros(3, np.float32)}},
        "head": {"w": np.zeros(3, np.float32)},
    }
    grads = jax.tree.map(lambda x: x + 1.0, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    ratio = np.asarray(updates["encoder"]["layer_0"]["w"]) / np.asarray(updates["head"]["w"])
    assert_close32(ratio, 0.25, 4)


def test_frozen_encoders_gradients_do_not_shrink_the_heads_by_clipping(csv):
    """With warm_lr_scale 0 the head steps as it would alone: the encoder's gradients are zeroed
    before clipping by global norm, not counted in the norm and then discarded. (Two steps with
    different encoder gradients: Adam undoes one constant factor, not a changing one.)"""
    config = _config(csv, optim__warm_lr_scale=0.0, optim__warmup_steps=0)
    config.optim.clip_norm = 1.0
    params = {
        "encoder": {"layer_0": {"w": np.zeros(3, np.float32)}},
        "head": {"w": np.zeros(3, np.float32)},
    }
    head_grad = np.full(3, 0.5, np.float32)
    tx, alone = (
        optim.make_optimizer(config.optim, 10, finetune.warm),
        optim.make_optimizer(config.optim, 10),
    )
    state, alone_state = tx.init(params), alone.init({"head": params["head"]})
    for encoder_grad in (100.0, 1.0):
        grads = {
            "encoder": {"layer_0": {"w": np.full(3, encoder_grad, np.float32)}},
            "head": {"w": head_grad},
        }
        updates, state = tx.update(grads, state, params)
        head = {"head": params["head"]}
        want, alone_state = alone.update({"head": {"w": head_grad}}, alone_state, head)
        np.testing.assert_array_equal(updates["encoder"]["layer_0"]["w"], 0.0)
        assert_close32(
            updates["head"]["w"], want["head"]["w"], 12, scale=np.abs(want["head"]["w"]).max()
        )


def _tokenizer_json_dir(tmp_path: Path) -> Path:
    """tiny_bert with a tokenizer.json (built from its vocab.txt) that pads and truncates to
    fixed lengths by itself, as the shipped ones do."""
    import tokenizers as hf

    d = tmp_path / "with_json"
    d.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(TINY_BERT / name, d / name)
    tok = hf.implementations.BertWordPieceTokenizer(str(TINY_BERT / "vocab.txt"), lowercase=True)
    tok.enable_padding(length=16)
    tok.enable_truncation(max_length=6)
    tok.save(str(d / "tokenizer.json"))
    return d


@pytest.mark.parametrize("source", ["vocab.txt", "tokenizer.json"])
def test_the_checkpoints_tokenizer_round_trips_through_the_workdir(tmp_path, source):
    directory = TINY_BERT if source == "vocab.txt" else _tokenizer_json_dir(tmp_path)
    tok = checkpoint_tokenizer.CheckpointTokenizer(directory)
    text = "The film was GREAT, not boring at all and the plot moved me. Xyzzy!"
    ids = tok.encode(text)
    assert len(ids) > 6  # the file's own truncation (and padding to 16) is off
    assert tok.pad_id == 0 and (tok.cls_id, tok.sep_id) == (6, 7)
    workdir = tmp_path / "workdir"
    tok.save(workdir)
    back = tokenizers.load_tokenizer(workdir)
    assert isinstance(back, checkpoint_tokenizer.CheckpointTokenizer)
    np.testing.assert_array_equal(back.encode(text), ids)
    assert back.tokens(ids) == tok.tokens(ids) and back.vocab_size == 99
    assert back.decode(ids) == text.lower()[: len(back.decode(ids))]
    np.testing.assert_array_equal(back.encode(back.decode(ids)), ids)
    # Framed and cut as training does: [CLS], head and tail of the text, [SEP].
    (cut,) = encoding.encode(back, [text], max_len=10, add_cls=False, tail_len=3)
    assert cut.tolist() == [6, *ids[:5], *ids[-3:], 7]
    # What the bag reads of it (data.bag_len) is framed alike, with the same share of the end
    # (12 of the 14 after the frame, 3/8 of them: 4), and no attn CLS even with [CLS] pooling.
    data = types.SimpleNamespace(max_len=10, tail_len=3, bag_len=14)
    split = encoding.encode_split(back, [text], np.zeros(1, np.int32), data, add_cls=True)
    assert split.ids[0].tolist() == cut.tolist() and len(ids) > 12
    assert split.bag_ids[0].tolist() == [6, *ids[:8], *ids[-4:], 7]


def test_a_tokenizer_that_pads_with_another_id_gives_attn_ids_that_pad_with_0(tmp_path):
    """[PAD] at id 1 (as RoBERTa's <pad>): attn's ids exchange 1 and 0, so batches still pad
    with 0, the id at 0 reads as 1, and tokens and decoding undo the exchange."""
    d = tmp_path / "pad1"
    d.mkdir()
    vocab = (TINY_BERT / "vocab.txt").read_text(encoding="utf-8").split("\n")
    vocab[0], vocab[1] = vocab[1], vocab[0]  # [PAD] at id 1, [unused0] at 0
    (d / "vocab.txt").write_text("\n".join(vocab), encoding="utf-8")
    tok = checkpoint_tokenizer.CheckpointTokenizer(d)
    plain = checkpoint_tokenizer.CheckpointTokenizer(TINY_BERT)
    assert tok.pad_id == 1 and 0 in tok.special_ids and (tok.cls_id, tok.sep_id) == (6, 7)
    text = "the film was great"
    np.testing.assert_array_equal(tok.encode(text), plain.encode(text))  # no 0 or 1 among them
    assert tok.tokens([0, 1, 6]) == ["[PAD]", "[unused0]", "[CLS]"]
    own = encoder_classifier.to_checkpoint(np.array([0, 1, 6]), tok.pad_id)
    assert np.asarray(own).tolist() == [1, 0, 6]


def test_the_length_is_chosen_in_the_checkpoints_tokens(csv):
    config = finetune_config.get_config()
    config.unlock()
    config.data.path = csv
    config.model.pretrained = str(TINY_BERT)
    resolved = chosen.resolve(config)
    assert resolved.data.max_len == 32 and resolved.data.tail_len == 24
    assert resolved.train.num_epochs == 4  # 30,000 / about 130 texts, at most 4


def test_data_info_reads_the_checkpoints_tokenizer(csv, capsys):
    # It used to pass config.data alone on, and then said model.pretrained was empty.
    flags = ["--config=configs/finetune.py", f"--config.model.pretrained={TINY_BERT}"]
    proc = run_here("experiments.data_info", *flags, f"--config.data.path={csv}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    head, _, *rows = proc.stdout.splitlines()
    assert "tokenizer pretrained  vocab_size 99  max_len 32" in head
    # Each text is "the film <i> was <a> and <b>": 7 word pieces, the number tiny_bert's only
    # [UNK] (its vocabulary has no digits), and [CLS] and [SEP] counted as max_len counts them.
    assert [row.split()[0] for row in rows] == ["train", "validation", "test"]
    for row in rows:
        tokens, cut, unk = row.split()[-3:]
        assert (tokens, cut, unk) == ("9/9/9/9", "0.0%", "14.29%"), row


def test_a_hub_id_is_downloaded_once_for_the_encoder_and_its_tokenizer(csv, capsys, monkeypatch):
    # model.pretrained used to be refused unless it was a directory ("is not a directory").
    asked = []

    def snapshot_download(repo_id, allow_patterns):
        asked.append((repo_id, tuple(allow_patterns)))
        return str(TINY_BERT)

    monkeypatch.setitem(
        sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download)
    )
    flags = ["--config=configs/finetune.py", "--config.model.pretrained=someone/tiny-bert"]
    proc = run_here("experiments.data_info", *flags, f"--config.data.path={csv}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert "tokenizer pretrained  vocab_size 99" in proc.stdout
    assert {repo for repo, _ in asked} == {"someone/tiny-bert"}
    assert {"vocab.txt", "tokenizer.json", "spm.model", "model*.safetensors"} <= set(asked[0][1])


def test_a_hub_id_that_cannot_be_downloaded_is_one_line(csv, tmp_path, capsys, monkeypatch):
    def offline(repo_id, allow_patterns):
        raise OSError("Name or service not known")

    monkeypatch.setitem(
        sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=offline)
    )
    workdir = str(tmp_path / "w")
    proc = run_here(
        "experiments.train",
        *_flags(csv, "--config.model.pretrained=bert-base-chinese"),
        f"--workdir={workdir}",
        capsys=capsys,
    )
    assert_one_line_error(
        proc, "bert-base-chinese is no local directory", "download failed", "pass a directory"
    )
    assert not os.path.exists(os.path.join(workdir, "config.json"))


def test_what_fine_tuning_cannot_do_is_refused_in_one_line(csv, tmp_path, capsys):
    workdir = str(tmp_path / "w")
    for more, fragments in (
        (
            ["--config.optim.adversarial_eps=1.0", "--config.model.ngram_buckets=64"],
            ["optim.adversarial_eps=1.0", "model.ngram_buckets=64"],
        ),
        (["--config.model.pooling=max"], ["model.pooling='max' (cls or mean)"]),
        (
            ["--config.model.num_layers=2", "--config.model.d_model=32"],
            ["model.d_model, model.num_layers: with model.pretrained", "pretrained_layers=N"],
        ),
        (["--config.model.pretrained=" + str(tmp_path)], ["no config.json"]),
        (["--config.model.pretrained=" + str(tmp_path / "none")], ["none: no such directory"]),
    ):
        proc = run_here(
            "experiments.train", *_flags(csv, *more), f"--workdir={workdir}", capsys=capsys
        )
        assert_one_line_error(proc, *fragments)
        assert not os.path.exists(os.path.join(workdir, "config.json"))
    proc = run_here(
        "experiments.train",
        "--config=configs/finetune.py:tiny",
        f"--config.data.path={csv}",
        f"--workdir={workdir}",
        capsys=capsys,
    )
    assert_one_line_error(proc, "set --config.model.pretrained=DIR")


def test_a_fine_tune_with_the_bag_starts_from_naive_bayes_and_is_served_as_trained(
    csv, tmp_path, monkeypatch
):
    """The train command with the bag (naive Bayes start, reading up to data.bag_len): at step 0
    the encoder is the checkpoint's bit for bit and the table holds the training split's ratios
    (each sentiment word's unigram votes for its class); the bag trains, and evaluate and predict
    read it as training did."""
    made = []
    real = finetune.init_params

    def recording(pre, cfg, bag_start=None):
        make = real(pre, cfg, bag_start)

        def init(key, fresh):
            params = make(key, fresh)
            made.append(jax.tree.map(np.array, params))  # copies: the train step donates them
            return params

        return init

    monkeypatch.setattr(finetune, "init_params", recording)
    workdir = str(tmp_path / "bag")
    more = (
        "--config.model.bag_buckets=4096",
        "--config.optim.bag_init=naive_bayes",
        "--config.data.bag_len=64",
    )
    argv = ["train", *_flags(csv, *more), f"--workdir={workdir}"]
    assert cli.run(train.define_flags, train.main, argv) == 0
    (start,) = made
    loaded, _ = bert.load(TINY_BERT)
    assert_trees_equal(start["encoder"], loaded)
    trained = serving.load(workdir)
    cfg = trained.cfg
    assert isinstance(cfg, encoder_classifier.Config) and cfg.bag_buckets == 4096
    tok = trained.tokenizer
    for words, label in ((POS, 1), (NEG, 0)):
        ids = np.array([[int(tok.encode(w)[0]) for w in words]], np.int32)
        rows = start["bag"][np.asarray(encoder_classifier.bag_ids(ids, cfg))[0, 0]]  # unigrams
        assert (rows[:, label] > 0.1).all() and (rows[:, 1 - label] < -0.1).all(), words
    state = saved_state(workdir, 6)
    assert set(state["params"]) == {"encoder", "head", "bag"}
    assert not np.allclose(state["params"]["bag"], start["bag"], atol=1e-6)
    best = max(r["accuracy"] for r in metric_rows(workdir) if r["split"] == "validation")
    assert evaluate.evaluate_workdir(workdir, "validation")["accuracy"] == pytest.approx(best)
    d = trained.config.data
    s = encoding.load(d, ("validation",), add_cls=False, tokenizer=tok).splits["validation"]
    assert s.bag_ids is not None
    dp = parallel.data_parallel(d)
    probs_NxC, _ = classify.probabilities(
        trained.params, cfg, s.ids, s.labels, data=d, dp=dp, bag_ids=s.bag_ids
    )
    for i in range(3):
        got = predict.predict_one(trained, s.texts[i], top=1)
        want = float(probs_NxC[i].max())
        terms = encoder_terms(cfg.encoder, 32) + 2 * 64  # the encoder's 32 tokens, the bag's 64
        assert got["probability"] == pytest.approx(want, abs=tol32(terms))
    # A text cut for the encoder and read longer by the bag: each token the bag reads is placed
    # where the encoder has it, [CLS] and [SEP] included, so an erasure removes it from both.
    long_text = " ".join(["the film was great and moving"] * 12)
    ids_L, bag_G = serving.encode(trained, long_text), serving.encode_bag(trained, long_text)
    source_G = ranking.bag_source(trained, long_text)
    inside = source_G >= 0
    assert len(ids_L) == 32 and len(bag_G) == 64
    assert (bag_G[inside] == ids_L[source_G[inside]]).all()
    assert sorted(source_G[inside]) == list(range(32))
    assert ranking.explain(trained, long_text)["removed"] == 3


def test_a_fine_tunes_checkpoint_from_before_the_bag_still_resumes(csv):
    """The bag's fields, absent from an older fine-tune's meta, take their defaults (no bag), so
    that run resumes; a run with the bag is a different model."""
    _, enc = bert.load(TINY_BERT)
    meta = checkpoints.new_meta(finetune.model_config(_config(csv), enc, 2), ["n", "p"], ema=False)
    old = {**meta, "model": {k: v for k, v in meta["model"].items() if not k.startswith("bag_")}}
    assert len(old["model"]) == len(meta["model"]) - 3
    assert checkpoints._run_fields(old) == checkpoints._run_fields(meta)
    bagged = finetune.model_config(_config(csv, model__bag_buckets=64), enc, 2)
    bag_meta = checkpoints.new_meta(bagged, ["n", "p"], ema=False)
    assert checkpoints._run_fields(bag_meta) != checkpoints._run_fields(old)
    assert workdir_reader.model_config(old, "old") == finetune.model_config(_config(csv), enc, 2)


def test_a_weight_averaged_fine_tune_is_served_and_resumed_as_trained(csv, tmp_path, monkeypatch):
    """configs/finetune.py:bag's average (optim.ema_decay) on the tiny checkpoint, with the bag:
    serving loads the averaged encoder, head and bag, whose validation accuracy is the logged
    one; a run interrupted after its first checkpoint resumes to the same averaged state."""
    config = functools.partial(
        _config,
        csv,
        optim__ema_decay=0.9,
        model__bag_buckets=4096,
        optim__bag_init="naive_bayes",
    )
    whole = str(tmp_path / "whole")
    train.train_and_evaluate(config(), whole)
    state = saved_state(whole, 6)
    assert set(state["ema"]) == {"encoder", "head", "bag"}
    best_step = int(os.listdir(os.path.join(whole, "best"))[0])
    loaded = serving.load(whole)
    assert_trees_equal(loaded.params, saved_state(whole, best_step, "best")["ema"])
    gap = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), state["ema"], state["params"])
    assert max(jax.tree.leaves(gap)) > 0  # the average is not the last weights
    best = max(r["accuracy"] for r in metric_rows(whole) if r["split"] == "validation")
    assert evaluate.evaluate_workdir(whole, "validation")["accuracy"] == pytest.approx(best)

    cut = str(tmp_path / "cut")
    train_interrupted(monkeypatch, config(), cut, step=5)  # after the step-3 checkpoint
    assert sorted(os.listdir(os.path.join(cut, "checkpoints"))) == ["3"]
    train.train_and_evaluate(config(), cut)
    assert metric_rows(cut) == metric_rows(whole)
    assert_trees_equal(saved_state(cut, 6), state)
