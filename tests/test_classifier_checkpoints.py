"""Every family's sequence-classification head (`attn.encoders.heads`, each family's `head`
module) against transformers: a ...ForSequenceClassification directory of tests/data/encoders
(written by transformers' PyTorch models, every parameter random, head included) loads with
`attn.encoder_classifier.load` and gives transformers' probabilities; the tensors written back
are the stored ones; a fresh head has exactly the class's tensors, in both poolings; a head attn
does not serve is refused in one line."""

import dataclasses
import functools
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT
from safetensors.numpy import load_file, save_file

from attn import encoder_classifier, encoders, head, layers
from attn.encoders import heads

DATA = ROOT / "tests" / "data" / "encoders"
NAMES = sorted(p.name[len("tiny_") : -len("_classifier")] for p in DATA.glob("tiny_*_classifier"))
# Logits of 2-3 float32 blocks of width 32 and a head of two D x D layers: as the hidden states'
# bound in tests/test_encoders.py, a few float32 roundings per term over D = 32 terms, well below
# 1e-5; softmax's probabilities move by at most half the logits' error.
TOL = 1e-5


def _golden(name: str) -> dict:
    return dict(np.load(DATA / f"tiny_{name}_golden.npz", allow_pickle=False))


def _inputs(params: dict, cfg: encoder_classifier.Config, g: dict) -> tuple[np.ndarray, dict]:
    """attn's ids of the golden batch (0 pads), and the golden's token types as the embedding
    delta they add (`apply` reads type 0; the input embeddings, normalised, with the golden's
    types less those with type 0)."""
    ids = np.asarray(encoder_classifier.to_checkpoint(g["ids"], cfg.encoder.pad_id))
    ids = np.where(g["mask"] > 0, ids, 0)
    kw = {}
    if np.any(g["types"]):
        fam = encoders.family(cfg.encoder)
        mask = jnp.asarray(g["mask"] > 0)
        embed = functools.partial(fam.input_embeddings, params["encoder"], cfg.encoder)
        typed = embed(jnp.asarray(g["ids"]), mask, jnp.asarray(g["types"]))
        kw["embed_delta_BxLxD"] = typed - embed(jnp.asarray(g["ids"]), mask)
    return ids, kw


def _probabilities(params, cfg, ids, **kw) -> np.ndarray:
    with jax.default_matmul_precision("float32"):
        logits, _ = encoder_classifier.apply(params, ids, cfg, **kw)
    return np.asarray(jax.nn.softmax(logits))


@pytest.mark.parametrize("name", NAMES)
def test_a_hub_classifier_gives_transformers_probabilities_with_no_training(name):
    params, cfg, labels = encoder_classifier.load(DATA / f"tiny_{name}_classifier")
    g = _golden(name)
    assert labels == ("negative", "neutral", "positive") and cfg.num_classes == 3
    ids, kw = _inputs(params, cfg, g)
    with jax.default_matmul_precision("float32"):
        logits, _ = encoder_classifier.apply(params, ids, cfg, **kw)
    assert np.abs(np.asarray(logits) - g["logits"]).max() < TOL
    want = np.asarray(jax.nn.softmax(jnp.asarray(g["logits"], jnp.float32)))
    assert np.abs(_probabilities(params, cfg, ids, **kw) - want).max() < TOL
    # The head is read, not drawn: another final layer moves the answer (this could fail).
    moved = {
        **params,
        "head": {**params["head"], "b": params["head"]["b"] + 1.0 * (jnp.arange(3) == 0)},
    }
    assert np.abs(_probabilities(moved, cfg, ids, **kw) - want).max() > 1e-3


def _weights(directory: pathlib.Path) -> dict[str, np.ndarray]:
    return load_file(directory / "model.safetensors")


@pytest.mark.parametrize("name", NAMES)
def test_the_tensors_written_back_are_the_stored_ones(name):
    """checkpoint_tensors(load(dir)) is the directory's weights, bit for bit, but its buffers
    (position ids), which transformers does not keep."""
    directory = DATA / f"tiny_{name}_classifier"
    params, cfg, _ = encoder_classifier.load(directory)
    stored = _weights(directory)
    written = encoder_classifier.checkpoint_tensors(params, cfg)
    buffers = set(stored) - set(written)
    assert all(k.endswith(("position_ids", "token_type_ids")) for k in buffers), buffers
    assert set(written) <= set(stored)
    for k, v in written.items():
        assert v.dtype == np.float32 and v.tobytes() == stored[k].astype(np.float32).tobytes(), k
    assert (
        encoder_classifier.architecture(cfg)
        == json.loads((directory / "config.json").read_text())["architectures"][0]
    )


def _shapes(tensors: dict) -> dict:
    return {k: tuple(v.shape) for k, v in tensors.items() if not k.endswith("_ids")}


@pytest.mark.parametrize("name", NAMES)
def test_a_fresh_cls_head_has_exactly_the_class_tensors(name):
    """A "cls" fine-tune of the base checkpoint (encoder as stored, head drawn afresh) has the
    tensors of the family's ...ForSequenceClassification: names and shapes of the classifier
    directory's weights (ModernBERT's at its classifier_pooling; both poolings share tensors)."""
    enc_params, enc = encoders.load(DATA / f"tiny_{name}")
    _, clf, _ = encoder_classifier.load(DATA / f"tiny_{name}_classifier")
    cfg = encoder_classifier.Config(encoder=enc, num_classes=3, max_len=16, pooling=clf.pooling)
    params = {**encoder_classifier.init(jax.random.key(0), cfg), "encoder": enc_params}
    written = encoder_classifier.checkpoint_tensors(params, cfg)
    assert _shapes(written) == _shapes(_weights(DATA / f"tiny_{name}_classifier"))
    assert encoder_classifier.architecture(cfg) == encoder_classifier.architecture(clf)
    ids = np.array([[5, 6, 7, 0]], np.int32)
    assert np.isfinite(_probabilities(params, cfg, ids)).all()


@pytest.mark.parametrize("name", [n for n in NAMES if n != "modernbert"])
def test_a_mean_pooled_classifier_is_the_encoder_and_one_linear_layer(name):
    """Pooling "mean" outside ModernBERT's head: the class attn writes for it (MEAN_POOLED) holds
    the encoder under the family's prefix (no pooler) and `classifier`, and nothing else; read
    back, it gives the same probabilities."""
    enc_params, enc = encoders.load(DATA / f"tiny_{name}")
    cfg = encoder_classifier.Config(encoder=enc, num_classes=3, max_len=16, pooling="mean")
    params = {**encoder_classifier.init(jax.random.key(1), cfg), "encoder": enc_params}
    assert "pool" not in params
    assert encoder_classifier.architecture(cfg) == heads.MEAN_POOLED
    written = encoder_classifier.checkpoint_tensors(params, cfg)
    prefix = encoders.family(enc).head.classes(enc).prefix
    top = {k for k in written if not k.startswith(prefix)}
    assert top == {"classifier.weight", "classifier.bias"}
    assert not any(".pooler." in k for k in written)
    np.testing.assert_array_equal(written["classifier.weight"], np.asarray(params["head"]["w"]).T)


def _copy(tmp_path: pathlib.Path, name: str, config=None, edit=None) -> pathlib.Path:
    """The classifier directory with config.json's keys updated and its tensors edited."""
    src = DATA / f"tiny_{name}_classifier"
    out = tmp_path / f"{name}_{len(list(tmp_path.iterdir()))}"
    shutil.copytree(src, out)
    hf = json.loads((src / "config.json").read_text(encoding="utf-8"))
    hf.update(config or {})
    (out / "config.json").write_text(json.dumps(hf), encoding="utf-8")
    if edit:
        save_file(edit(dict(_weights(src))), out / "model.safetensors", metadata={"format": "pt"})
    return out


def _refused(path: pathlib.Path) -> str:
    with pytest.raises(encoders.CheckpointError) as e:
        encoder_classifier.load(path)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_regression_or_multi_label_head_is_refused_in_one_line(tmp_path):
    one = _copy(
        tmp_path,
        "bert",
        {"id2label": {"0": "score"}, "label2id": {"score": 0}},
        edit=lambda t: {
            **t,
            "classifier.weight": t["classifier.weight"][:1],
            "classifier.bias": t["classifier.bias"][:1],
        },
    )
    assert "num_labels 1 is a regression head" in _refused(one)
    multi = _copy(tmp_path, "roberta", {"problem_type": "multi_label_classification"})
    assert "problem_type 'multi_label_classification' is not served" in _refused(multi)
    regression = _copy(tmp_path, "electra", {"problem_type": "regression"})
    assert "problem_type 'regression'" in _refused(regression)


def test_a_head_of_another_shape_or_with_more_tensors_is_refused_naming_them(tmp_path):
    def edit(t):
        t["classifier.dense.weight"] = np.zeros((16, 32), np.float32)
        t["classifier.extra.weight"] = np.zeros((2, 2), np.float32)
        return t

    message = _refused(_copy(tmp_path, "roberta", edit=edit))
    assert "tensor classifier.dense.weight has shape (16, 32)" in message
    assert "unknown tensor classifier.extra.weight" in message
    fewer = _copy(
        tmp_path,
        "distilbert",
        edit=lambda t: {k: v for k, v in t.items() if not k.startswith("pre_classifier.")},
    )
    assert "missing tensor pre_classifier.weight" in _refused(fewer)


def test_an_encoder_or_a_head_option_attn_does_not_compute_is_refused(tmp_path):
    assert "not a sequence classifier attn serves" in _refused(DATA / "tiny_bert")
    pooling = _copy(tmp_path, "modernbert", {"classifier_pooling": "max"})
    assert "classifier_pooling 'max'" in _refused(pooling)
    width = _copy(tmp_path, "deberta-v2", {"pooler_hidden_size": 16})
    assert "pooler_hidden_size 16" in _refused(width)
    act = _copy(tmp_path, "deberta-v2", {"pooler_hidden_act": "mish"})
    assert "pooler_hidden_act 'mish'" in _refused(act)
    labels = _copy(tmp_path, "bert", {"id2label": {"0": "a", "2": "b"}})
    assert "id2label ids are not 0..1" in _refused(labels)


def test_modernbert_serves_either_classifier_pooling(tmp_path):
    """classifier_pooling "cls" reads the first token into the same head: the same tensors,
    other probabilities, each as the head computes them by hand."""
    params, mean_cfg, _ = encoder_classifier.load(DATA / "tiny_modernbert_classifier")
    _, cls_cfg, _ = encoder_classifier.load(
        _copy(tmp_path, "modernbert", {"classifier_pooling": "cls"})
    )
    assert (mean_cfg.pooling, cls_cfg.pooling) == ("mean", "cls")
    g = _golden("modernbert")
    ids, _ = _inputs(params, mean_cfg, g)
    mask = ids != 0
    h = encoders.encode(
        params["encoder"], mean_cfg.encoder, encoder_classifier.to_checkpoint(ids, 399), mask
    )
    p = params["pool"]
    for cfg, x in (
        (cls_cfg, h[:, 0]),
        (mean_cfg, (h * mask[..., None]).sum(1) / mask.sum(1)[:, None]),
    ):
        y = jax.nn.gelu(x @ p["dense"]["w"], approximate=False)
        v = layers.layer_norm({"scale": p["ln"]["scale"], "bias": 0.0}, y, 1e-5)
        want = jax.nn.softmax(v @ params["head"]["w"] + params["head"]["b"])
        np.testing.assert_allclose(_probabilities(params, cfg, ids), want, atol=TOL)


def test_bert_keeps_its_pooler_in_the_encoder_and_a_pooler_less_bert_gets_a_fresh_one():
    """BERT's "cls" is its pooler as before (no params of the head's own); a checkpoint without
    a pooler gets one drawn, stored as bert.pooler.dense as BertForSequenceClassification has it."""
    enc_params, enc = encoders.load(DATA / "tiny_bert")
    cfg = encoder_classifier.Config(encoder=enc, num_classes=3, max_len=16, pooling="cls")
    params = {**encoder_classifier.init(jax.random.key(0), cfg), "encoder": enc_params}
    assert "pool" not in params
    ids = np.array([[2, 9, 11, 3, 0]], np.int32)
    h = encoders.encode(enc_params, enc, ids, ids != 0)
    v = jnp.tanh(layers.dense(enc_params["pooler"], h[:, 0]))
    want = jax.nn.softmax(head.logits(params, v, dropout=0.0, train=False, rng_pool=None))
    np.testing.assert_allclose(_probabilities(params, cfg, ids), want, atol=1e-6)

    bare = {k: v for k, v in enc_params.items() if k != "pooler"}
    no_pooler = encoder_classifier.Config(
        encoder=dataclasses.replace(enc, pooler=False),
        num_classes=3,
        max_len=16,
        pooling="cls",
    )
    fresh = {**encoder_classifier.init(jax.random.key(0), no_pooler), "encoder": bare}
    assert fresh["pool"]["dense"]["w"].shape == (32, 32)
    written = encoder_classifier.checkpoint_tensors(fresh, no_pooler)
    np.testing.assert_array_equal(
        written["bert.pooler.dense.weight"], fresh["pool"]["dense"]["w"].T
    )


@pytest.mark.parametrize(
    "name, act", [("roberta", jnp.tanh), ("electra", lambda x: jax.nn.gelu(x, approximate=False))]
)
def test_the_roberta_and_electra_heads_drop_the_first_token_before_their_dense_layer(name, act):
    """In training, h[:, 0] is dropped out (a key derived from the final dropout's) before the
    dense layer, and the dense layer's output with the final dropout's key: the class's two
    dropouts at the one rate."""
    params, cfg, _ = encoder_classifier.load(DATA / f"tiny_{name}_classifier")
    # Only the head's dropouts: the encoder's off.
    enc = dataclasses.replace(cfg.encoder, dropout=0.0, attention_dropout=0.0)
    cfg = dataclasses.replace(cfg, encoder=enc, dropout=0.5)
    ids = np.array([[5, 9, 11, 7, 0]], np.int32)
    rng = jax.random.key(3)
    _, r_pool = jax.random.split(rng)
    own = encoder_classifier.to_checkpoint(ids, enc.pad_id)
    h = encoders.encode(params["encoder"], enc, own, ids != 0)
    x = layers.dropout(h[:, 0], 0.5, train=True, rng=jax.random.fold_in(r_pool, 1))
    v = act(layers.dense(params["pool"]["dense"], x))
    want = head.logits(params, v, dropout=0.5, train=True, rng_pool=r_pool)
    got, _ = encoder_classifier.apply(params, ids, cfg, train=True, rng=rng)
    np.testing.assert_allclose(got, want, atol=1e-6)
    evaluated, _ = encoder_classifier.apply(params, ids, cfg)
    assert np.abs(np.asarray(got) - np.asarray(evaluated)).max() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_the_family_head(name):
    params, cfg, _ = encoder_classifier.load(DATA / f"tiny_{name}_classifier")
    ids = np.array([[5, 9, 11, 7, 0], [6, 8, 0, 0, 0]], np.int32)

    def loss(p):
        logits, _ = encoder_classifier.apply(p, ids, cfg)
        return -jax.nn.log_softmax(logits)[:, 0].sum()

    grads = jax.grad(loss)(params)
    leaves = jax.tree.leaves(grads.get("pool", {})) + jax.tree.leaves(grads["head"])
    assert leaves and all(float(jnp.abs(g).max()) > 0 for g in leaves)


def test_a_fine_tune_starts_from_the_head_a_checkpoint_stores(tmp_path):
    """stored_pool: a classifier's (or ModernBERT's masked-LM) head params, read; none from a
    base model; a head missing some of its tensors is refused in one line."""
    params, cfg, _ = encoder_classifier.load(DATA / "tiny_electra_classifier")
    got = encoder_classifier.stored_pool(DATA / "tiny_electra_classifier", cfg)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), got, params["pool"]))
    assert encoder_classifier.stored_pool(DATA / "tiny_electra", cfg) is None
    mean = encoder_classifier.Config(encoder=cfg.encoder, num_classes=3, pooling="mean", max_len=16)
    assert encoder_classifier.stored_pool(DATA / "tiny_electra_classifier", mean) is None
    _, mcfg, _ = encoder_classifier.load(DATA / "tiny_modernbert_classifier")
    half = _copy(
        tmp_path,
        "modernbert",
        edit=lambda t: {k: v for k, v in t.items() if k != "head.norm.weight"},
    )
    with pytest.raises(encoders.CheckpointError, match="incomplete: it stores head.dense.weight"):
        encoder_classifier.stored_pool(half, mcfg)


def test_a_classifier_with_a_bag_is_no_transformers_class():
    enc_params, enc = encoders.load(DATA / "tiny_bert")
    cfg = encoder_classifier.Config(encoder=enc, max_len=16, bag_buckets=8)
    params = {**encoder_classifier.init(jax.random.key(0), cfg), "encoder": enc_params}
    with pytest.raises(ValueError, match="bag_buckets > 0"):
        encoder_classifier.checkpoint_tensors(params, cfg)
