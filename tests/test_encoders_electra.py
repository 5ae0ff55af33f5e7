"""ELECTRA's own parts (tests/test_encoders.py holds the goldens, broken checkpoints, tokenizer and
fine-tuning every family passes): a float64 numpy forward written from modeling_electra.py and
reading the stored tensors by their own names, with the embeddings' projection (the tiny
checkpoint: embedding_size 16, hidden 32) and without it (embedding_size = hidden_size, as
electra-base-discriminator); the options config.json may hold that attn does not compute, refused
in one line; the discriminator's and generator's layouts; and the encoder's implementations, jit,
vmap, grad, dropout, bfloat16, padding, token types and step-by-step view."""

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
from attn import encoder_classifier, encoders, importance, pooling
from attn.encoders import electra

DATA = ROOT / "tests" / "data" / "encoders"
TINY = DATA / "tiny_electra"
# Float32 through a projection and 2 blocks of width 32 with values up to about 5: a few units of
# float32's 6e-8 relative rounding per operation, summed over 16-48 terms per dot product, stays
# below 1e-5.
TOL = 1e-5
_erf = np.vectorize(math.erf)


def _golden() -> dict:
    g = dict(np.load(DATA / "tiny_electra_golden.npz"))
    return {**g, "mask": g["mask"] > 0}


def _encode(params, cfg, ids, mask, types=None, **kw):
    with jax.default_matmul_precision("float32"):
        return electra.model.encode(params, cfg, ids, mask, types, **kw)


def _real_max_diff(a, b, mask) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))[mask].max())


def _gelu(h):
    return 0.5 * h * (1 + _erf(h / np.sqrt(2)))


def _numpy_forward(t: dict, hf: dict, ids, mask, types) -> np.ndarray:
    """float64 ElectraModel from the stored tensors, by their names: `ElectraEmbeddings` (word +
    position 0..L-1 + token type, LayerNorm, all embedding_size wide), embeddings_project when
    the checkpoint has it, then BERT's layers as ElectraLayer computes them."""
    f = {k: v.astype(np.float64) for k, v in t.items()}
    eps, n_heads = hf["layer_norm_eps"], hf["num_attention_heads"]

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = np.square(x - mu).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * f[f"{name}.weight"] + f[f"{name}.bias"]

    def lin(x, name):
        return x @ f[f"{name}.weight"].T + f[f"{name}.bias"]

    batch, length = ids.shape
    x = f["embeddings.word_embeddings.weight"][ids]
    x = x + f["embeddings.position_embeddings.weight"][:length]
    x = ln(x + f["embeddings.token_type_embeddings.weight"][types], "embeddings.LayerNorm")
    if "embeddings_project.weight" in f:
        x = lin(x, "embeddings_project")
    d = x.shape[-1]
    k_dim = d // n_heads

    def heads(y):
        return y.reshape(batch, length, n_heads, k_dim).transpose(0, 2, 1, 3)

    for i in range(hf["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (heads(lin(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        s = np.where(mask[:, None, None, :], q @ k.transpose(0, 1, 3, 2) / np.sqrt(k_dim), -1e30)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        a = (w @ v).transpose(0, 2, 1, 3).reshape(batch, length, d)
        x = ln(lin(a, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = _gelu(lin(x, p + "intermediate.dense"))
        x = ln(lin(h, p + "output.dense") + x, p + "output.LayerNorm")
    return x


def _hf() -> dict:
    return json.loads((TINY / "config.json").read_text(encoding="utf-8"))


def test_a_numpy_forward_from_the_stored_names_matches_transformers_and_attn():
    """The oracle reads the checkpoint by ELECTRA's own key names, so it checks attn's rules and
    computation (the projection included) independently of transformers and of attn's mapping."""
    g = _golden()
    t = load_file(TINY / "model.safetensors")
    want = _numpy_forward(t, _hf(), g["ids"], g["mask"], g["types"])
    assert _real_max_diff(want, g["hidden"], g["mask"]) < TOL  # the oracle is transformers'
    params, cfg = encoders.load(TINY)
    assert cfg.projected and params["embed"]["project"]["w"].shape == (16, 32)
    got = _encode(params, cfg, g["ids"], g["mask"], g["types"])
    assert _real_max_diff(got, want, g["mask"]) < TOL


def _unprojected(tmp_path: pathlib.Path) -> pathlib.Path:
    """An ELECTRA with embedding_size = hidden_size = 32 (no embeddings_project, as
    electra-base-discriminator): the tiny checkpoint's blocks, new 32-wide embeddings."""
    rng = np.random.default_rng(0)
    t = load_file(TINY / "model.safetensors")
    del t["embeddings_project.weight"], t["embeddings_project.bias"]
    for name in [k for k in t if k.startswith("embeddings.")]:
        shape = (*t[name].shape[:-1], 32)
        t[name] = rng.normal(1.0 if name.endswith("LayerNorm.weight") else 0.0, 0.3, shape)
        t[name] = t[name].astype(np.float32)
    out = tmp_path / "unprojected"
    out.mkdir()
    save_file(t, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({**_hf(), "embedding_size": 32}))
    return out


def test_without_a_projection_the_embeddings_go_straight_to_the_blocks(tmp_path):
    path = _unprojected(tmp_path)
    params, cfg = encoders.load(path)
    assert not cfg.projected and "project" not in params["embed"]
    g = _golden()
    want = _numpy_forward(
        load_file(path / "model.safetensors"),
        json.loads((path / "config.json").read_text()),
        g["ids"],
        g["mask"],
        g["types"],
    )
    got = _encode(params, cfg, g["ids"], g["mask"], g["types"])
    assert _real_max_diff(got, want, g["mask"]) < TOL
    assert electra.model.steps_input(cfg, 0) == (
        "X: word + position + token type embeddings after LayerNorm"
    )


def test_a_projection_that_config_json_does_not_imply_is_refused(tmp_path):
    """embedding_size decides whether embeddings_project exists, as in transformers: a stored
    projection the config does not imply is unknown, an implied one that is absent is missing."""
    path = _unprojected(tmp_path)
    t = load_file(path / "model.safetensors")
    t.update({k: v for k, v in load_file(TINY / "model.safetensors").items() if "project" in k})
    save_file(t, path / "model.safetensors")
    message = _refusal(path)
    assert "unknown tensor embeddings_project.weight" in message
    message = _refusal(
        _variant(tmp_path, edit=lambda t: {k: v for k, v in t.items() if "project" not in k})
    )
    assert "missing tensor embeddings_project.weight" in message


def test_the_classifier_head_is_dense_gelu_out_proj_on_the_first_token():
    """What the skipped head of ..._classifier computes (the family's head serves it this way):
    logits = out_proj(gelu(dense(h[:, 0]))), exact GELU (ElectraClassificationHead), reproduces
    transformers' logits."""
    g = _golden()
    path = DATA / "tiny_electra_classifier"
    params, cfg = encoders.load(path)
    h0 = np.asarray(_encode(params, cfg, g["ids"], g["mask"], g["types"])[:, 0], np.float64)
    t = {k: v.astype(np.float64) for k, v in load_file(path / "model.safetensors").items()}
    hidden = _gelu(h0 @ t["classifier.dense.weight"].T + t["classifier.dense.bias"])
    logits = hidden @ t["classifier.out_proj.weight"].T + t["classifier.out_proj.bias"]
    assert np.abs(logits - g["logits"]).max() < TOL


def _variant(tmp_path: pathlib.Path, config=None, edit=None) -> pathlib.Path:
    """A copy of the tiny checkpoint with config.json and its tensors edited."""
    hf = {**_hf(), **(config or {})}
    for key in [k for k, v in (config or {}).items() if v is None]:
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
        ({"hidden_act": "relu"}, "hidden_act 'relu' (only 'gelu', the exact erf form)"),
        ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
        (
            {"position_embedding_type": "relative_key"},
            "position_embedding_type 'relative_key' (only 'absolute')",
        ),
        ({"is_decoder": True}, "a decoder (is_decoder / add_cross_attention; only encoders)"),
        ({"embedding_size": None}, "no embedding_size"),
        (
            {"architectures": ["ElectraForCausalLM"]},
            "architecture ElectraForCausalLM is not supported",
        ),
        ({"num_attention_heads": 5}, "d_model=32 must be divisible by electra.Config.num_heads=5"),
    ],
)
def test_an_option_attn_does_not_compute_is_refused_in_one_line(tmp_path, config, named):
    assert named in _refusal(_variant(tmp_path, config))


@pytest.mark.parametrize(
    "architecture, heads",
    [
        (
            "ElectraForPreTraining",
            {
                "discriminator_predictions.dense.weight": (32, 32),
                "discriminator_predictions.dense.bias": (32,),
                "discriminator_predictions.dense_prediction.weight": (1, 32),
                "discriminator_predictions.dense_prediction.bias": (1,),
            },
        ),
        (
            "ElectraForMaskedLM",
            {
                "generator_predictions.dense.weight": (16, 32),
                "generator_predictions.dense.bias": (16,),
                "generator_predictions.LayerNorm.weight": (16,),
                "generator_predictions.LayerNorm.bias": (16,),
                "generator_lm_head.weight": (185, 16),
                "generator_lm_head.bias": (185,),
            },
        ),
    ],
)
def test_the_discriminator_and_generator_layouts_load_the_same_encoder(
    tmp_path, caplog, architecture, heads
):
    """ "electra." before the encoder, the task head and the buffers beside it."""

    def edit(t):
        out = {f"electra.{k}": v for k, v in t.items()}
        out["electra.embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
        out["electra.embeddings.token_type_ids"] = np.zeros((1, 64), np.int64)
        out.update({k: np.zeros(shape, np.float32) for k, shape in heads.items()})
        return out

    path = _variant(tmp_path, {"architectures": [architecture]}, edit)
    with caplog.at_level("INFO", logger="attn.encoders"):
        params, cfg = encoders.load(path)
    want, cfg_want = encoders.load(TINY)
    assert cfg == cfg_want
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
    skipped = caplog.text.split("skipped ")[1]
    for name in ("electra.embeddings.position_ids", "electra.embeddings.token_type_ids", *heads):
        assert name in skipped


def test_token_types_count_and_wrong_ones_are_refused():
    params, cfg = encoders.load(TINY)
    g = _golden()
    h = _encode(params, cfg, g["ids"], g["mask"], g["types"])
    h0 = _encode(params, cfg, g["ids"], g["mask"])  # types 0
    assert _real_max_diff(h, h0, g["mask"]) > 0.1
    with pytest.raises(ValueError, match=r"token type 2 is outside the types \[0, 2\)"):
        encoders.encode(params, cfg, g["ids"], g["mask"], np.full_like(g["ids"], 2))
    # Under jit values cannot be checked: the type's row reads NaN instead of being clamped.
    bad = jax.jit(electra.model.encode, static_argnums=1)(
        params, cfg, g["ids"], g["mask"], np.full_like(g["ids"], 2)
    )
    assert np.isnan(np.asarray(bad)).all()
    with pytest.raises(ValueError, match="params do not fit the config"):
        encoders.encode(params, dataclasses.replace(cfg, embedding_size=32), g["ids"], g["mask"])
    with pytest.raises(ValueError, match=r"electra.Config.type_vocab_size must be an integer >= 1"):
        electra.model.Config(type_vocab_size=0)


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
    h = _encode(params, cfg, g["ids"], g["mask"], g["types"])
    other = _encode(params, cfg, g["ids"], g["mask"], g["types"], attend=attend)
    assert _real_max_diff(other, h, g["mask"]) < TOL


def test_jit_vmap_and_grad():
    params, cfg = encoders.load(TINY)
    g = _golden()
    args = (g["ids"], g["mask"], g["types"])
    h = np.asarray(_encode(params, cfg, *args))
    with jax.default_matmul_precision("float32"):
        jitted = jax.jit(electra.model.encode, static_argnums=1)(params, cfg, *args)
        # vmap over a leading axis of batches equals encoding each batch.
        two = jax.vmap(lambda i, m, t: electra.model.encode(params, cfg, i, m, t))(
            *(np.stack([a, a[::-1]]) for a in args)
        )
    assert _real_max_diff(jitted, h, g["mask"]) < TOL
    assert _real_max_diff(two[0], h, g["mask"]) < TOL
    assert _real_max_diff(two[1], h[::-1], g["mask"][::-1]) < TOL

    def loss(p):
        h_BxLxD = electra.model.encode(p, cfg, *args)
        return jnp.square(jax.vmap(pooling.mean_pool)(h_BxLxD, g["mask"])).mean()

    grads = jax.jit(jax.grad(loss))(params)
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert bool(jnp.isfinite(leaf).all()), jax.tree_util.keystr(path)
        assert float(jnp.abs(leaf).max()) > 0, jax.tree_util.keystr(path)


def test_the_input_gradient_is_embedding_size_wide_and_importance_runs_on_it():
    """embed_delta and input_embeddings are embedding_size (16) wide, before the projection; the
    gradient flows to them, and attn.importance's gradient × input runs on a classifier over
    ELECTRA."""
    params, cfg = encoders.load(TINY)
    g = _golden()
    inputs = (g["ids"], g["mask"], g["types"])
    x = electra.model.input_embeddings(params, cfg, *inputs)
    assert x.shape == (3, 16, 16)
    h = _encode(params, cfg, *inputs)
    np.testing.assert_array_equal(_encode(params, cfg, *inputs, embed_delta_BxLxD=0 * x), h)

    def first_token(delta):
        return jnp.square(
            electra.model.encode(params, cfg, *inputs, embed_delta_BxLxD=delta)[:, 0]
        ).sum()

    grad = np.asarray(jax.grad(first_token)(jnp.zeros_like(x)))
    assert np.isfinite(grad).all() and np.abs(grad).sum(-1)[g["mask"]].min() > 0
    assert np.all(grad[~g["mask"]] == 0)  # padding is no key, and the first token reads no pad
    clf = encoder_classifier.Config(encoder=cfg, max_len=16)
    clf_params = {**encoder_classifier.init(jax.random.key(0), clf), "encoder": params}
    scores_BxL = importance.gradient(clf_params, g["ids"], clf)
    assert scores_BxL.shape == (3, 16) and bool(jnp.isfinite(scores_BxL).all())
    assert np.all(np.asarray(scores_BxL)[~g["mask"]] == 0)


def test_dropout_needs_rng_and_draws_new_masks():
    params, cfg = encoders.load(TINY)
    g = _golden()
    args = (params, cfg, g["ids"], g["mask"], g["types"])
    with pytest.raises(ValueError, match="needs an rng"):
        electra.model.encode(*args, train=True)
    a = electra.model.encode(*args, train=True, rng=jax.random.key(0))
    b = electra.model.encode(*args, train=True, rng=jax.random.key(0))
    c = electra.model.encode(*args, train=True, rng=jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert _real_max_diff(a, c, g["mask"]) > 0.1
    assert _real_max_diff(a, electra.model.encode(*args), g["mask"]) > 0.1
    # Hidden dropout alone (attention dropout needs the weights, which chunked never forms).
    chunked = attn.Attention(implementation="chunked")
    with pytest.raises(ValueError, match="implementation='matrix'"):
        electra.model.encode(*args, train=True, rng=jax.random.key(0), attend=chunked)
    no_att = dataclasses.replace(cfg, attention_dropout=0.0)
    d = electra.model.encode(
        params, no_att, *args[2:], train=True, rng=jax.random.key(0), attend=chunked
    )
    assert bool(jnp.isfinite(d).all()) and _real_max_diff(d, a, g["mask"]) > 0.1


def test_bfloat16_compute_keeps_float32_params_and_stays_close():
    """bfloat16 keeps 8 significant bits (relative rounding 2^-9 per operation); through the
    projection and 2 blocks of about ten rounded operations each, on LayerNorm-scaled values up
    to about 5, the error stays within 5 · 2^-9 · 2 · 10 ≈ 0.2, while a wrong computation is off
    by O(1)."""
    params, cfg = encoders.load(TINY)
    g = _golden()
    cfg16 = dataclasses.replace(cfg, dtype="bfloat16")
    h16 = electra.model.encode(params, cfg16, g["ids"], g["mask"], g["types"])
    assert h16.dtype == jnp.bfloat16
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    assert _real_max_diff(np.asarray(h16, np.float32), g["hidden"], g["mask"]) < 5 * 2**-9 * 20


def test_more_padding_changes_no_real_token():
    params, cfg = encoders.load(TINY)
    g = _golden()
    pad = lambda a, v: np.pad(a, ((0, 0), (0, 9)), constant_values=v)  # noqa: E731
    h = _encode(params, cfg, g["ids"], g["mask"], g["types"])
    longer = _encode(
        params, cfg, pad(g["ids"], cfg.pad_id), pad(g["mask"], False), pad(g["types"], 0)
    )
    assert _real_max_diff(longer[:, : g["ids"].shape[1]], h, g["mask"]) < TOL


@pytest.mark.parametrize("layer", [0, 1])
def test_attention_steps_are_the_layers_own_computation(layer):
    """The figure draws what encode computes: X is the layer's input (for layer 0 the embeddings
    after their LayerNorm and the projection, D wide), the scaled scores are Q Kᵀ / sqrt(K), and
    the weights are encode's returned weights for that layer (token types 0, as the figure
    draws a text)."""
    params, cfg = encoders.load(TINY)
    g = _golden()
    row, n = 0, int(g["mask"][0].sum())
    with jax.default_matmul_precision("float32"):
        s = encoders.family(cfg).attention_steps(
            params, cfg, g["ids"][row], g["mask"][row], layer=layer
        )
        _, weights = electra.model.encode(params, cfg, g["ids"], g["mask"], return_weights=True)
        below = encoders.first_layers(params, cfg, layer)
        x_want = electra.model.encode(*below, g["ids"], g["mask"])
        if layer == 0:
            np.testing.assert_array_equal(
                x_want, electra.model.embed(params, cfg, g["ids"], g["mask"])
            )
    assert s.x_LxD.shape == (16, 32)
    np.testing.assert_allclose(s.x_LxD[:n], x_want[row, :n], atol=TOL)
    k = cfg.d_model // cfg.num_heads
    raw = np.einsum("hik,hjk->hij", s.q_HxLxK, s.k_HxLxK)
    np.testing.assert_allclose(s.raw_HxLxL, raw, atol=TOL)
    np.testing.assert_allclose(s.scaled_HxLxL, raw / np.sqrt(k), atol=TOL)
    np.testing.assert_allclose(s.weights_HxLxL[:, :n], weights[layer][row, :, :n], atol=TOL)
    assert np.all(np.asarray(s.weights_HxLxL)[:, :, n:] == 0)  # padding keys get no weight
    assert electra.model.steps_input(cfg, layer) == (
        "X: word + position + token type embeddings after LayerNorm, projected to 32"
        if layer == 0
        else "X: layer 0's output (after its LayerNorm)"
    )
