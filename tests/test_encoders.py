"""Every encoder family in `attn.encoders`, against transformers itself: the tiny random-init
checkpoints in tests/data/encoders (written by transformers' PyTorch models, with their goldens,
by tests/data/encoders/make_tiny.py) load and encode within float32 error of PyTorch's last hidden
states on every real position; the checkpoint's own tokenizer gives transformers' ids; a broken
checkpoint of each is refused in one line naming the fault; and configs/finetune.py fine-tunes
each, then evaluate, predict and visualize --steps serve the workdir.

Family-specific checks (options refused, positions, windows, disentangled scores) live in each
family's own test file."""

import ast
import dataclasses
import json
import pathlib
import random

import jax
import numpy as np
import pytest
from conftest import ROOT, assert_trees_equal, ctrl_c_at_batch, run_here
from safetensors.numpy import load_file, save_file

import attn
from attn import encoders
from experiments import cli, serving, train
from experiments.data import checkpoint_tokenizer

DATA = ROOT / "tests" / "data" / "encoders"
# Float32 through 2-3 blocks of width 32 with values up to about 5: a few units of float32's
# 6e-8 relative rounding per operation, summed over the D = 32 terms of each dot product and
# carried through the layers, stays below 1e-5 of the exact values. The reference is transformers'
# own float64 forward (hidden_float64): its float32 one (hidden) is itself up to 9.6e-6 off them
# for modernbert, so two float32 computations can differ by more than 1e-5 with neither wrong
# (attn's modernbert is 4e-6 from float64, 4e-6 to 1.5e-5 from PyTorch's float32, as XLA's
# optimisation level reorders its roundings).
TOL = 1e-5


def _golden_types() -> list[str]:
    """The model types with a golden file whose family attn has."""
    names = sorted(
        p.name[len("tiny_") : -len("_golden.npz")] for p in DATA.glob("tiny_*_golden.npz")
    )
    readable = set(encoders.model_types().split(", "))
    return [
        n
        for n in names
        if json.loads((DATA / f"tiny_{n}" / "config.json").read_text())["model_type"] in readable
    ]


TYPES = _golden_types()
# Goldens with a ...ForSequenceClassification directory beside them (a variant golden, made to
# reach other code paths of a family, has none).
CLASSIFIED = [n for n in TYPES if (DATA / f"tiny_{n}_classifier").is_dir()]


def _golden(name: str) -> dict:
    return dict(np.load(DATA / f"tiny_{name}_golden.npz", allow_pickle=False))


@pytest.mark.parametrize("name", TYPES)
def test_last_hidden_states_match_transformers(name):
    params, cfg = encoders.load(DATA / f"tiny_{name}")
    g = _golden(name)
    types = g["types"] if np.any(g["types"]) else None
    with jax.default_matmul_precision("float32"):
        h = np.asarray(encoders.encode(params, cfg, g["ids"], g["mask"] > 0, types))
    real = g["mask"] > 0
    assert h.shape == g["hidden_float64"].shape
    assert np.abs(h - g["hidden_float64"])[real].max() < TOL


@pytest.mark.parametrize("name", CLASSIFIED)
def test_the_classifier_checkpoint_holds_the_same_kind_of_encoder(name):
    """A ...ForSequenceClassification directory loads as the encoder (its task head skipped) of
    the family and sizes the bare model's config.json gives."""
    _, cfg = encoders.load(DATA / f"tiny_{name}")
    params, cfg_clf = encoders.load(DATA / f"tiny_{name}_classifier")
    assert encoders.family(cfg_clf) is encoders.family(cfg)
    assert (cfg_clf.d_model, cfg_clf.num_layers) == (cfg.d_model, cfg.num_layers)
    assert encoders.param_count(params) == encoders.param_count(
        encoders.init(jax.random.key(0), cfg_clf)
    )


@pytest.mark.parametrize("name", TYPES)
def test_the_config_json_keys_a_family_writes_read_back_as_its_config(name):
    """to_hf(cfg) alone (no other key of the checkpoint's config.json) reads back as cfg: what
    an exported checkpoint's config.json must say of its encoder. Another layer count reads back
    as that count."""
    ck = encoders.open_checkpoint(DATA / f"tiny_{name}")
    fam, cfg = ck.family, ck.config
    back = fam.from_hf(
        {"model_type": ck.hf["model_type"], **fam.to_hf(cfg)}, frozenset(ck.names), ""
    )
    assert back == cfg
    fewer = dataclasses.replace(cfg, num_layers=1)
    assert fam.from_hf({**ck.hf, **fam.to_hf(fewer)}, frozenset(ck.names), "") == fewer


def _broken(tmp_path: pathlib.Path, name: str, edit) -> pathlib.Path:
    src = DATA / f"tiny_{name}"
    out = tmp_path / "model"
    out.mkdir()
    save_file(edit(dict(load_file(src / "model.safetensors"))), out / "model.safetensors")
    (out / "config.json").write_text((src / "config.json").read_text(encoding="utf-8"))
    return out


def _refusal(path: pathlib.Path) -> str:
    with pytest.raises(encoders.CheckpointError) as e:
        encoders.load(path)
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", TYPES)
def test_a_broken_checkpoint_is_refused_in_one_line_naming_each_fault(name, tmp_path):
    tensors = load_file(DATA / f"tiny_{name}" / "model.safetensors")
    gone = sorted(k for k in tensors if ".0." in k and k.endswith("weight"))[0]
    wide = sorted(k for k in tensors if k.endswith("weight") and tensors[k].ndim == 2)[-1]

    def edit(t):
        del t[gone]
        t["encoder.extra.weight"] = np.zeros((2, 2), np.float32)
        t[wide] = np.zeros((tensors[wide].shape[0] + 1, tensors[wide].shape[1]), np.float32)
        return t

    message = _refusal(_broken(tmp_path, name, edit))
    assert f"missing tensor {gone}" in message
    assert "unknown tensor encoder.extra.weight" in message
    assert f"tensor {wide} has shape" in message


@pytest.mark.parametrize("name", TYPES)
def test_the_checkpoints_own_tokenizer_gives_transformers_ids(name):
    """experiments' reading of the family's tokenizer files (tokenizer.json, vocab.txt or a
    SentencePiece model): [CLS]/<s> + the text's ids + [SEP]/</s>, in the checkpoint's ids, are
    what transformers' AutoTokenizer gives."""
    tok = checkpoint_tokenizer.CheckpointTokenizer(DATA / f"tiny_{name}")
    g = _golden(name)
    before, after = tok.frame
    for text, n, want in zip(g["texts"], g["text_lengths"], g["text_ids"], strict=True):
        ids = np.concatenate([before, tok.encode(str(text)), after]).astype(np.int64)
        own = np.asarray(attn.encoder_classifier.to_checkpoint(ids, tok.pad_id))
        assert own.tolist() == want[:n].tolist(), str(text)


def _csv(path: pathlib.Path) -> str:
    r = random.Random(0)
    pos, neg = ["great", "superb", "good", "loved", "fun"], ["awful", "boring", "dull", "bad"]
    rows = []
    for i in range(120):
        a, b = r.sample(pos if i % 2 else neg, 2)
        rows.append(f"the film {i} was {a} and {b},{'pos' if i % 2 else 'neg'}")
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


def _finetune_flags(name: str, tmp_path: pathlib.Path) -> list[str]:
    """configs/finetune.py:tiny on the family's tiny checkpoint: 4 steps, a checkpoint every 2."""
    return [
        "--config=configs/finetune.py:tiny",
        f"--config.model.pretrained={DATA / f'tiny_{name}'}",
        f"--config.data.path={_csv(tmp_path / 'reviews.csv')}",
        "--config.train.max_steps=4",
        "--config.train.checkpoint_every_steps=2",
        "--config.train.baseline=False",
    ]


@pytest.mark.parametrize("name", TYPES)
def test_configs_finetune_trains_each_family_and_the_commands_serve_it(name, tmp_path, capsys):
    workdir = str(tmp_path / "run")
    flags = _finetune_flags(name, tmp_path)
    assert cli.run(train.define_flags, train.main, ["train", *flags, f"--workdir={workdir}"]) == 0
    trained = serving.load(workdir)
    _, cfg = encoders.load(DATA / f"tiny_{name}")
    assert attn.models.family(trained.cfg) == encoders.family(cfg).name
    proc = run_here("experiments.predict", f"--workdir={workdir}", "a dull film", capsys=capsys)
    assert proc.returncode == 0 and proc.stdout.splitlines()[1].split("\t")[0] in ("neg", "pos")
    proc = run_here("experiments.evaluate", f"--workdir={workdir}", capsys=capsys)
    assert proc.returncode == 0 and "accuracy" in proc.stdout
    proc = run_here(
        "experiments.visualize", f"--workdir={workdir}", "--steps", "a dull film", capsys=capsys
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", TYPES)
def test_each_family_resumes_after_ctrl_c_to_the_uninterrupted_params(
    name, tmp_path, capsys, monkeypatch
):
    """Ctrl-C as batch 4 is fetched (after the step-2 checkpoint), then the same command again:
    the resumed run ends with the uninterrupted one's params, bit for bit."""
    whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
    flags = _finetune_flags(name, tmp_path)
    assert cli.run(train.define_flags, train.main, ["train", *flags, f"--workdir={whole}"]) == 0
    with ctrl_c_at_batch(monkeypatch, 4):
        assert cli.run(train.define_flags, train.main, ["train", *flags, f"--workdir={cut}"]) == (
            cli.INTERRUPTED
        )
    assert cli.run(train.define_flags, train.main, ["train", *flags, f"--workdir={cut}"]) == 0
    assert "resuming from step 2" in capsys.readouterr().err
    assert_trees_equal(serving.load(cut).params, serving.load(whole).params)


@pytest.mark.parametrize("name", TYPES)
def test_gradient_times_input_is_taken_where_it_is_not_zero_by_construction(name):
    """Gradient × input over the sum the embeddings' normalisation reads is 0 by construction (a
    LayerNorm ignores its input's scale, so the gradient is orthogonal to the input): the scores
    came out at 1e-8. Taken over the first block's input they explain the prediction."""
    params_enc, enc = encoders.load(DATA / f"tiny_{name}")
    cfg = attn.encoder_classifier.Config(encoder=enc, max_len=16)
    params = {**attn.encoder_classifier.init(jax.random.key(0), cfg), "encoder": params_enc}
    g = _golden(name)
    tokens = np.asarray(attn.encoder_classifier.to_checkpoint(g["ids"], enc.pad_id))
    with jax.default_matmul_precision("float32"):
        scores = np.asarray(attn.importance.gradient(params, tokens, cfg))
    real = g["mask"] > 0
    assert np.abs(scores[real]).max() > 1e-3 and (scores[~real] == 0).all()


def test_no_family_imports_another():
    """Each family is a peer: its modules import the registry's shared modules (blocks, rules,
    fields, heads, hub, family) and their own subpackage, never another family's."""
    root = ROOT / "attn" / "encoders"
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    assert {"bert", "albert", "deberta"} <= packages
    crossing = []
    for package in sorted(packages):
        for path in sorted((root / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module:
                    named = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    named = [a.name for a in node.names]
                else:
                    continue
                for name in named:
                    parts = name.split(".")
                    if parts[:2] == ["attn", "encoders"] and len(parts) > 2:
                        if parts[2] in packages and parts[2] != package:
                            crossing.append(f"{package}/{path.name} imports {name}")
    assert not crossing, crossing
