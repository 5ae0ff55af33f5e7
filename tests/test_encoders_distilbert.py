"""DistilBERT's own parts (tests/test_encoders.py holds the goldens, broken checkpoints, tokenizer
and fine-tuning every family passes): a float64 numpy forward written from
modeling_distilbert.py and reading the stored tensors by their own names; the options config.json
may hold that attn does not compute, refused in one line; the task layouts; and the encoder's
implementations, jit, vmap, grad, dropout, bfloat16, padding and step-by-step view."""

import dataclasses
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT
from safetensors.numpy import load_file, save_file

import attn
from attn import encoders, pooling
from attn.encoders import distilbert

DATA = ROOT / "tests" / "data" / "encoders"
TINY = DATA / "tiny_distilbert"
# Float32 through 2 blocks of width 32 with values up to about 5: a few units of float32's 6e-8
# relative rounding per operation, summed over 32-48 terms per dot product, stays below 1e-5.
TOL = 1e-5
_erf = np.vectorize(math.erf)


def _golden(name: str = "distilbert") -> dict:
    g = dict(np.load(DATA / f"tiny_{name}_golden.npz"))
    return {**g, "mask": g["mask"] > 0}


def _encode(params, cfg, ids, mask, **kw):
    with jax.default_matmul_precision("float32"):
        return distilbert.model.encode(params, cfg, ids, mask, **kw)


def _real_max_diff(a, b, mask) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))[mask].max())


def _numpy_forward(t: dict, ids, mask, n_layers: int, n_heads: int) -> np.ndarray:
    """float64 DistilBertModel from the stored tensors, by their names: `Embeddings` (word +
    position 0..L-1, LayerNorm eps 1e-12, no token types), then per `TransformerBlock`
    q / sqrt(K) before q·kᵀ, padding keys masked, softmax, out_lin, sa_layer_norm(· + x),
    lin2(gelu(lin1)) and output_layer_norm(· + x)."""
    f = {k: v.astype(np.float64) for k, v in t.items()}

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = np.square(x - mu).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * f[f"{name}.weight"] + f[f"{name}.bias"]

    def lin(x, name):
        return x @ f[f"{name}.weight"].T + f[f"{name}.bias"]

    batch, length = ids.shape
    x = f["embeddings.word_embeddings.weight"][ids]
    x = ln(x + f["embeddings.position_embeddings.weight"][:length], "embeddings.LayerNorm")
    d = x.shape[-1]
    k_dim = d // n_heads

    def heads(y):
        return y.reshape(batch, length, n_heads, k_dim).transpose(0, 2, 1, 3)

    for i in range(n_layers):
        p = f"transformer.layer.{i}."
        q = heads(lin(x, p + "attention.q_lin")) / np.sqrt(k_dim)
        k, v = heads(lin(x, p + "attention.k_lin")), heads(lin(x, p + "attention.v_lin"))
        s = np.where(mask[:, None, None, :], q @ k.transpose(0, 1, 3, 2), -1e30)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        a = (w @ v).transpose(0, 2, 1, 3).reshape(batch, length, d)
        x = ln(lin(a, p + "attention.out_lin") + x, p + "sa_layer_norm")
        h = lin(x, p + "ffn.lin1")
        h = 0.5 * h * (1 + _erf(h / np.sqrt(2)))
        x = ln(lin(h, p + "ffn.lin2") + x, p + "output_layer_norm")
    return x


def test_a_numpy_forward_from_the_stored_names_matches_transformers_and_attn():
    """The oracle reads the checkpoint by DistilBERT's own key names, so it checks attn's rules
    and computation independently of both transformers and attn's mapping."""
    g = _golden()
    cfg_hf = json.loads((TINY / "config.json").read_text())
    want = _numpy_forward(
        load_file(TINY / "model.safetensors"),
        g["ids"],
        g["mask"],
        cfg_hf["n_layers"],
        cfg_hf["n_heads"],
    )
    assert _real_max_diff(want, g["hidden"], g["mask"]) < TOL  # the oracle is transformers'
    params, cfg = encoders.load(TINY)
    assert _real_max_diff(_encode(params, cfg, g["ids"], g["mask"]), want, g["mask"]) < TOL


def test_the_classifier_head_is_pre_classifier_relu_classifier_on_the_first_token():
    """What the skipped head of ..._classifier computes (the family's head serves it this way):
    logits = classifier(relu(pre_classifier(h[:, 0]))) reproduces transformers' logits."""
    g = _golden()
    params, cfg = encoders.load(DATA / "tiny_distilbert_classifier")
    h0 = np.asarray(_encode(params, cfg, g["ids"], g["mask"])[:, 0], np.float64)
    t = {
        k: v.astype(np.float64)
        for k, v in load_file(DATA / "tiny_distilbert_classifier" / "model.safetensors").items()
    }
    hidden = np.maximum(h0 @ t["pre_classifier.weight"].T + t["pre_classifier.bias"], 0.0)
    logits = hidden @ t["classifier.weight"].T + t["classifier.bias"]
    assert np.abs(logits - g["logits"]).max() < TOL


def _variant(tmp_path: pathlib.Path, config=None, edit=None) -> pathlib.Path:
    """A copy of the tiny checkpoint with config.json and its tensors edited."""
    hf = json.loads((TINY / "config.json").read_text(encoding="utf-8"))
    hf.update(config or {})
    for key in [k for k, v in hf.items() if v is None]:
        del hf[key]  # None: drop the key
    tensors = load_file(TINY / "model.safetensors")
    out = tmp_path / "model"
    out.mkdir()
    save_file(edit(dict(tensors)) if edit else tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(hf), encoding="utf-8")
    return out


def _refusal(path) -> str:
    with pytest.raises(encoders.CheckpointError) as e:
        encoders.load(path)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize(
    "config, named",
    [
        ({"activation": "relu"}, "activation 'relu' (only 'gelu', the exact erf form)"),
        ({"activation": "gelu_new"}, "activation 'gelu_new'"),
        ({"sinusoidal_pos_embds": True}, "sinusoidal_pos_embds True (only learned positions"),
        ({"dim": None}, "no dim"),
        (
            {"architectures": ["DistilBertForQuestionAnswering"]},
            "architecture DistilBertForQuestionAnswering is not supported",
        ),
        ({"n_heads": 5}, "d_model=32 must be divisible by distilbert.Config.num_heads=5"),
    ],
)
def test_an_option_attn_does_not_compute_is_refused_in_one_line(tmp_path, config, named):
    assert named in _refusal(_variant(tmp_path, config))


def test_the_masked_lm_layout_loads_the_same_encoder_and_skips_its_head(tmp_path, caplog):
    """DistilBertForMaskedLM (distilbert-base-uncased's own layout): "distilbert." before the
    encoder, the vocab_* head and the position_ids buffer beside it."""

    def edit(t):
        out = {f"distilbert.{k}": v for k, v in t.items()}
        out["distilbert.embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
        out["vocab_transform.weight"] = np.zeros((32, 32), np.float32)
        out["vocab_transform.bias"] = np.zeros((32,), np.float32)
        out["vocab_layer_norm.weight"] = np.ones((32,), np.float32)
        out["vocab_layer_norm.bias"] = np.zeros((32,), np.float32)
        out["vocab_projector.weight"] = t["embeddings.word_embeddings.weight"]
        out["vocab_projector.bias"] = np.zeros((185,), np.float32)
        return out

    path = _variant(tmp_path, {"architectures": ["DistilBertForMaskedLM"]}, edit)
    with caplog.at_level("INFO", logger="attn.encoders"):
        params, cfg = encoders.load(path)
    want, cfg_want = encoders.load(TINY)
    assert cfg == cfg_want
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
    assert "skipped distilbert.embeddings.position_ids, vocab_layer_norm.bias" in caplog.text


def test_token_types_are_refused_and_a_wrong_config_is_one_line():
    params, cfg = encoders.load(TINY)
    ids = np.array([[6, 58, 7]], np.int32)
    with pytest.raises(ValueError, match="DistilBERT has no token types: pass types_BxL=None"):
        encoders.encode(params, cfg, ids, ids > 0, np.zeros_like(ids))
    with pytest.raises(ValueError, match="params do not fit the config"):
        encoders.encode(params, dataclasses.replace(cfg, num_layers=3), ids, ids > 0)
    with pytest.raises(ValueError, match=r"distilbert.Config.dropout must be a float in \[0.0"):
        distilbert.model.Config(dropout=1.0)
    with pytest.raises(ValueError, match="length 65 is more than the encoder reads: truncate"):
        encoders.encode(params, cfg, np.ones((1, 65), np.int32), np.ones((1, 65), bool))


@pytest.mark.parametrize(
    "attend",
    [
        attn.Attention(implementation="chunked", q_chunk=4, k_chunk=4),
        attn.Attention(implementation="xla"),
    ],
    ids=["chunked", "xla"],
)
def test_other_implementations_equal_the_matrix_form(attend):
    params, cfg = encoders.load(TINY)
    g = _golden()
    h = _encode(params, cfg, g["ids"], g["mask"])
    other = _encode(params, cfg, g["ids"], g["mask"], attend=attend)
    assert _real_max_diff(other, h, g["mask"]) < TOL


def test_jit_vmap_and_grad():
    params, cfg = encoders.load(TINY)
    g = _golden()
    h = np.asarray(_encode(params, cfg, g["ids"], g["mask"]))
    with jax.default_matmul_precision("float32"):
        jitted = jax.jit(distilbert.model.encode, static_argnums=1)(
            params, cfg, g["ids"], g["mask"]
        )
        # vmap over a leading axis of batches equals encoding each batch.
        two = jax.vmap(lambda i, m: distilbert.model.encode(params, cfg, i, m))(
            np.stack([g["ids"], g["ids"][::-1]]), np.stack([g["mask"], g["mask"][::-1]])
        )
    assert _real_max_diff(jitted, h, g["mask"]) < TOL
    assert _real_max_diff(two[0], h, g["mask"]) < TOL
    assert _real_max_diff(two[1], h[::-1], g["mask"][::-1]) < TOL

    def loss(p):
        h_BxLxD = distilbert.model.encode(p, cfg, g["ids"], g["mask"])
        return jnp.square(jax.vmap(pooling.mean_pool)(h_BxLxD, g["mask"])).mean()

    grads = jax.jit(jax.grad(loss))(params)
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert bool(jnp.isfinite(leaf).all()), jax.tree_util.keystr(path)
        assert float(jnp.abs(leaf).max()) > 0, jax.tree_util.keystr(path)


def test_dropout_needs_rng_and_draws_new_masks():
    params, cfg = encoders.load(TINY)
    g = _golden()
    args = (params, cfg, g["ids"], g["mask"])
    with pytest.raises(ValueError, match="needs an rng"):
        distilbert.model.encode(*args, train=True)
    a = distilbert.model.encode(*args, train=True, rng=jax.random.key(0))
    b = distilbert.model.encode(*args, train=True, rng=jax.random.key(0))
    c = distilbert.model.encode(*args, train=True, rng=jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert _real_max_diff(a, c, g["mask"]) > 0.1
    assert _real_max_diff(a, distilbert.model.encode(*args), g["mask"]) > 0.1
    # Hidden dropout alone (attention dropout needs the weights, which chunked never forms).
    no_att = dataclasses.replace(cfg, attention_dropout=0.0)
    chunked = attn.Attention(implementation="chunked")
    with pytest.raises(ValueError, match="implementation='matrix'"):
        distilbert.model.encode(*args, train=True, rng=jax.random.key(0), attend=chunked)
    d = distilbert.model.encode(
        params, no_att, g["ids"], g["mask"], train=True, rng=jax.random.key(0), attend=chunked
    )
    assert bool(jnp.isfinite(d).all()) and _real_max_diff(d, a, g["mask"]) > 0.1


def test_bfloat16_compute_keeps_float32_params_and_stays_close():
    """bfloat16 keeps 8 significant bits (relative rounding 2^-9 per operation); through 2
    blocks of about ten rounded operations each, on LayerNorm-scaled values up to about 5, the
    error stays within 5 · 2^-9 · 2 · 10 ≈ 0.2, while a wrong computation is off by O(1)."""
    params, cfg = encoders.load(TINY)
    g = _golden()
    h16 = distilbert.model.encode(
        params, dataclasses.replace(cfg, dtype="bfloat16"), g["ids"], g["mask"]
    )
    assert h16.dtype == jnp.bfloat16
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    assert _real_max_diff(np.asarray(h16, np.float32), g["hidden"], g["mask"]) < 5 * 2**-9 * 20


def test_more_padding_changes_no_real_token():
    params, cfg = encoders.load(TINY)
    g = _golden()
    ids = np.pad(g["ids"], ((0, 0), (0, 9)), constant_values=cfg.pad_id)
    mask = np.pad(g["mask"], ((0, 0), (0, 9)), constant_values=False)
    h = _encode(params, cfg, g["ids"], g["mask"])
    longer = _encode(params, cfg, ids, mask)[:, : g["ids"].shape[1]]
    assert _real_max_diff(longer, h, g["mask"]) < TOL


@pytest.mark.parametrize("layer", [0, 1])
def test_attention_steps_are_the_layers_own_computation(layer):
    """The figure draws what encode computes: X is the layer's input (the embeddings after their
    LayerNorm for layer 0), the scaled scores are Q Kᵀ / sqrt(K), and the weights are encode's
    returned weights for that layer."""
    params, cfg = encoders.load(TINY)
    g = _golden()
    row, n = 0, int(g["mask"][0].sum())
    with jax.default_matmul_precision("float32"):
        s = encoders.family(cfg).attention_steps(
            params, cfg, g["ids"][row], g["mask"][row], layer=layer
        )
        _, weights = distilbert.model.encode(params, cfg, g["ids"], g["mask"], return_weights=True)
        x_want = (
            distilbert.model.embed(params, cfg, g["ids"], g["mask"])
            if layer == 0
            else distilbert.model.encode(
                *encoders.first_layers(params, cfg, layer), g["ids"], g["mask"]
            )
        )
    np.testing.assert_allclose(s.x_LxD[:n], x_want[row, :n], atol=TOL)
    k = cfg.d_model // cfg.num_heads
    raw = np.einsum("hik,hjk->hij", s.q_HxLxK, s.k_HxLxK)
    np.testing.assert_allclose(s.raw_HxLxL, raw, atol=TOL)
    np.testing.assert_allclose(s.scaled_HxLxL, raw / np.sqrt(k), atol=TOL)
    np.testing.assert_allclose(s.weights_HxLxL[:, :n], weights[layer][row, :, :n], atol=TOL)
    assert np.all(np.asarray(s.weights_HxLxL)[:, :, n:] == 0)  # padding keys get no weight
    assert distilbert.model.steps_input(cfg, layer) == (
        "X: word + position embeddings after LayerNorm"
        if layer == 0
        else "X: layer 0's output (after its LayerNorm)"
    )
