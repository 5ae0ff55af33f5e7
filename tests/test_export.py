"""Export to a transformers model directory (`experiments/exporting`), without transformers: the
directory read back by attn's own loader gives the same probabilities and the same tokenizer ids;
config.json names the class, labels and head transformers needs (auto_map and the family's own
imports for a mean-pooled classifier); the tokenizer pads and truncates nothing by itself; a
non-empty --out is refused and a failed export leaves nothing. transformers' own load of such
directories: benchmarks/transformers_check.py (its result in benchmarks/REPORT.md). predict
--pretrained serves such a directory, or a hub classifier, with no workdir."""

import ast
import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, run_here

from attn import encoder_classifier, encoders
from attn.encoders import heads
from experiments.data import checkpoint_tokenizer
from experiments.errors import UserError
from experiments.exporting import hub_dir

DATA = ROOT / "tests" / "data" / "encoders"
TEXTS = ("the film 12 was great and superb", "An AWFUL, boring movie... I hated it!")
LABELS = ("negative", "neutral", "positive")


def _model(name: str, pooling: str) -> hub_dir.Model:
    """A classifier of the tiny base checkpoint `name` with `pooling`, its head drawn at random."""
    params, enc = encoders.load(DATA / f"tiny_{name}")
    cfg = encoder_classifier.Config(encoder=enc, num_classes=3, max_len=32, pooling=pooling)
    drawn = encoder_classifier.init(jax.random.key(7), cfg)
    # A head large enough that the probabilities differ from class to class.
    drawn["head"] = jax.tree.map(lambda x: 30 * x + 0.1, drawn["head"])
    return hub_dir.Model({**drawn, "encoder": params}, cfg, LABELS)


def _export(tmp_path, name: str, pooling: str, lowercase: bool = False) -> pathlib.Path:
    model = _model(name, pooling)
    source = DATA / f"tiny_{name}"
    base = json.loads((source / "config.json").read_text(encoding="utf-8"))
    card = hub_dir.model_card(model, hub_dir.Card(name, name, "a test", None, 0, "DIR"))
    out = tmp_path / f"{name}_{pooling}"
    return hub_dir.write(out, model, base, hub_dir.Tokenizer(source, lowercase), card)


def _probabilities(params, cfg, tok, text) -> np.ndarray:
    before, after = tok.frame
    ids = np.concatenate([before, tok.encode(text), after]).astype(np.int32)[None]
    logits, _ = encoder_classifier.apply(params, ids, cfg)
    return np.asarray(jax.nn.softmax(logits))[0]


@pytest.mark.parametrize("name", ["bert", "roberta", "modernbert", "deberta-v2", "albert"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_exported_directory_reads_back_as_the_same_classifier(tmp_path, name, pooling):
    model = _model(name, pooling)
    out = _export(tmp_path, name, pooling)
    params, cfg, labels = encoder_classifier.load(out)
    assert labels == LABELS and cfg.pooling == pooling
    tok = checkpoint_tokenizer.CheckpointTokenizer(DATA / f"tiny_{name}")
    exported_tok = checkpoint_tokenizer.CheckpointTokenizer(out)
    for text in TEXTS:
        assert exported_tok.encode(text).tolist() == tok.encode(text).tolist()
        want = _probabilities(model.params, model.cfg, tok, text)
        assert np.abs(want - 1 / 3).max() > 1e-2  # a head that tells the classes apart
        # The same float32 computation on the same values: equal to float32's last bits.
        np.testing.assert_allclose(_probabilities(params, cfg, exported_tok, text), want, atol=1e-6)


def test_the_directory_and_its_files_are_as_readable_as_a_plain_write_makes_them(tmp_path):
    # mkdtemp made the directory 0700 and safetensors wrote its file 0600: another user serving
    # the export could not read it.
    umask = os.umask(0o022)
    try:
        out = _export(tmp_path, "bert", "cls")
    finally:
        os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o755
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        p.name: 0o644 for p in out.iterdir()
    }


def test_config_json_names_the_class_labels_and_head(tmp_path):
    hf = json.loads((_export(tmp_path, "modernbert", "mean") / "config.json").read_text())
    assert hf["architectures"] == ["ModernBertForSequenceClassification"]
    assert hf["classifier_pooling"] == "mean" and "auto_map" not in hf
    assert hf["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert hf["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
    assert hf["problem_type"] == "single_label_classification"
    roberta = json.loads((_export(tmp_path, "roberta", "cls") / "config.json").read_text())
    assert roberta["architectures"] == ["RobertaForSequenceClassification"]
    out = _export(tmp_path, "roberta", "mean")
    mean = json.loads((out / "config.json").read_text())
    assert mean["architectures"] == [heads.MEAN_POOLED]
    assert mean["auto_map"] == {
        "AutoModelForSequenceClassification": f"modeling_mean_pooled.{heads.MEAN_POOLED}"
    }
    assert mean["classifier_dropout"] == 0.1


def test_the_mean_pooled_class_imports_the_familys_own_base_model(tmp_path):
    for name, base in (("distilbert", "DistilBertModel"), ("xlm-roberta", "XLMRobertaModel")):
        source = (_export(tmp_path, name, "mean") / hub_dir.MODELING_FILE).read_text()
        imports = {
            (node.module, a.name, a.asname)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom)
            for a in node.names
        }
        enc = encoders.open_checkpoint(DATA / f"tiny_{name}").config
        classes = encoders.family(enc).head.classes(enc)
        assert (classes.module, base, "BaseModel") in imports
        assert (classes.module, classes.pretrained, "PretrainedBase") in imports
        assert not any(m and "modeling_bert" in m for m, _, _ in imports)


def test_the_tokenizer_pads_and_truncates_nothing_by_itself_and_lowercases_as_the_run(tmp_path):
    """all-MiniLM-L6-v2's tokenizer.json pads and truncates every text to 128: the exported one
    has neither; model_max_length is the encoder's; a run that lowercased exports a normalizer
    that lowercases first."""
    source = DATA / "tiny_roberta"
    spec = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    spec["padding"] = {"strategy": {"Fixed": 128}, "direction": "Right", "pad_id": 1}
    spec["truncation"] = {"max_length": 128, "strategy": "LongestFirst", "stride": 0}
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    model = _model("roberta", "cls")
    base = json.loads((source / "config.json").read_text(encoding="utf-8"))
    out = hub_dir.write(tmp_path / "out", model, base, hub_dir.Tokenizer(tok_dir, True), "card")
    written = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    assert written["padding"] is None and written["truncation"] is None
    assert written["normalizer"]["normalizers"][0] == {"type": "Lowercase"}
    settings = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert settings["model_max_length"] == model.cfg.encoder.max_length == 64
    run = checkpoint_tokenizer.CheckpointTokenizer(source, lowercase=True)
    exported = checkpoint_tokenizer.CheckpointTokenizer(out)
    assert exported.encode(TEXTS[1]).tolist() == run.encode(TEXTS[1]).tolist()
    assert (
        exported.encode(TEXTS[1]).tolist()
        != checkpoint_tokenizer.CheckpointTokenizer(source).encode(TEXTS[1]).tolist()
    )


def test_an_out_that_holds_files_is_refused_and_a_failed_export_leaves_nothing(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="exists and is not an empty directory"):
        _export_to(full)
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    # A bag has no transformers class: refused before anything is written.
    model = _model("bert", "mean")
    bagged = hub_dir.Model(
        {**model.params, "bag": np.zeros((8, 3), np.float32)},
        dataclasses.replace(model.cfg, bag_buckets=8),
        LABELS,
    )
    with pytest.raises(UserError, match="bag_buckets > 0"):
        hub_dir.write(
            tmp_path / "bag", bagged, {}, hub_dir.Tokenizer(DATA / "tiny_bert", False), ""
        )
    # A tokenizer that cannot be exported fails half way: nothing is left, not even a temporary.
    model = _model("deberta-v2", "cls")
    with pytest.raises(UserError, match="data.lowercase=True"):
        hub_dir.write(
            tmp_path / "half", model, {}, hub_dir.Tokenizer(DATA / "tiny_deberta-v2", True), ""
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def _export_to(out: pathlib.Path) -> None:
    model = _model("bert", "cls")
    hub_dir.write(out, model, {}, hub_dir.Tokenizer(DATA / "tiny_bert", False), "card")


def test_a_run_keeps_the_checkpoints_config_json_beside_its_tokenizer(tmp_path):
    """What export reads of the pretrained checkpoint in a workdir: its config.json, saved with
    the tokenizer files; the tokenizer reads back the same."""
    source = DATA / "tiny_deberta-v2"
    tok = checkpoint_tokenizer.CheckpointTokenizer(source)
    tok.save(tmp_path)
    saved = tmp_path / checkpoint_tokenizer.SUBDIR
    assert (saved / "config.json").read_bytes() == (source / "config.json").read_bytes()
    meta = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    again = checkpoint_tokenizer.load_saved(tmp_path, meta)
    assert again.encode(TEXTS[0]).tolist() == tok.encode(TEXTS[0]).tolist()


def test_the_model_card_says_the_labels_the_test_accuracy_and_how_to_load():
    test = {"accuracy": 0.8512, "macro_f1": 0.8, "num_examples": 1018, "step": 60}
    card = hub_dir.Card("all-MiniLM-L6-v2", "bert", "step 60", test, 8, "out/ft")
    mean = hub_dir.model_card(_model("bert", "mean"), card)
    assert "85.12% on 1,018 held-out texts" in mean and "| 2 | positive |" in mean
    assert "trust_remote_code=True" in mean and hub_dir.MODELING_FILE in mean
    assert "the first 24 and last 8 tokens" in mean
    cls = hub_dir.model_card(_model("bert", "cls"), dataclasses.replace(card, test=None))
    assert "trust_remote_code" not in cls and "`BertForSequenceClassification`" in cls
    assert "Not measured" in cls


@pytest.mark.parametrize("name", ["roberta", "deberta-v2", "albert"])
def test_predict_serves_a_hub_classifier_directory_with_no_workdir(name, capsys):
    """predict --pretrained on a ...ForSequenceClassification directory: its labels, and the
    probabilities of its own head on the ids transformers' tokenizer gives (the golden file's;
    `encoder_classifier.load` agrees with transformers' logits, test_classifier_checkpoints),
    padded to another length: float32 rounding apart."""
    directory = DATA / f"tiny_{name}_classifier"
    golden = np.load(DATA / f"tiny_{name}_golden.npz")
    params, cfg, _ = encoder_classifier.load(directory)
    texts = [str(t) for t in golden["texts"][:2]]
    proc = run_here(
        "experiments.predict", f"--pretrained={directory}", "--json", *texts, capsys=capsys
    )
    assert proc.returncode == 0, proc.stderr
    golden_ids = zip(golden["text_ids"][:2], golden["text_lengths"][:2], strict=True)
    for line, (ids, n) in zip(proc.stdout.splitlines(), golden_ids, strict=True):
        answer = json.loads(line)
        ours = encoder_classifier.to_checkpoint(ids[:n], cfg.encoder.pad_id)  # an involution
        logits, _ = encoder_classifier.apply(params, jnp.asarray(ours)[None], cfg)
        want = np.asarray(jax.nn.softmax(logits))[0]
        assert answer["label"] == LABELS[int(want.argmax())]
        assert answer["probability"] == pytest.approx(float(want.max()), abs=1e-5)


def test_predict_refuses_what_is_no_classifier_in_one_line(capsys):
    base = DATA / "tiny_roberta"
    proc = run_here("experiments.predict", f"--pretrained={base}", "a film", capsys=capsys)
    assert_one_line_error(proc, "not a sequence classifier", "RobertaForSequenceClassification")
    proc = run_here(
        "experiments.predict", "--workdir=w", f"--pretrained={base}", "a film", capsys=capsys
    )
    assert_one_line_error(proc, "one of --workdir=DIR and --pretrained")
