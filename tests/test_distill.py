"""Distillation (configs/distill.py) end to end on a small Chinese file: a tiny teacher trained on
it teaches a tiny student, which resumes exactly, reads its teacher's outputs back instead of
computing them again, is served like any attn workdir, and is refused in one line, with nothing
written, for each teacher or config that cannot teach it. The transfer set's augmentation and
composition, unit by unit."""

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    ROOT,
    _built_once,
    assert_one_line_error,
    assert_trees_equal,
    metric_rows,
    run_here,
    saved_state,
    train_interrupted,
)
from safetensors.numpy import load_file, save_file

from configs import default as default_config
from configs import distill as distill_config
from experiments import cli, parallel, predict, serving, train
from experiments.data import chosen, datasets, encoding, transfer
from experiments.data.splits import normalize
from experiments.errors import UserError
from experiments.training import distill, teacher

POS = ["很好", "满意", "喜欢", "推荐", "不错", "精彩"]
NEG = ["很差", "失望", "退货", "垃圾", "糟糕", "无聊"]
THINGS = ["这本书", "质量", "物流", "包装", "价格", "服务"]


def _write_csv(path: Path, n: int = 240) -> str:
    r = random.Random(0)
    rows = []
    for i in range(n):
        label = i % 2
        a, b = r.sample(POS if label else NEG, 2)
        rows.append(f"{r.choice(THINGS)}{a}，{b}，第{i}次买,{'pos' if label else 'neg'}")
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


def _student_config(csv: str, teacher_dir: str, **overrides):
    config = distill_config.get_config("tiny")
    config.unlock()
    config.data.dataset = "file"
    config.data.path = csv
    config.distill.teacher = teacher_dir
    for key, value in overrides.items():
        section, field = key.split("__")
        config[section][field] = value
    return config


def _student_flags(csv: str, teacher_dir: str, workdir: str) -> list[str]:
    return [
        "--config=configs/distill.py:tiny",
        "--config.data.dataset=file",
        f"--config.data.path={csv}",
        f"--config.distill.teacher={teacher_dir}",
        f"--workdir={workdir}",
    ]


@pytest.fixture(scope="module")
def csv(tmp_path_factory) -> str:
    """The labelled file, one for every xdist worker: the teacher, built once, names its path,
    and a student refuses a teacher trained on another file."""

    def write(path: str) -> None:
        os.makedirs(path)
        _write_csv(Path(path) / "reviews.csv")

    return os.path.join(_built_once(tmp_path_factory, "distill_data", write), "reviews.csv")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, csv) -> str:
    """configs/default.py:tiny trained on the file (6 steps): a workdir teacher."""

    def run(workdir: str) -> None:
        config = default_config.get_config("tiny")
        config.unlock()
        config.data.dataset, config.data.path = "file", csv
        train.train_and_evaluate(config, workdir)

    return _built_once(tmp_path_factory, "distill_teacher", run)


@pytest.fixture(scope="module")
def student(tmp_path_factory, csv, teacher_dir) -> str:
    """`python -m experiments.train --config=configs/distill.py:tiny` taught by `teacher_dir`,
    run in this process, uninterrupted. Read-only for tests."""

    def run(workdir: str) -> None:
        argv = ["train", *_student_flags(csv, teacher_dir, workdir)]
        assert cli.run(train.define_flags, train.main, argv) == 0

    return _built_once(tmp_path_factory, "distill_student", run)


def test_a_tiny_teacher_teaches_a_tiny_student_end_to_end(student, teacher_dir):
    with open(os.path.join(student, "eval_test.json"), encoding="utf-8") as f:
        test = json.load(f)
    assert test["label_names"] == ["neg", "pos"] and test["num_examples"] > 0
    rows = metric_rows(student)
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert all(np.isfinite(r["loss"]) for r in rows)
    # The outputs kept are the teacher's own answers, as predict gives them.
    with np.load(os.path.join(student, teacher.OUTPUTS)) as f:
        keys, logits = f["keys"], f["logits"]
    config = serving.load(student).config
    train_texts = encoding.load(config.data, ("train",), add_cls=False).splits["train"].texts
    assert len(keys) > len(train_texts)  # augmented copies too
    taught = serving.load(teacher_dir)
    for text in train_texts[:3]:
        (row,) = np.flatnonzero(keys == teacher.text_keys([text])[0])
        p = predict.predict_one(taught, text, top=1)
        want = np.log(p["probability"])
        got = logits[row][taught.label_names.index(p["label"])]
        assert got == pytest.approx(want, abs=1e-6)


def test_batches_carry_each_texts_teacher_logits_and_label(csv, teacher_dir, tmp_path):
    config = chosen.resolve(_student_config(csv, teacher_dir))
    data = encoding.load(config.data, add_cls=False)
    run = distill.prepare(config, data, str(tmp_path))
    labels, extra = run.arrays
    n_train = len(data.splits["train"].texts)
    assert run.labelled.sum() == n_train and len(run.split.texts) > n_train
    assert np.array_equal(labels[:n_train], data.splits["train"].labels)
    # A copy without its own label carries the teacher's choice, for the train accuracy.
    copies = ~run.labelled
    assert np.array_equal(labels[copies], extra["teacher"][copies].argmax(-1))
    index = {tuple(ids.tolist()): i for i, ids in enumerate(run.split.ids)}
    batch = next(run.batches(config, parallel.data_parallel(config.data), 0))
    for row in np.flatnonzero(batch["weight"]):
        tokens = batch["tokens"][row]
        i = index[tuple(tokens[tokens != 0].tolist())]
        np.testing.assert_array_equal(batch["teacher"][row], extra["teacher"][i])
        assert batch["label"][row] == labels[i] and batch["labelled"][row] == run.labelled[i]


def test_resume_equals_an_uninterrupted_run_and_reads_the_outputs_back(
    student, csv, teacher_dir, tmp_path, monkeypatch, capsys
):
    workdir = str(tmp_path / "resumed")
    config = _student_config(csv, teacher_dir)
    train_interrupted(monkeypatch, config, workdir, step=5)
    outputs = os.path.join(workdir, teacher.OUTPUTS)
    written = os.stat(outputs).st_mtime_ns
    capsys.readouterr()
    train.train_and_evaluate(config, workdir)
    said = capsys.readouterr().err
    assert "resuming from step 3" in said
    n = len(np.load(outputs)["keys"])
    assert f"{n:,} of {n:,} texts read from {outputs}, 0 to compute" in said
    assert os.stat(outputs).st_mtime_ns == written
    assert metric_rows(workdir) == metric_rows(student)
    for step in (3, 6):
        assert_trees_equal(saved_state(workdir, step), saved_state(student, step))


def test_outputs_are_reused_and_recomputed_for_what_changed(
    csv, teacher_dir, tmp_path, monkeypatch
):
    config = _student_config(csv, teacher_dir)
    texts = encoding.load(config.data, ("train",), add_cls=False).splits["train"].texts[:20]
    taught = teacher.load(
        teacher_dir,
        workdir=str(tmp_path),
        data=config.data,
        label_names=("neg", "pos"),
        train_texts=texts,
    )
    computed: list[int] = []
    real_logits = teacher.logits

    def counted(t, some):
        computed.append(len(some))
        return real_logits(t, some)

    monkeypatch.setattr(teacher, "logits", counted)
    first = teacher.outputs(taught, texts, str(tmp_path))
    assert computed == [20]
    again = teacher.outputs(taught, texts, str(tmp_path))
    assert computed == [20] and np.array_equal(again, first)
    more = teacher.outputs(taught, [*texts[:15], "这本书很好"], str(tmp_path))
    assert computed == [20, 1] and np.array_equal(more[:15], first[:15])
    assert len(np.load(os.path.join(tmp_path, teacher.OUTPUTS))["keys"]) == 16  # 5 dropped
    retrained = teacher.Teacher(**{**taught.__dict__, "fingerprint": "another"})
    teacher.outputs(retrained, texts, str(tmp_path))
    assert computed == [20, 1, 20]


def _english_classifier(directory: Path, labels: tuple[str, ...]) -> str:
    """tests/data/encoders/tiny_bert_classifier (an English WordPiece vocabulary) with a head of
    `labels`, its first rows: a transformers sequence classifier of those labels."""
    source = ROOT / "tests" / "data" / "encoders" / "tiny_bert_classifier"
    shutil.copytree(source, directory)
    tensors = load_file(source / "model.safetensors")
    for name in ("classifier.weight", "classifier.bias"):
        tensors[name] = np.ascontiguousarray(tensors[name][: len(labels)])
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config["id2label"] = dict(enumerate(labels))
    config["label2id"] = {n: i for i, n in enumerate(labels)}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(directory)


def test_each_teacher_that_cannot_teach_is_refused_in_one_line_with_nothing_written(
    csv, teacher_dir, student, pretrained, tmp_path, capsys
):
    other_copy = tmp_path / "elsewhere" / "reviews.csv"
    other_copy.parent.mkdir()
    shutil.copyfile(csv, other_copy)
    english = _english_classifier(tmp_path / "english", ("neg", "pos"))
    three = str(ROOT / "tests" / "data" / "encoders" / "tiny_bert_classifier")
    before = {d: sorted(os.listdir(d)) for d in (teacher_dir, student)}
    cases = [
        (csv, str(tmp_path / "none"), ["does not exist", "none"]),
        (csv, pretrained, ["is a pretraining workdir", "a teacher is a classifier"]),
        (csv, str(ROOT / "tests/data/bert/tiny_bert"), ["not a sequence classifier", "BertModel"]),
        (
            csv,
            three,
            [
                "labels ['negative', 'neutral', 'positive'] and the data ['neg', 'pos']",
                "the teacher has ['negative', 'neutral', 'positive'] the data lacks",
                "the data has ['neg', 'pos'] the teacher lacks",
            ],
        ),
        (csv, english, ["cannot read the data", "as unknown (at most 10% may be)"]),
        (str(other_copy), teacher_dir, ["was trained on data.path=", "validation and test"]),
    ]
    for i, (data, teacher_path, fragments) in enumerate(cases):
        workdir = str(tmp_path / f"refused{i}")
        proc = run_here(
            "experiments.train", *_student_flags(data, teacher_path, workdir), capsys=capsys
        )
        assert_one_line_error(proc, f"distill.teacher={teacher_path!r}", *fragments)
        assert not os.path.exists(workdir)
    # The student's own workdir as its teacher, a fine-tune as the student.
    copy = str(tmp_path / "own")
    shutil.copytree(student, copy)
    kept = sorted(os.listdir(copy))
    proc = run_here("experiments.train", *_student_flags(csv, copy, copy), capsys=capsys)
    assert_one_line_error(proc, "is the student's own workdir")
    assert sorted(os.listdir(copy)) == kept
    workdir = str(tmp_path / "finetune_student")
    flags = [*_student_flags(csv, teacher_dir, workdir), "--config.model.pretrained=x"]
    proc = run_here("experiments.train", *flags, capsys=capsys)
    assert_one_line_error(proc, "train attn's own model, and model.pretrained fine-tunes 'x'")
    assert not os.path.exists(workdir)
    assert before == {d: sorted(os.listdir(d)) for d in (teacher_dir, student)}


def test_the_explaining_commands_serve_the_student(student, tmp_path, capsys):
    workdir = str(tmp_path / "copy")
    shutil.copytree(student, workdir)
    proc = run_here(
        "experiments.predict",
        f"--workdir={workdir}",
        "--explain",
        "--json",
        "质量很好",
        capsys=capsys,
    )
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["label"] in ("neg", "pos") and answer["explain"]["removed"] == 3
    proc = run_here(
        "experiments.visualize", f"--workdir={workdir}", "--steps", "质量很好", capsys=capsys
    )
    assert proc.returncode == 0, proc.stderr
    assert "text1_steps_layer0_head0.png" in os.listdir(os.path.join(workdir, "visualize"))
    proc = run_here("experiments.faithfulness", f"--workdir={workdir}", "--limit=4", capsys=capsys)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "unit,text", [("char", "这本书的质量很好，物流也快"), ("word", "a b c d e f g h")]
)
def test_an_augmented_copy_masks_units_and_cuts_n_grams_at_the_given_rates(unit, text):
    units = list(text) if unit == "char" else text.split()
    masked = cut = 0
    for i in range(2000):
        rng = np.random.default_rng(i)
        copy = transfer.augmented(text, rng, unit=unit, mask_rate=0.2, ngram_rate=0.3)
        pieces = list(copy) if unit == "char" else copy.split()
        if len(pieces) < len(units):
            cut += 1
            assert 1 <= len(pieces) <= transfer.NGRAM_MAX[unit]
        else:
            masked += pieces.count(transfer.MASK)
            kept = [p for p, u in zip(pieces, units, strict=True) if p != transfer.MASK]
            assert kept == [u for p, u in zip(pieces, units, strict=True) if p != transfer.MASK]
    whole = 2000 - cut
    assert cut / 2000 == pytest.approx(0.3, abs=0.04)
    assert masked / (whole * len(units)) == pytest.approx(0.2, abs=0.02)


def test_the_transfer_set_is_the_training_texts_then_copies_never_held_out_texts(tmp_path):
    train_texts = [f"the film number {i} was good and fun" for i in range(30)]
    labels = np.arange(30, dtype=np.int32)  # a label per text: a copy's says whose it is
    held = ["good", "fun", "was good"]  # short n-grams a copy may be cut to
    extra = tmp_path / "more.txt"
    extra.write_text("an unlabeled text\nthe film number 3 was good and fun\ngood\n", "utf-8")
    kw = {"mask_rate": 0.1, "ngram_rate": 0.5}
    four = transfer.build(train_texts, labels, held, copies=4, **kw)
    eight = transfer.build(train_texts, labels, held, copies=8, sources=[str(extra)], **kw)
    assert four.texts[:30] == train_texts and eight.texts[: len(four.texts)] == four.texts
    assert four.labelled.sum() == 30 and not four.labelled[30:].any()
    keys = [normalize(t) for t in eight.texts]
    assert len(set(keys)) == len(keys) and not set(keys) & {normalize(t) for t in held}
    assert eight.texts[-1] == "an unlabeled text" and eight.labels[-1] == -1
    assert "an unlabeled text" not in four.texts  # a source is read only when named
    for copy, i in zip(four.texts[30:], four.labels[30:], strict=True):
        pieces, source = copy.split(), train_texts[i].split()
        assert any(
            all(p in (transfer.MASK, source[s + k]) for k, p in enumerate(pieces))
            for s in range(len(source) - len(pieces) + 1)
        ), (copy, train_texts[i])
    assert "left out because they occur in validation or test" in eight.summary
    assert transfer.unit_of(train_texts) == "word" and transfer.unit_of(["这本书很好"]) == "char"


def test_an_epoch_counts_the_augmented_copies_where_the_data_chooses_the_schedule(csv):
    from configs import csv as csv_config

    schedule = {}
    for copies in (0, 3):
        config = csv_config.get_config()
        config.unlock()
        config.data.path, config.distill.augment = csv, copies
        c = chosen.resolve(config)
        schedule[copies] = (c.train.num_epochs, c.train.eval_every_steps)
    n = len(datasets.load_splits(config.data, ("train",))["train"][0])
    epochs = schedule[0][0]
    assert schedule[0][1] == epochs * -(-n // 32) // 13
    assert schedule[3] == (epochs, epochs * -(-4 * n // 32) // 13)


_LOAD_WITHOUT_THE_REPOSITORY = """
import json, sys
# Any import of the project fails: the loader must run on jax and numpy alone.
sys.modules.update(dict.fromkeys(["attn", "experiments", "configs", "benchmarks"]))
sys.path.insert(0, sys.argv[1])
import load
model = load.Classifier(sys.argv[1])
texts = json.loads(sys.stdin.read())
print(json.dumps({"labels": model.label_names, "probs": model.probabilities(texts).tolist()}))
"""


def test_the_student_exported_with_jax_export_gives_predicts_probabilities_without_attn(
    student, tmp_path, capsys
):
    out = tmp_path / "exported"
    proc = run_here("experiments.export", f"--workdir={student}", f"--out={out}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == [
        "README.md",
        "classifier.json",
        "load.py",
        "model.jax",
        "tokenizer.json",
        "vocab.txt",
        "weights.npz",
    ]
    # Batches of any size and texts of any length, a cut one among them.
    texts = ["质量很好", "物流很差，退货了" * 12, "hello，质量很好", "第三次买，不错", "价格"]
    table = tmp_path / "texts.csv"
    table.write_text("text\n" + "\n".join(texts) + "\n", encoding="utf-8")
    predicted = tmp_path / "predicted.jsonl"
    proc = run_here(
        "experiments.predict",
        f"--workdir={student}",
        f"--path={table}",
        f"--out={predicted}",
        capsys=capsys,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in predicted.read_text(encoding="utf-8").splitlines()]
    want = np.array([[r["prob_neg"], r["prob_pos"]] for r in rows])
    loaded = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_THE_REPOSITORY, str(out)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr
    got = json.loads(loaded.stdout)
    assert got["labels"] == ["neg", "pos"]
    np.testing.assert_allclose(np.array(got["probs"]), want, rtol=0, atol=1e-6)
    script = subprocess.run(
        [sys.executable, str(out / "load.py"), texts[0]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert script.stdout == f"{rows[0]['predicted']}\t{rows[0]['probability']:.3f}\n"
    proc = run_here("experiments.export", f"--workdir={student}", f"--out={out}", capsys=capsys)
    assert_one_line_error(proc, "exists and is not an empty directory")
    proc = run_here(
        "experiments.export",
        f"--workdir={student}",
        f"--out={tmp_path / 'o'}",
        "--onnx",
        capsys=capsys,
    )
    assert_one_line_error(proc, "--onnx")
    assert not (tmp_path / "o").exists()


def test_the_benchmark_section_runs_its_rows_and_renders(csv, teacher_dir, tmp_path):
    from benchmarks import distill as bench
    from benchmarks import docs, report

    saved = []
    rows = ["tfidf", "teacher", "mse-w0.5-a1", "augmented-a1", "speed"]
    sec = bench.run(
        True, csv, teacher_dir, ["0"], rows, None, saved.append, str(tmp_path), {"0": 0.5}
    )
    part = sec["data"]["reviews.csv"]
    assert set(part["runs"]) == {"mse-w0.5-a1", "augmented-a1"}
    assert part["chosen"] == "mse-w0.5-a1"  # augmentation alone is no candidate
    recipe = part["runs"]["mse-w0.5-a1"]["recipe"]["distill"]
    assert (recipe["loss"], recipe["weight"], recipe["augment"]) == ("mse", 0.5, 1)
    assert part["runs"]["augmented-a1"]["recipe"]["distill"]["teacher"] == ""
    outputs = tmp_path / "distill" / "reviews.csv" / "mse-w0.5-a1" / "seed0" / teacher.OUTPUTS
    # A new row's workdir starts with the outputs an earlier run computed, to read them back.
    fresh = tmp_path / "distill" / "reviews.csv" / "soft-T2-w1-a1" / "seed1"
    bench._start_with_outputs(str(fresh), str(tmp_path / "distill" / "reviews.csv"))
    assert (fresh / teacher.OUTPUTS).read_bytes() == outputs.read_bytes()
    speed = part["speed"]
    assert speed["row"] == part["chosen"] and speed["forward"]["speedup"] > 0
    assert set(sec["targets"]) == {"reviews.csv: above_tfidf", "reviews.csv: speed"}
    assert len(saved) >= 5 and saved[-1] is sec
    table = docs.distill_table(part)
    assert "**(chosen on validation)**" in table and "no teacher" in table
    assert "teacher" in table and "TF-IDF" in table
    text = "\n".join(report._distill_md(sec))
    assert docs.distill_speed(part) in text and "## 14. Distillation" in text
    with pytest.raises(UserError, match="unknown row 'soft-T2'"):
        bench.run(True, csv, teacher_dir, ["0"], ["soft-T2"], None, saved.append, "x", {})


def test_unlabeled_texts_join_the_transfer_set_and_the_vocabulary_with_a_teacher(
    csv, teacher_dir, tmp_path
):
    more = tmp_path / "unlabeled.txt"
    more.write_text("包装破损，差评\n包装破损，差评了\n质量很好\n", encoding="utf-8")
    config = chosen.resolve(_student_config(csv, teacher_dir, data__unlabeled=(str(more),)))
    tok = distill.tokenizer(config, str(tmp_path))
    assert {"破", "损"} <= set(tok.vocab)  # twice in the unlabeled texts, never in the file's
    data = encoding.load(config.data, add_cls=False, tokenizer=tok)
    run = distill.prepare(config, data, str(tmp_path))
    assert run.split.texts[-3:] == ["包装破损，差评", "包装破损，差评了", "质量很好"]
    assert not run.labelled[-3:].any() and "3 from" in run.summary
    alone = _student_config(csv, "", data__unlabeled=(str(more),))
    assert distill.tokenizer(alone, str(tmp_path)) is None  # without a teacher: not read
