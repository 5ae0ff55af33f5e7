"""Reading a trained run without training one: a workdir written by hand (config.json, a
tokenizer, checkpoints of a known state) is read by the one reader that serving and warm start
share, and served with exactly its weights, its labels and a description of which checkpoint
answers; what cannot be served is refused in one line. Every command that answers for a text
tokenizes it once."""

import collections
import os
import re

import jax
import numpy as np
import pytest
from conftest import ROOT, run_here

from configs import default
from experiments import fields, serving, workdirs
from experiments.data import checkpoint_tokenizer, tokenizers
from experiments.errors import UserError
from experiments.training import checkpoints, optim, warm_start, workdir_reader

LABELS = ("neg", "pos")


def _workdir(
    tmp_path,
    *,
    ema=False,
    best=True,
    finished=False,
    objective=checkpoints.CLASSIFIER,
    config=None,
):
    """A workdir as train leaves it: config.json (`config`, default.py:tiny's if None), the
    tokenizer, a best checkpoint at step 4 (if `best`) and a last one at step 6; returns it and
    the state saved at step 4."""
    workdir = str(tmp_path / "run")
    config = default.get_config("tiny") if config is None else config
    tok = tokenizers.build_tokenizer(
        "char", ["好看", "不好"], lowercase=True, min_freq=1, max_vocab=0
    )
    cfg = fields.model_config(config, tok.vocab_size, len(LABELS))
    tx = optim.make_optimizer(config.optim, 10)
    meta = checkpoints.new_meta(cfg, LABELS, ema=ema, objective=objective)
    os.makedirs(workdir)
    workdirs.write_json(os.path.join(workdir, "config.json"), config.to_dict())
    tok.save(workdir)
    states = {step: optim.init_state(jax.random.PRNGKey(step), cfg, tx, ema=ema) for step in (4, 6)}
    for which, step in ((checkpoints.BEST, 4), (checkpoints.LAST, 6)):
        if which == checkpoints.BEST and not best:
            continue
        with checkpoints.writer(workdir, which, 2) as mngr:
            checkpoints.save(mngr, step, states[step], {**meta, "best_val_accuracy": 0.75})
    if finished:
        workdirs.write_json(os.path.join(workdir, "eval_test.json"), {})
    return workdir, states


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_the_reader_gives_what_the_workdir_holds_and_reads_only_the_served_weights(tmp_path):
    workdir, states = _workdir(tmp_path, ema=True)
    held = workdir_reader.read(workdir)
    assert (held.which, held.step, held.label_names, held.served) == (
        checkpoints.BEST,
        4,
        LABELS,
        "ema",
    )
    assert held.config.to_dict() == workdirs.read_config(f"{workdir}/config.json").to_dict()
    assert held.objective == checkpoints.CLASSIFIER and held.tokenizer.vocab_size == 6
    assert held.cfg == fields.model_config(held.config, 6, len(LABELS)) and held.scripts is None
    assert held.describe() == f"the best checkpoint (step 4) of {workdir}"
    _assert_same(held.weights(), states[4]["ema"])
    embed = held.weights(lambda name: name == "embed")
    assert set(embed) == {"embed"}
    _assert_same(embed["embed"], states[4]["ema"]["embed"])
    last = workdir_reader.read(workdir, checkpoints.LAST)
    assert (last.which, last.step) == (checkpoints.LAST, 6)
    _assert_same(last.weights(), states[6]["ema"])


def test_serving_and_warm_start_read_a_workdir_through_the_one_reader(tmp_path, monkeypatch):
    workdir, _ = _workdir(tmp_path)
    reads = []
    real = workdir_reader.read
    monkeypatch.setattr(workdir_reader, "read", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    serving.load(workdir)
    src = warm_start.source(workdir)
    assert reads == [workdir, workdir] and src.step == 4
    with pytest.raises(UserError, match=re.escape("model.init_from='nowhere' does not exist")):
        warm_start.source("nowhere")


def test_the_best_checkpoint_is_served_with_its_weights_labels_and_tokenizer(tmp_path):
    workdir, states = _workdir(tmp_path, finished=True)
    t = serving.load(workdir)
    _assert_same(t.params, states[4]["params"])
    assert (t.step, t.label_names, t.tokenizer.vocab_size) == (4, LABELS, t.cfg.vocab_size)
    assert t.source == f"the best checkpoint (step 4, validation accuracy 0.7500) of {workdir}"
    ids = serving.encode(t, "好看好看")
    assert ids.dtype == np.int32 and len(ids) == 4 and (ids > tokenizers.CLS).all()


def test_the_weight_average_is_served_when_the_run_kept_one(tmp_path):
    workdir, states = _workdir(tmp_path, ema=True)
    _assert_same(serving.load(workdir).params, states[4]["ema"])


def test_an_unfinished_run_answers_but_says_so(tmp_path):
    workdir, states = _workdir(tmp_path, best=False)
    t = serving.load(workdir)  # no evaluation yet: the last checkpoint
    _assert_same(t.params, states[6]["params"])
    assert t.source == (
        f"the last checkpoint (step 6) of {workdir}; training has not finished "
        "(last checkpoint: step 6)"
    )


@pytest.mark.parametrize(
    "damage, message",
    [
        ("pretraining", "is a pretraining workdir: it predicts hidden tokens, not labels"),
        ("no config", "has no config.json; is it a training workdir?"),
        ("no checkpoint", "holds no checkpoint yet; train (or resume) first"),
        ("other vocabulary", "ids but the checkpoint expects"),
        ("missing", "does not exist; train first with experiments.train"),
    ],
)
def test_what_cannot_be_served_is_refused_in_one_line(tmp_path, damage, message):
    objective = checkpoints.MASKED_LM if damage == "pretraining" else checkpoints.CLASSIFIER
    workdir, _ = _workdir(tmp_path, objective=objective)
    if damage == "no config":
        os.remove(os.path.join(workdir, "config.json"))
    elif damage == "no checkpoint":
        for which in (checkpoints.BEST, checkpoints.LAST):
            for step in os.listdir(os.path.join(workdir, which)):
                os.rename(os.path.join(workdir, which, step), os.path.join(workdir, f"x{step}"))
    elif damage == "other vocabulary":
        tokenizers.build_tokenizer("char", ["好"], lowercase=True, min_freq=1, max_vocab=0).save(
            workdir
        )
    elif damage == "missing":
        workdir += "_not_there"
    with pytest.raises(UserError, match=re.escape(message)) as e:
        serving.load(workdir)
    assert "\n" not in str(e.value)


@pytest.fixture
def tokenized(monkeypatch) -> collections.Counter:
    """How often each text goes through a tokenizer: attn's own splits it into tokens, a
    checkpoint's library encodes it."""
    calls: collections.Counter = collections.Counter()
    split = tokenizers.VocabTokenizer.split
    monkeypatch.setattr(
        tokenizers.VocabTokenizer,
        "split",
        lambda tok, text: calls.update([text]) or split(tok, text),
    )

    class Counted:  # the library's tokenizer, its encode counted
        def __init__(self, hf):
            self.hf = hf

        def encode(self, text, **kwargs):
            calls.update([text])
            return self.hf.encode(text, **kwargs)

        def __getattr__(self, name):
            return getattr(self.hf, name)

    read = checkpoint_tokenizer._read

    def counted(directory):
        hf, files = read(directory)
        return Counted(hf), files

    monkeypatch.setattr(checkpoint_tokenizer, "_read", counted)
    return calls


def _tokenized_once(calls, capsys, command, *args, texts) -> str:
    """`command`'s stdout, once it has tokenized each of `texts` exactly once."""
    calls.clear()
    proc = run_here(command, *args, capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    assert calls == dict.fromkeys(texts, 1), (command, args)
    return proc.stdout


@pytest.mark.filterwarnings("ignore:No artists with labels")  # a workdir with no metrics: no curves
def test_each_command_tokenizes_each_text_once(tmp_path, tokenized, capsys):
    """predict of one text (and with --explain), predict --path over a file and visualize take a
    text's ids, its bag's, its words and the note on what was read from one reading of it: on a
    model whose bag reads more of a text than attention does, and on a checkpoint's classifier
    with its word pieces."""
    config = default.get_config("tiny")
    config.model.bag_buckets, config.data.bag_len, config.data.tail_len = 64, 128, 8
    workdir, _ = _workdir(tmp_path, config=config)
    long, short = "好看" * 40 + "不好", "不好看"  # the long one cut for attention, not for the bag
    rows = tmp_path / "rows.csv"
    for source, texts in (
        (f"--workdir={workdir}", [long, short, "好 看"]),
        (
            f"--pretrained={ROOT / 'tests/data/encoders/tiny_bert_classifier'}",
            ["a toaster", "dull"],
        ),
    ):
        predict = ("experiments.predict", source)
        _tokenized_once(tokenized, capsys, *predict, texts[0], texts=texts[:1])
        out = _tokenized_once(tokenized, capsys, *predict, "--explain", texts[0], texts=texts[:1])
        assert out.splitlines()[1].split("\t")[3] != "-"  # explained, not refused as unknown
        rows.write_text("text\n" + "".join(f"{t}\n" for t in texts), encoding="utf-8")
        _tokenized_once(tokenized, capsys, *predict, f"--path={rows}", texts=texts)
    out = f"--out={tmp_path / 'vis'}"
    _tokenized_once(
        tokenized,
        capsys,
        "experiments.visualize",
        f"--workdir={workdir}",
        out,
        long,
        short,
        texts=[long, short],
    )
