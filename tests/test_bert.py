"""attn.bert against transformers' Flax BERT and RoBERTa (golden files from
benchmarks/bert_reference.py) and a float64 numpy forward (attn.reference.bert); what `load`
refuses, skips and counts; padding, chunked attention, jit, vmap, grad, dropout and bfloat16.

Set ATTN_BERT_DIR to a real BERT model directory (e.g. all-MiniLM-L6-v2) to also check it."""

import dataclasses
import json
import logging
import os
import pathlib
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import attn
from attn import bert, pooling, reference

DATA = pathlib.Path(__file__).parent / "data" / "bert"
# float32 against the float32 reference and the float64 oracle, on real tokens. A margin, not a
# float32 bound: the worst case of the encoder's sums (`conftest.tol32` of `encoder_terms`) is
# 1.3e-3 on the tiny checkpoints and 7.7e-2 on all-MiniLM-L6-v2, wider than what these tests must
# catch (the tanh GELU moves the tiny BERT's states by 9.7e-4, a LayerNorm eps of 1e-6 instead of
# 1e-12 by 1.2e-5). Measured on this CPU: 2.7e-6 (tiny BERT), 1.8e-6 (tiny RoBERTa), 3.5e-6
# (all-MiniLM-L6-v2 against transformers), 2.9e-6 (against the float64 oracle).
TOL = 1e-5


def _golden(name: str) -> dict:
    g = dict(np.load(DATA / f"tiny_{name}_golden.npz"))
    return {**g, "mask": g["mask"] > 0}  # stored 1/0, as transformers takes it


def _encode(params, cfg, g, **kw):
    with jax.default_matmul_precision("float32"):
        return np.asarray(bert.encode(params, cfg, g["ids"], g["mask"], g["types"], **kw))


def _real_max_diff(a, b, mask) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))[mask > 0].max())


def _variant(tmp_path, edit=None, config=None, name="bert") -> pathlib.Path:
    """A copy of the tiny checkpoint with its tensors and config.json edited."""
    src = DATA / f"tiny_{name}"
    tensors = load_file(src / "model.safetensors")
    hf = json.loads((src / "config.json").read_text(encoding="utf-8"))
    tensors = edit(dict(tensors)) if edit else tensors
    hf.update(config or {})
    out = tmp_path / "model"
    out.mkdir()
    save_file(tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(hf), encoding="utf-8")
    return out


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_tiny_checkpoint_matches_transformers_flax(name):
    params, cfg = bert.load(DATA / f"tiny_{name}")
    g = _golden(name)
    h = _encode(params, cfg, g)
    assert h.shape == g["hidden"].shape and h.dtype == np.float32
    assert _real_max_diff(h, g["hidden"], g["mask"]) < TOL
    assert np.abs(g["hidden"]).max() > 1.0  # the comparison is not of near-zero values


def test_numpy_oracle_matches_transformers_and_attn():
    g = _golden("bert")
    hf = json.loads((DATA / "tiny_bert" / "config.json").read_text(encoding="utf-8"))
    r = reference.bert(load_file(DATA / "tiny_bert" / "model.safetensors"), hf, **_inputs(g))
    assert _real_max_diff(r, g["hidden"], g["mask"]) < TOL
    params, cfg = bert.load(DATA / "tiny_bert")
    assert _real_max_diff(_encode(params, cfg, g), r, g["mask"]) < TOL


@pytest.mark.parametrize("n", [0, 1])
def test_the_first_layers_are_the_oracles_shallower_encoder(n):
    """first_layers(n) computes what a checkpoint of n layers would: the oracle told
    num_hidden_layers=n (n=0: the embeddings' LayerNorm alone)."""
    g = _golden("bert")
    hf = json.loads((DATA / "tiny_bert" / "config.json").read_text(encoding="utf-8"))
    params, cfg = bert.load(DATA / "tiny_bert")
    assert cfg.num_layers > n
    kept, cut = bert.first_layers(params, cfg, n)
    assert cut.num_layers == n and sorted(k for k in kept if k.startswith("layer_")) == [
        f"layer_{i}" for i in range(n)
    ]
    tensors = load_file(DATA / "tiny_bert" / "model.safetensors")
    r = reference.bert(tensors, {**hf, "num_hidden_layers": n}, **_inputs(g))
    assert _real_max_diff(_encode(kept, cut, g), r, g["mask"]) < TOL
    assert _real_max_diff(_encode(params, cfg, g), r, g["mask"]) > 100 * TOL
    with pytest.raises(ValueError, match="params do not fit"):
        _encode(kept, cfg, g)  # the cut params under the full config
    with pytest.raises(ValueError, match=r"first_layers: n must be an integer in \[0, 2\]"):
        bert.first_layers(params, cfg, cfg.num_layers + 1)


def _inputs(g: dict) -> dict:
    return {"ids": g["ids"], "mask": g["mask"], "types": g["types"]}


@pytest.mark.skipif(not os.environ.get("ATTN_BERT_DIR"), reason="set ATTN_BERT_DIR to a model dir")
def test_real_checkpoint_matches_the_numpy_oracle_and_its_reference_file():
    directory = pathlib.Path(os.environ["ATTN_BERT_DIR"])
    params, cfg = bert.load(directory)
    stored = load_file(directory / "model.safetensors")
    floats = {k: v for k, v in stored.items() if v.dtype.kind == "f"}
    assert bert.param_count(params) == sum(v.size for v in floats.values())
    ref_file = DATA / f"{directory.name}_reference.npz"
    if ref_file.exists():
        g = dict(np.load(ref_file))
        g["mask"] = g["mask"] > 0  # stored 1/0, as transformers takes it; encode takes bool
    else:  # ids of a few real-looking tokens; the oracle still holds
        g = _golden("bert")
        g["ids"] = g["ids"] % 1000 + 1000 * (g["mask"] > 0)
    hf = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    h = _encode(params, cfg, g)
    r = reference.bert(floats, hf, **_inputs(g))
    assert _real_max_diff(h, r, g["mask"]) < TOL
    if "hidden" in g:
        assert _real_max_diff(h, g["hidden"], g["mask"]) < TOL


def test_init_tree_is_loads_tree():
    params, cfg = bert.load(DATA / "tiny_bert")
    shapes = jax.eval_shape(lambda: bert.init(jax.random.key(0), cfg))
    assert jax.tree.map(lambda x: x.shape, shapes) == jax.tree.map(jnp.shape, params)
    assert jax.tree.structure(shapes) == jax.tree.structure(params)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


def test_parameter_count_is_the_files_and_is_logged(caplog):
    tensors = load_file(DATA / "tiny_bert" / "model.safetensors")
    in_file = sum(v.size for k, v in tensors.items() if v.dtype.kind == "f")
    with caplog.at_level(logging.INFO, logger="attn.encoders"):
        params, cfg = bert.load(DATA / "tiny_bert")
    assert bert.param_count(params) == in_file == 20_640
    assert bert.param_count(bert.init(jax.random.key(0), cfg)) == in_file
    assert "20,640 parameters in 39 tensors" in caplog.text
    assert "skipped embeddings.position_ids" in caplog.text


def test_prefixed_hub_layout_with_heads_and_legacy_names_loads_the_same(tmp_path, caplog):
    """bert-base-uncased on the hub: "bert." prefix, cls.* pretraining heads, LayerNorm
    gamma/beta."""

    def hub(t):
        out = {}
        for k, v in t.items():
            k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            )
            out[f"bert.{k}"] = v
        out["cls.predictions.bias"] = np.zeros(99, np.float32)
        out["cls.predictions.transform.dense.weight"] = np.zeros((32, 32), np.float32)
        out["cls.seq_relationship.weight"] = np.zeros((2, 32), np.float32)
        return out

    directory = _variant(tmp_path, hub, {"architectures": ["BertForPreTraining"]})
    with caplog.at_level(logging.INFO, logger="attn.encoders"):
        params, cfg = bert.load(directory)
    expected, cfg0 = bert.load(DATA / "tiny_bert")
    assert cfg == cfg0
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), params, expected))
    assert (
        "cls.seq_relationship.weight" in caplog.text
        and "bert.embeddings.position_ids" in caplog.text
    )


def test_roberta_masked_lm_layout_loads_the_same(tmp_path):
    def hub(t):
        out = {f"roberta.{k}": v for k, v in t.items()}
        out["lm_head.dense.weight"] = np.zeros((32, 32), np.float32)
        out["lm_head.bias"] = np.zeros(99, np.float32)
        return out

    arch = {"architectures": ["RobertaForMaskedLM"]}
    params, cfg = bert.load(_variant(tmp_path, hub, arch, name="roberta"))
    expected, cfg0 = bert.load(DATA / "tiny_roberta")
    assert cfg == cfg0 and cfg.position_offset == 2
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), params, expected))


def test_a_checkpoint_without_pooler_loads_without_one(tmp_path):
    drop = lambda t: {k: v for k, v in t.items() if not k.startswith("pooler.")}
    params, cfg = bert.load(_variant(tmp_path, drop))
    assert not cfg.pooler and "pooler" not in params
    assert bert.param_count(params) == 20_640 - 32 * 32 - 32
    with pytest.raises(ValueError, match="no pooler"):
        bert.pool(params, jnp.zeros((1, 3, 32)))


def _refusal(directory) -> str:
    with pytest.raises(bert.CheckpointError) as e:
        bert.load(directory)
    assert isinstance(e.value, ValueError)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_removed_tensor_is_named(tmp_path):
    key = "encoder.layer.1.output.dense.bias"
    message = _refusal(_variant(tmp_path, lambda t: {k: v for k, v in t.items() if k != key}))
    assert f"missing tensor {key} (for params layer_1.ff2.b)" in message


def test_an_extra_tensor_is_named(tmp_path):
    key = "encoder.layer.0.attention.self.rotary.weight"
    message = _refusal(_variant(tmp_path, lambda t: {**t, key: np.ones((4,), np.float32)}))
    assert f"unknown tensor {key}" in message


def test_a_wrong_shape_is_named(tmp_path):
    key = "encoder.layer.0.intermediate.dense.weight"
    message = _refusal(_variant(tmp_path, lambda t: {**t, key: t[key].T.copy()}))
    assert f"tensor {key} has shape (32, 48) where config.json implies (48, 32)" in message


def test_every_fault_is_reported_together(tmp_path):
    def break_three(t):
        t = {k: v for k, v in t.items() if k != "pooler.dense.bias"}
        t["encoder.layer.2.output.dense.bias"] = np.zeros(32, np.float32)  # a third layer
        t["embeddings.word_embeddings.weight"] = np.zeros((98, 32), np.float32)
        t["encoder.layer.0.output.dense.bias"] = np.zeros(32, np.int32)
        return t

    message = _refusal(_variant(tmp_path, break_three))
    for part in (
        "missing tensor pooler.dense.bias",
        "unknown tensor encoder.layer.2.output.dense.bias",
        "embeddings.word_embeddings.weight has shape (98, 32) where config.json implies (99, 32)",
        "encoder.layer.0.output.dense.bias has dtype I32",
    ):
        assert part in message


def test_an_empty_bin_is_refused_naming_it(tmp_path):
    # A .bin used to be refused whatever it held; now it is read (tests/test_weight_formats.py).
    (tmp_path / "config.json").write_text(
        (DATA / "tiny_bert" / "config.json").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    message = _refusal(tmp_path)
    assert "pytorch_model.bin is not a PyTorch zip checkpoint" in message


@pytest.mark.parametrize(
    "config, named",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"architectures": ["BertLMHeadModel"]}, "architecture BertLMHeadModel is not supported"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
    ],
)
def test_an_unsupported_config_is_refused_naming_what_is_supported(tmp_path, config, named):
    message = _refusal(_variant(tmp_path, config=config))
    assert named in message
    if "model_type 'gpt2'" in message:
        assert "attn reads albert, bert, " in message and "roberta" in message
    if "architecture" in message:
        assert "BertModel, " in message and "BertForSequenceClassification" in message


def test_a_hub_id_without_huggingface_hub_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    message = _refusal("google-bert/bert-base-uncased")
    assert "not a local directory" in message and "pip install huggingface_hub" in message


def test_a_hub_id_is_downloaded_with_huggingface_hub(monkeypatch):
    calls = []

    def snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(DATA / "tiny_bert")

    fake = types.SimpleNamespace(snapshot_download=snapshot_download)
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    params, cfg = bert.load("someone/tiny-bert")
    assert calls[0][0] == "someone/tiny-bert" and "model*.safetensors" in calls[0][1]
    assert cfg.d_model == 32 and bert.param_count(params) == 20_640


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_more_padding_changes_no_real_token(name):
    params, cfg = bert.load(DATA / f"tiny_{name}")
    g = _golden(name)
    pad = lambda x, v: np.pad(x, ((0, 0), (0, 9)), constant_values=v)
    longer = {
        "ids": pad(g["ids"], cfg.pad_id),
        "mask": pad(g["mask"], 0),
        "types": pad(g["types"], 0),
    }
    h = _encode(params, cfg, g)
    h_long = _encode(params, cfg, longer)[:, : h.shape[1]]
    assert _real_max_diff(h, h_long, g["mask"]) < TOL  # float rounding of other shapes only


def test_chunked_attention_equals_the_matrix_form():
    params, cfg = bert.load(DATA / "tiny_bert")
    g = _golden("bert")
    chunked = attn.Attention(implementation="chunked", q_chunk=4, k_chunk=4)
    h = _encode(params, cfg, g)
    assert _real_max_diff(_encode(params, cfg, g, attend=chunked), h, g["mask"]) < TOL


def test_jit_vmap_and_grad():
    params, cfg = bert.load(DATA / "tiny_bert")
    g = _golden("bert")
    encode = jax.jit(bert.encode, static_argnums=1)
    h = np.asarray(encode(params, cfg, g["ids"], g["mask"], g["types"]))
    np.testing.assert_allclose(h, _encode(params, cfg, g), atol=1e-5)
    # vmap over a leading axis of batches equals encoding each batch.
    two = jax.vmap(lambda i, m, t: bert.encode(params, cfg, i, m, t))(
        *(np.stack([g[k], g[k][::-1]]) for k in ("ids", "mask", "types"))
    )
    np.testing.assert_allclose(two[0], h, atol=1e-5)
    np.testing.assert_allclose(two[1], h[::-1], atol=1e-5)

    def loss(p):
        h_BxLxD = bert.encode(p, cfg, g["ids"], g["mask"], g["types"])
        pooled_BxD = jax.vmap(pooling.mean_pool)(h_BxLxD, g["mask"] > 0)
        return jnp.square(pooled_BxD).mean()

    grads = jax.jit(jax.grad(loss))(params)
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert bool(jnp.isfinite(leaf).all()), path
        if path[0].key != "pooler":  # mean pooling never reads the pooler
            assert float(jnp.abs(leaf).max()) > 0, jax.tree_util.keystr(path)


def test_dropout_needs_rng_and_draws_new_masks():
    params, cfg = bert.load(DATA / "tiny_bert")
    g = _golden("bert")
    args = (params, cfg, g["ids"], g["mask"], g["types"])
    with pytest.raises(ValueError, match="needs an rng"):
        bert.encode(*args, train=True)
    a = bert.encode(*args, train=True, rng=jax.random.key(0))
    b = bert.encode(*args, train=True, rng=jax.random.key(0))
    c = bert.encode(*args, train=True, rng=jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert float(jnp.abs(a - c).max()) > 0.1
    assert float(jnp.abs(a - bert.encode(*args)).max()) > 0.1
    # Attention dropout needs the weights; without it any implementation trains.
    chunked = attn.Attention(implementation="chunked")
    with pytest.raises(ValueError, match="implementation='matrix'"):
        bert.encode(*args, train=True, rng=jax.random.key(0), attend=chunked)
    no_att = dataclasses.replace(cfg, attention_dropout=0.0)
    out = bert.encode(params, no_att, *args[2:], train=True, rng=jax.random.key(0), attend=chunked)
    assert bool(jnp.isfinite(out).all())


def test_bfloat16_compute_keeps_float32_params_and_stays_close():
    params, cfg = bert.load(DATA / "tiny_bert")
    g = _golden("bert")
    h16 = bert.encode(params, dataclasses.replace(cfg, dtype="bfloat16"), **_kw(g))
    assert h16.dtype == jnp.bfloat16
    assert _real_max_diff(np.asarray(h16, np.float32), g["hidden"], g["mask"]) < 0.15


def _kw(g: dict) -> dict:
    return {"ids_BxL": g["ids"], "mask_BxL": g["mask"], "types_BxL": g["types"]}


def test_an_all_padding_sequence_gives_finite_states():
    params, cfg = bert.load(DATA / "tiny_bert")
    ids = np.zeros((2, 5), np.int32)
    mask = np.zeros((2, 5), bool)
    mask[0, :3] = True
    h = bert.encode(params, cfg, ids, mask)
    assert bool(jnp.isfinite(h).all())


def test_inputs_that_cannot_work_are_one_line_errors():
    params, cfg = bert.load(DATA / "tiny_bert")
    ids = np.ones((1, 41), np.int32)
    with pytest.raises(
        ValueError, match="length 41 is more than the encoder reads: truncate to 40"
    ):
        bert.encode(params, cfg, ids, ids > 0)
    with pytest.raises(ValueError, match="mask must be bool of the token ids' shape"):
        bert.encode(params, cfg, ids[:, :5], ids[:, :4] > 0)
    for mask in (ids[:, :5], ids[:, :5].astype(np.float32)):  # as attn.dot_product_attention
        with pytest.raises(ValueError, match="for a 1/0 mask pass mask != 0"):
            bert.encode(params, cfg, ids[:, :5], mask)
    with pytest.raises(ValueError, match=r"token id 40000 is outside the vocabulary \[0, 99\)"):
        bert.encode(params, cfg, np.full((1, 3), 40000, np.int32), np.ones((1, 3), bool))
    with pytest.raises(ValueError, match="integer array"):
        bert.encode(params, cfg, ids[:, :5].astype(np.float32), ids[:, :5] > 0)
    with pytest.raises(ValueError, match="must be divisible"):
        bert.Config(d_model=30, num_heads=4)


def test_an_id_outside_the_vocabulary_gives_nan_under_jit_not_another_ids_output():
    """Values cannot be checked under jit; the id's row reads as NaN instead of being clamped
    to the last row (which gave id 98's output for 40000)."""
    params, cfg = bert.load(DATA / "tiny_bert")
    mask = np.ones((1, 3), bool)
    for bad in (40000, -1):
        ids = np.array([[6, bad, 7]], np.int32)
        h = np.asarray(jax.jit(bert.encode, static_argnums=1)(params, cfg, ids, mask))
        assert np.isnan(h).all()  # attention spreads it to every position
    h = jax.jit(bert.encode, static_argnums=1)(params, cfg, np.array([[6, 98, 7]]), mask)
    assert np.isfinite(np.asarray(h)).all()


def test_roberta_positions_count_real_tokens_after_padding_id():
    cfg = bert.Config(pad_id=1, position_offset=2, max_positions=10)
    mask = jnp.array([[True, True, True, False], [True, False, False, False]])
    np.testing.assert_array_equal(bert.positions(cfg, mask), [[2, 3, 4, 1], [2, 1, 1, 1]])
    np.testing.assert_array_equal(bert.positions(bert.Config(), mask), [[0, 1, 2, 3]] * 2)


def test_importing_attn_does_not_import_safetensors():
    code = "import sys, attn, attn.bert; print('safetensors' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
    assert "bert" in attn.__all__
