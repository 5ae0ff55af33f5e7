"""ALBERT's own parts (tests/test_encoders.py holds the goldens, broken checkpoints, tokenizer and
fine-tuning every family passes): a float64 numpy forward written from modeling_albert.py and
reading the stored tensors by their own names; the one layer every depth reads (the parameter
count does not grow with depth, and the first n depths are an ALBERT of n depths); the options
config.json may hold that attn does not compute, refused in one line; the task layouts; a
feed-forward that is never dropped out; and the encoder's implementations, jit, vmap, grad,
bfloat16, padding and step-by-step view."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, assert_trees_equal
from safetensors.numpy import load_file, save_file

import attn
from attn import encoders, pooling
from attn.encoders import albert, blocks, heads

DATA = ROOT / "tests" / "data" / "encoders"
TINY = DATA / "tiny_albert"
# Float32 through a projection and 3 blocks of width 32 with values up to about 5: a few units of
# float32's 6e-8 relative rounding per operation, summed over 16-48 terms per dot product, stays
# below 1e-5.
TOL = 1e-5
LAYER = "encoder.albert_layer_groups.0.albert_layers.0."


def _golden() -> dict:
    g = dict(np.load(DATA / "tiny_albert_golden.npz"))
    return {**g, "mask": g["mask"] > 0}


def _encode(params, cfg, ids, mask, types=None, **kw):
    with jax.default_matmul_precision("float32"):
        return albert.model.encode(params, cfg, ids, mask, types, **kw)


def _real_max_diff(a, b, mask) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))[mask].max())


def _hf() -> dict:
    return json.loads((TINY / "config.json").read_text(encoding="utf-8"))


def _numpy_forward(t: dict, hf: dict, ids, mask, types, depths: int | None = None) -> np.ndarray:
    """float64 AlbertModel from the stored tensors, by their names: `AlbertEmbeddings` (word +
    position 0..L-1 + token type, LayerNorm, embedding_size wide), embedding_hidden_mapping_in,
    then the group's one `AlbertLayer` `depths` times (num_hidden_layers by default): attention
    with its own LayerNorm, then full_layer_layer_norm(ffn_output(gelu_new(ffn(x))) + x)."""
    f = {k: v.astype(np.float64) for k, v in t.items()}
    eps, n_heads = hf["layer_norm_eps"], hf["num_attention_heads"]

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = np.square(x - mu).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * f[f"{name}.weight"] + f[f"{name}.bias"]

    def lin(x, name):
        return x @ f[f"{name}.weight"].T + f[f"{name}.bias"]

    def gelu_new(h):
        return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))

    batch, length = ids.shape
    x = f["embeddings.word_embeddings.weight"][ids]
    x = x + f["embeddings.position_embeddings.weight"][:length]
    x = ln(x + f["embeddings.token_type_embeddings.weight"][types], "embeddings.LayerNorm")
    x = lin(x, "encoder.embedding_hidden_mapping_in")
    d = x.shape[-1]
    k_dim = d // n_heads

    def split(y):
        return y.reshape(batch, length, n_heads, k_dim).transpose(0, 2, 1, 3)

    for _ in range(hf["num_hidden_layers"] if depths is None else depths):
        q, k, v = (split(lin(x, f"{LAYER}attention.{n}")) for n in ("query", "key", "value"))
        s = np.where(mask[:, None, None, :], q @ k.transpose(0, 1, 3, 2) / np.sqrt(k_dim), -1e30)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        a = (w @ v).transpose(0, 2, 1, 3).reshape(batch, length, d)
        x = ln(lin(a, f"{LAYER}attention.dense") + x, f"{LAYER}attention.LayerNorm")
        h = lin(gelu_new(lin(x, f"{LAYER}ffn")), f"{LAYER}ffn_output")
        x = ln(h + x, f"{LAYER}full_layer_layer_norm")
    return x


def test_a_numpy_forward_from_the_stored_names_matches_transformers_and_attn():
    """The oracle reads the checkpoint by ALBERT's own key names and runs its one layer at every
    depth, so it checks attn's rules and computation independently of transformers."""
    g = _golden()
    t = load_file(TINY / "model.safetensors")
    want = _numpy_forward(t, _hf(), g["ids"], g["mask"], g["types"])
    assert _real_max_diff(want, g["hidden_float64"], g["mask"]) < 1e-9  # it is transformers'
    params, cfg = encoders.load(TINY)
    assert (cfg.act, cfg.embedding_size, cfg.num_layers) == ("gelu_new", 16, 3)
    got = _encode(params, cfg, g["ids"], g["mask"], g["types"])
    assert _real_max_diff(got, want, g["mask"]) < TOL


def test_one_layer_serves_every_depth_and_the_first_depths_are_a_shallower_albert():
    """One params entry, read at each of the 3 depths: as many values as the checkpoint stores,
    the same count at any depth; first_layers(n) is the oracle run n times, and n = 0 leaves
    the shared layer out."""
    params, cfg = encoders.load(TINY)
    assert encoders.family(cfg).layer_keys(cfg) == ("layer_0",) * 3
    assert sorted(params) == ["embed", "layer_0", "pooler"]
    stored = load_file(TINY / "model.safetensors")
    assert encoders.param_count(params) == sum(v.size for v in stored.values())
    deeper = dataclasses.replace(cfg, num_layers=12)
    count = encoders.param_count(encoders.init(jax.random.key(0), deeper))
    assert count == encoders.param_count(params)
    g = _golden()
    for n in (1, 2):
        below, cfg_n = encoders.first_layers(params, cfg, n)
        assert cfg_n.num_layers == n and sorted(below) == ["embed", "layer_0", "pooler"]
        want = _numpy_forward(stored, _hf(), g["ids"], g["mask"], g["types"], depths=n)
        got = _encode(below, cfg_n, g["ids"], g["mask"], g["types"])
        assert _real_max_diff(got, want, g["mask"]) < TOL
    none, cfg_0 = encoders.first_layers(params, cfg, 0)
    assert sorted(none) == ["embed", "pooler"]
    np.testing.assert_array_equal(
        _encode(none, cfg_0, g["ids"], g["mask"], g["types"]),
        albert.model.embed(params, cfg, g["ids"], g["mask"], g["types"]),
    )
    with pytest.raises(ValueError, match=r"one layer shared by 3 depths"):
        encoders.encode(none, cfg, g["ids"], g["mask"])


def _variant(tmp_path: pathlib.Path, config=None, edit=None) -> pathlib.Path:
    """A copy of the tiny checkpoint with config.json and its tensors edited."""
    hf = {**_hf(), **(config or {})}
    for key in [k for k, v in (config or {}).items() if v is None]:
        del hf[key]  # None: drop the key
    tensors = load_file(TINY / "model.safetensors")
    out = tmp_path / "model"
    out.mkdir(parents=True)
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
        ({"num_hidden_groups": 3}, "num_hidden_groups 3 (only 1: one layer shared by every depth)"),
        ({"inner_group_num": 2}, "inner_group_num 2 (only 1: one layer shared by every depth)"),
        ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu' (one of gelu, gelu_new,"),
        (
            {"position_embedding_type": "relative_key"},
            "position_embedding_type 'relative_key' (only 'absolute')",
        ),
        ({"embedding_size": None}, "no embedding_size"),
        (
            {"architectures": ["AlbertForCausalLM"]},
            "architecture AlbertForCausalLM is not supported",
        ),
        ({"num_attention_heads": 5}, "d_model=32 must be divisible by albert.Config.num_heads=5"),
    ],
)
def test_an_option_attn_does_not_compute_is_refused_in_one_line(tmp_path, config, named):
    assert named in _refusal(_variant(tmp_path, config))


def test_the_masked_lm_and_pretraining_layouts_load_the_same_encoder(tmp_path, caplog):
    """ "albert." before the encoder, the task heads and the buffers beside it; AlbertForMaskedLM
    has no pooler, so its encoder has none."""
    heads_ = {
        "predictions.bias": (132,),
        "predictions.dense.weight": (16, 32),
        "predictions.dense.bias": (16,),
        "predictions.LayerNorm.weight": (16,),
        "predictions.LayerNorm.bias": (16,),
        "predictions.decoder.weight": (132, 16),
        "predictions.decoder.bias": (132,),
    }
    sop = {"sop_classifier.classifier.weight": (2, 32), "sop_classifier.classifier.bias": (2,)}
    want, cfg_want = encoders.load(TINY)
    for architecture, task in (("AlbertForMaskedLM", heads_), ("AlbertForPreTraining", sop)):

        def edit(t, task=task, architecture=architecture):
            out = {f"albert.{k}": v for k, v in t.items()}
            if architecture == "AlbertForMaskedLM":
                del out["albert.pooler.weight"], out["albert.pooler.bias"]
            out["albert.embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
            out.update({k: np.zeros(shape, np.float32) for k, shape in task.items()})
            return out

        path = _variant(tmp_path / architecture, {"architectures": [architecture]}, edit)
        with caplog.at_level("INFO", logger="attn.encoders"):
            params, cfg = encoders.load(path)
        pooled = architecture != "AlbertForMaskedLM"
        assert cfg == dataclasses.replace(cfg_want, pooler=pooled)
        assert ("pooler" in params) == pooled
        for k in params:
            assert_trees_equal(params[k], want[k])
        skipped = caplog.text.split("skipped ")[-1]
        for name in ("albert.embeddings.position_ids", *task):
            assert name in skipped


def test_the_feed_forward_is_never_dropped_out():
    """transformers' AlbertLayer applies no dropout after its feed-forward: with the attention's
    output projection zeroed (so the attention dropout has nothing to drop), training changes
    nothing after the embeddings' dropout, where BERT's block would still drop the feed-forward."""
    params, cfg = encoders.load(TINY)
    cfg = dataclasses.replace(cfg, dropout=0.5)
    mha = {
        **params["layer_0"]["mha"],
        "o": jax.tree.map(jnp.zeros_like, params["layer_0"]["mha"]["o"]),
    }
    silent = {**params, "layer_0": {**params["layer_0"], "mha": mha}}
    g = _golden()
    args = (g["ids"], g["mask"], g["types"])
    rng = jax.random.key(0)
    trained = albert.model.encode(silent, cfg, *args, train=True, rng=rng)
    x = albert.model.embed(silent, cfg, *args, train=True, rng=jax.random.split(rng)[0])
    keys = albert.model.layer_keys(cfg)
    act = heads.activation(cfg.act)
    evaluated, _ = blocks.stack(silent, cfg, x, g["mask"], keys, act=act)
    np.testing.assert_array_equal(trained, evaluated)
    bert_like, _ = blocks.stack(silent, cfg, x, g["mask"], keys, act=act, train=True, rng=rng)
    assert _real_max_diff(bert_like, evaluated, g["mask"]) > 0.1


def test_dropout_needs_rng_and_draws_new_masks():
    params, cfg = encoders.load(TINY)
    cfg = dataclasses.replace(cfg, dropout=0.1, attention_dropout=0.1)  # the checkpoint's: 0
    g = _golden()
    args = (params, cfg, g["ids"], g["mask"], g["types"])
    with pytest.raises(ValueError, match="needs an rng"):
        albert.model.encode(*args, train=True)
    a = albert.model.encode(*args, train=True, rng=jax.random.key(0))
    b = albert.model.encode(*args, train=True, rng=jax.random.key(0))
    c = albert.model.encode(*args, train=True, rng=jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert _real_max_diff(a, c, g["mask"]) > 0.1
    assert _real_max_diff(a, albert.model.encode(*args), g["mask"]) > 0.1


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


def test_jit_vmap_and_grad_through_the_shared_layer():
    params, cfg = encoders.load(TINY)
    g = _golden()
    args = (g["ids"], g["mask"], g["types"])
    h = np.asarray(_encode(params, cfg, *args))
    with jax.default_matmul_precision("float32"):
        jitted = jax.jit(albert.model.encode, static_argnums=1)(params, cfg, *args)
        two = jax.vmap(lambda i, m, t: albert.model.encode(params, cfg, i, m, t))(
            *(np.stack([a, a[::-1]]) for a in args)
        )
    assert _real_max_diff(jitted, h, g["mask"]) < TOL
    assert _real_max_diff(two[0], h, g["mask"]) < TOL
    assert _real_max_diff(two[1], h[::-1], g["mask"][::-1]) < TOL

    def loss(p):
        h_BxLxD = albert.model.encode(p, cfg, *args)
        return jnp.square(jax.vmap(pooling.mean_pool)(h_BxLxD, g["mask"])).mean()

    grads = jax.jit(jax.grad(loss))({k: v for k, v in params.items() if k != "pooler"})
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert bool(jnp.isfinite(leaf).all()), jax.tree_util.keystr(path)
        assert float(jnp.abs(leaf).max()) > 0, jax.tree_util.keystr(path)


def test_bfloat16_compute_keeps_float32_params_and_stays_close():
    """bfloat16 keeps 8 significant bits (relative rounding 2^-9 per operation); through the
    projection and 3 blocks of about ten rounded operations each, on LayerNorm-scaled values up
    to about 5, the error stays within 5 · 2^-9 · 3 · 10 ≈ 0.3, while a wrong computation is off
    by O(1)."""
    params, cfg = encoders.load(TINY)
    g = _golden()
    h16 = albert.model.encode(
        params, dataclasses.replace(cfg, dtype="bfloat16"), g["ids"], g["mask"], g["types"]
    )
    assert h16.dtype == jnp.bfloat16
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    assert _real_max_diff(np.asarray(h16, np.float32), g["hidden"], g["mask"]) < 5 * 2**-9 * 30


def test_more_padding_changes_no_real_token():
    params, cfg = encoders.load(TINY)
    g = _golden()
    pad = lambda a, v: np.pad(a, ((0, 0), (0, 9)), constant_values=v)  # noqa: E731
    h = _encode(params, cfg, g["ids"], g["mask"], g["types"])
    longer = _encode(
        params, cfg, pad(g["ids"], cfg.pad_id), pad(g["mask"], False), pad(g["types"], 0)
    )
    assert _real_max_diff(longer[:, : g["ids"].shape[1]], h, g["mask"]) < TOL


@pytest.mark.parametrize("layer", [0, 2])
def test_attention_steps_are_each_depths_own_computation(layer):
    """The figure of depth `layer` draws the shared layer on that depth's input: X is the first
    `layer` depths' output (the projected embeddings at depth 0), and the weights are encode's
    returned weights for that depth (token types 0, as the figure draws a text)."""
    params, cfg = encoders.load(TINY)
    g = _golden()
    row, n = 0, int(g["mask"][0].sum())
    with jax.default_matmul_precision("float32"):
        s = encoders.family(cfg).attention_steps(
            params, cfg, g["ids"][row], g["mask"][row], layer=layer
        )
        _, weights = albert.model.encode(params, cfg, g["ids"], g["mask"], return_weights=True)
        x_want = albert.model.encode(
            *encoders.first_layers(params, cfg, layer), g["ids"], g["mask"]
        )
    assert len(weights) == 3 and s.x_LxD.shape == (16, 32)
    np.testing.assert_allclose(s.x_LxD[:n], x_want[row, :n], atol=TOL)
    raw = np.einsum("hik,hjk->hij", s.q_HxLxK, s.k_HxLxK)
    np.testing.assert_allclose(
        s.scaled_HxLxL, raw / np.sqrt(cfg.d_model // cfg.num_heads), atol=TOL
    )
    np.testing.assert_allclose(s.weights_HxLxL[:, :n], weights[layer][row, :, :n], atol=TOL)
    assert np.all(np.asarray(s.weights_HxLxL)[:, :, n:] == 0)  # padding keys get no weight
    assert albert.model.steps_input(cfg, layer) == (
        "X: word + position + token type embeddings after LayerNorm, projected to 32"
        if layer == 0
        else "X: layer 1's output (the shared layer, after its LayerNorm)"
    )
