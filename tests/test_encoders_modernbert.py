"""ModernBERT (`attn.encoders.modernbert`): a float64 numpy forward written here from the
checkpoint's own tensors and config.json (rotary positions as complex numbers, the local window
as |i - j| <= local_attention // 2, Wqkv and Wi split by hand), the options it refuses, the
alternating masks, chunked attention (memory linear in L with the window), jit, vmap, grad,
dropout, bfloat16, padding, and the step-by-step values it draws or refuses.

The goldens against transformers itself are tests/test_encoders.py's."""

import dataclasses
import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, run_here, tree_hash
from safetensors.numpy import load_file

import attn
from attn import encoders, layers, models, pooling
from attn.encoders import modernbert
from attn.encoders.modernbert import model
from experiments import cli, train

DATA = ROOT / "tests" / "data" / "encoders"
TINY = DATA / "tiny_modernbert"
# As tests/test_encoders.py: float32 through 3 blocks of width 32, values up to about 6.
TOL = 1e-5


# Jitted (config, attend and flags static): op-by-op dispatch compiles every operation alone.
ENCODE = jax.jit(
    model.encode, static_argnums=1, static_argnames=("attend", "train", "return_weights")
)
STEPS = jax.jit(model.attention_steps, static_argnums=1, static_argnames=("layer",))


@functools.lru_cache(maxsize=1)
def _tiny():
    return encoders.load(TINY)


def _golden() -> dict:
    return dict(np.load(DATA / "tiny_modernbert_golden.npz", allow_pickle=False))


def _encode(params, cfg, ids, mask, **kw):
    with jax.default_matmul_precision("float32"):
        return np.asarray(ENCODE(params, cfg, ids, mask > 0, **kw), np.float32)


def _real_max(a, b, mask) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))[mask > 0].max())


# --- an independent float64 forward ----------------------------------------------------------


def _layer_norm(x, w, eps):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w


def _gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _rotate(x_HxLxK, theta):
    """Channel c and c + K/2 as one complex number, times exp(i * position * theta^(-2c/K))."""
    half = x_HxLxK.shape[-1] // 2
    z = x_HxLxK[..., :half] + 1j * x_HxLxK[..., half:]
    angle = np.arange(x_HxLxK.shape[1])[:, None] * theta ** (-np.arange(half) / half)
    z = z * np.exp(1j * angle)
    return np.concatenate([z.real, z.imag], axis=-1)


def _reference(directory, ids_L, mask_L):
    """ModernBERT's last hidden states [L, D] of one sequence, in float64 numpy."""
    hf = json.loads((directory / "config.json").read_text())
    t = {k: v.astype(np.float64) for k, v in load_file(directory / "model.safetensors").items()}
    eps, heads, d = hf["norm_eps"], hf["num_attention_heads"], hf["hidden_size"]
    k_dim, length = d // heads, len(ids_L)
    x = _layer_norm(t["embeddings.tok_embeddings.weight"][ids_L], t["embeddings.norm.weight"], eps)
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    for n in range(hf["num_hidden_layers"]):
        p = f"layers.{n}."
        h = x if n == 0 else _layer_norm(x, t[p + "attn_norm.weight"], eps)
        qkv = (h @ t[p + "attn.Wqkv.weight"].T).reshape(length, 3, heads, k_dim)
        q, k, v = (qkv[:, s].transpose(1, 0, 2) for s in range(3))  # each [H, L, K]
        local = n % hf["global_attn_every_n_layers"] != 0
        theta = hf["local_rope_theta"] if local else hf["global_rope_theta"]
        q, k = _rotate(q, theta), _rotate(k, theta)
        allowed = np.broadcast_to(mask_L[None, :], (length, length))
        if local:
            allowed = allowed & (np.abs(i - j) <= hf["local_attention"] // 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(k_dim)
        w = np.where(allowed, np.exp(s - s.max(-1, keepdims=True)), 0.0)
        w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)  # a row with no key: 0
        a = (w @ v).transpose(1, 0, 2).reshape(length, d)
        x = x + a @ t[p + "attn.Wo.weight"].T
        h = _layer_norm(x, t[p + "mlp_norm.weight"], eps)
        gate_in, gate = np.split(h @ t[p + "mlp.Wi.weight"].T, 2, axis=-1)
        x = x + (_gelu(gate_in) * gate) @ t[p + "mlp.Wo.weight"].T
    return _layer_norm(x, t["final_norm.weight"], eps)


def test_encode_equals_an_independent_float64_forward():
    params, cfg = _tiny()
    g = _golden()
    h = _encode(params, cfg, g["ids"], g["mask"])
    for b in range(len(g["ids"])):
        want = _reference(TINY, g["ids"][b], g["mask"][b] > 0)
        assert _real_max(h[b], want, g["mask"][b]) < TOL
        # ... which is transformers' own to within its float32 rounding.
        assert _real_max(g["hidden"][b], want, g["mask"][b]) < TOL


def test_config_json_is_read_into_the_config():
    _, cfg = _tiny()
    assert (cfg.num_layers, cfg.global_every, cfg.local_window) == (3, 2, 4)
    assert (cfg.global_theta, cfg.local_theta, cfg.pad_id, cfg.d_ff) == (160000.0, 10000.0, 399, 48)
    assert cfg.max_length == 64  # max_position_embeddings (tokenizer's model_max_length too)
    assert [model.is_global(cfg, i) for i in range(3)] == [True, False, True]
    assert encoders.family(cfg) is modernbert.FAMILY


# --- what config.json may ask that this encoder does not compute ----------------------------


def _with(tmp_path, **changes):
    out = tmp_path / "model"
    out.mkdir()
    hf = json.loads((TINY / "config.json").read_text())
    hf.update(changes)
    for key in [k for k, v in changes.items() if v is ...]:  # ... = left out
        del hf[key]
    (out / "config.json").write_text(json.dumps(hf))
    (out / "model.safetensors").symlink_to(TINY / "model.safetensors")
    return out


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"hidden_activation": "gelu_pytorch_tanh"}, "hidden_activation 'gelu_pytorch_tanh'"),
        ({"hidden_activation": "silu"}, "hidden_activation 'silu'"),
        ({"attention_bias": True}, "attention_bias True (no biases)"),
        ({"mlp_bias": True}, "mlp_bias True (no biases)"),
        ({"norm_bias": True}, "norm_bias True (no biases)"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"hidden_size": ...}, "no hidden_size"),
        ({"num_attention_heads": 32}, "heads of an even width"),
        ({"global_attn_every_n_layers": 0}, "global_every must be an integer >= 1"),
        ({"local_attention": -1}, "local_window must be an integer >= 0"),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, dict) else None,
)
def test_an_option_it_does_not_compute_is_refused_in_one_line(tmp_path, changes, words):
    with pytest.raises(encoders.CheckpointError) as e:
        encoders.load(_with(tmp_path, **changes))
    assert words in str(e.value) and "\n" not in str(e.value)
    assert "config.json is not supported" in str(e.value)


def test_what_config_json_leaves_out_takes_transformers_defaults(tmp_path):
    """local_rope_theta null means the global theta (as ModernBertAttention reads it); a plain
    rope_scaling is accepted; biases stated False are fine."""
    _, cfg = encoders.load(
        _with(tmp_path, local_rope_theta=None, rope_scaling={"rope_type": "default"})
    )
    assert cfg.local_theta == cfg.global_theta == 160000.0


# --- the alternating masks -------------------------------------------------------------------


def test_local_layers_attend_within_the_window_and_global_ones_everywhere():
    params, cfg = _tiny()
    g = _golden()
    _, weights = ENCODE(params, cfg, g["ids"], g["mask"] > 0, return_weights=True)
    length = g["ids"].shape[1]
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    for n, w_BxHxLxL in enumerate(weights):
        w = np.asarray(w_BxHxLxL)
        for b in range(len(g["ids"])):
            real = g["mask"][b] > 0
            allowed = np.broadcast_to(real[None, :], (length, length))
            if n % 2:  # local: |i - j| <= 4 // 2
                allowed = allowed & (np.abs(i - j) <= 2)
            assert np.all(w[b][:, ~allowed] == 0.0), n
            assert np.all(w[b][:, allowed & real[:, None]] > 0.0), n  # real queries
            np.testing.assert_allclose(w[b][:, real].sum(-1), 1.0, atol=1e-6)


def test_the_layer_mask_is_attns_window_and_key_padding():
    _, cfg = _tiny()
    mask_L = jnp.array([True] * 6 + [False] * 2)
    assert model.layer_mask(cfg, 0, mask_L) is mask_L
    local = model.layer_mask(cfg, 1, mask_L)
    assert isinstance(local, attn.masks.MaskFunction)  # evaluated block by block when chunked
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    want = (np.abs(i - j) <= 2) & np.asarray(mask_L)[None, :]
    np.testing.assert_array_equal(attn.masks.matrix(local, 8, 8), want)


# --- implementations, transforms, dtypes -----------------------------------------------------


def test_chunked_equals_the_matrix_form_across_chunk_boundaries():
    params, cfg = _tiny()
    g = _golden()
    h = _encode(params, cfg, g["ids"], g["mask"])
    for q_chunk, k_chunk in ((3, 5), (16, 2)):
        chunked = attn.Attention(implementation="chunked", q_chunk=q_chunk, k_chunk=k_chunk)
        assert (
            _real_max(_encode(params, cfg, g["ids"], g["mask"], attend=chunked), h, g["mask"]) < TOL
        )


def test_xla_equals_the_matrix_form():
    params, cfg = _tiny()
    g = _golden()
    h = _encode(params, cfg, g["ids"], g["mask"])
    xla = attn.Attention(implementation="xla")
    assert _real_max(_encode(params, cfg, g["ids"], g["mask"], attend=xla), h, g["mask"]) < TOL


def _temp_bytes(implementation: str, length: int) -> int:
    cfg = model.Config(
        vocab_size=64, d_model=32, num_layers=2, num_heads=2, d_ff=48, max_positions=length,
        global_every=2, local_window=8, pad_id=0,
    )  # fmt: skip
    params = jax.eval_shape(functools.partial(model.init, cfg=cfg), jax.random.key(0))
    ids = jax.ShapeDtypeStruct((1, length), jnp.int32)
    mask = jax.ShapeDtypeStruct((1, length), jnp.bool_)
    attend = attn.Attention(implementation=implementation)
    f = jax.jit(lambda p, i, m: model.encode(p, cfg, i, m, attend=attend))
    return f.lower(params, ids, mask).compile().memory_analysis().temp_size_in_bytes


def test_chunked_keeps_memory_linear_in_length_with_the_local_window():
    """The window is a mask function, never an [L, L] array: a global and a local layer in
    chunked form take memory linear in L (4x the length, at most 4.5x the bytes; one [L, L]
    float32 matrix is 64 MiB at 4096), where the matrix form grows as L^2."""
    small, large = _temp_bytes("chunked", 1024), _temp_bytes("chunked", 4096)
    assert large / small <= 4.5, (small, large)
    assert large < 4096 * 4096 * 4 / 8
    assert _temp_bytes("matrix", 4096) >= 4096 * 4096 * 4


def test_jit_vmap_and_grad():
    params, cfg = _tiny()
    g = _golden()
    mask = g["mask"] > 0
    h = np.asarray(model.encode(params, cfg, g["ids"], mask))  # eager
    np.testing.assert_allclose(ENCODE(params, cfg, g["ids"], mask), h, atol=TOL)
    two = jax.jit(jax.vmap(lambda i, m: model.encode(params, cfg, i, m)))(
        np.stack([g["ids"], g["ids"][::-1]]), np.stack([mask, mask[::-1]])
    )
    np.testing.assert_allclose(two[0], h, atol=TOL)
    np.testing.assert_allclose(two[1], h[::-1], atol=TOL)

    def loss(p):
        pooled_BxD = jax.vmap(pooling.mean_pool)(model.encode(p, cfg, g["ids"], mask), mask)
        return jnp.square(pooled_BxD).mean()

    grads = jax.jit(jax.grad(loss))(params)
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert bool(jnp.isfinite(leaf).all()), jax.tree_util.keystr(path)
        assert float(jnp.abs(leaf).max()) > 0, jax.tree_util.keystr(path)


def test_layer_norm_backward_is_autodiffs(monkeypatch):
    """The LayerNorm's own backward (written so that XLA does not copy the residual stream's
    cotangent into every later block) gives the gradients autodiff of attn.layers.layer_norm
    gives, to float32 rounding, in every parameter; in bfloat16 compute, x's cotangent is
    bfloat16, within a rounding of autodiff's."""
    params, cfg = _tiny()
    g = _golden()
    mask = g["mask"] > 0

    def grads():
        def loss(p):
            h_BxLxD = model.encode(p, cfg, g["ids"], mask)
            return jnp.square(jax.vmap(pooling.mean_pool)(h_BxLxD, mask)).mean()

        return jax.jit(jax.grad(loss))(params)

    own = grads()
    autodiff_norm = functools.partial(
        layers.layer_norm, {"scale": jnp.ones(8), "bias": 0.0}, eps=1e-5
    )
    x16 = jnp.asarray(np.random.default_rng(0).normal(3.0, 2.0, (4, 8)), jnp.bfloat16)
    w = np.random.default_rng(1).normal(size=(4, 8))
    dx16 = [
        jax.grad(lambda x, f=f: (f(x).astype(jnp.float32) * w).sum())(x16)
        for f in (lambda x: model._layer_norm(x, jnp.ones(8), 1e-5), autodiff_norm)
    ]
    monkeypatch.setattr(
        model,
        "_norm",
        lambda p, x, c: layers.layer_norm({"scale": p["scale"], "bias": 0.0}, x, c.norm_eps),
    )
    autodiff = grads()
    leaves = zip(jax.tree_util.tree_leaves_with_path(autodiff), jax.tree.leaves(own), strict=True)
    for (path, a), b in leaves:
        assert float(jnp.abs(a - b).max()) <= 1e-5 * float(jnp.abs(a).max()), path
    assert dx16[0].dtype == jnp.bfloat16
    own16, autodiff16 = (np.asarray(dx, np.float32) for dx in dx16)
    np.testing.assert_allclose(own16, autodiff16, atol=2.0**-7 * np.abs(autodiff16).max())


def test_dropout_needs_rng_and_each_rate_draws_its_own_masks():
    params, cfg = _tiny()
    g = _golden()
    args = (g["ids"], g["mask"] > 0)
    plain = ENCODE(params, cfg, *args)
    for name in ("embedding_dropout", "dropout", "attention_dropout"):
        c = dataclasses.replace(cfg, **{name: 0.3})
        with pytest.raises(ValueError, match="needs an rng"):
            ENCODE(params, c, *args, train=True)
        a = ENCODE(params, c, *args, train=True, rng=jax.random.key(0))
        b = ENCODE(params, c, *args, train=True, rng=jax.random.key(0))
        other = ENCODE(params, c, *args, train=True, rng=jax.random.key(1))
        np.testing.assert_array_equal(a, b)
        assert float(jnp.abs(a - other).max()) > 0.05, name
        assert float(jnp.abs(a - plain).max()) > 0.05, name
    every = dataclasses.replace(cfg, embedding_dropout=0.3, dropout=0.3, attention_dropout=0.3)
    np.testing.assert_array_equal(ENCODE(params, every, *args), plain)  # none in evaluation
    # Attention dropout needs the weights; without it the chunked form trains.
    chunked = attn.Attention(implementation="chunked")
    c = dataclasses.replace(cfg, attention_dropout=0.3)
    with pytest.raises(ValueError, match="implementation='matrix'"):
        ENCODE(params, c, *args, train=True, rng=jax.random.key(0), attend=chunked)
    c = dataclasses.replace(cfg, dropout=0.3, embedding_dropout=0.3)
    out = ENCODE(params, c, *args, train=True, rng=jax.random.key(0), attend=chunked)
    assert bool(jnp.isfinite(out).all())


def test_bfloat16_compute_keeps_float32_params_and_stays_close():
    """bfloat16 keeps 8 significant bits: a rounding is within 2^-8 of the value. The residual
    stream is never normalised between pre-LayerNorm blocks, so a rounding is of its largest
    value R; the final LayerNorm divides by each token's spread, at least S. Each block rounds
    about 10 times on the way from its input to the stream (its LayerNorm, the q, k and v and
    output projections, rotary, the GeGLU's two projections, product and output, the sums):
    allow 3 blocks of 10 roundings of 2^-8 R / S."""
    params, cfg = _tiny()
    g = _golden()
    mask = g["mask"] > 0
    h16 = ENCODE(params, dataclasses.replace(cfg, dtype="bfloat16"), g["ids"], mask)
    assert h16.dtype == jnp.bfloat16
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    x = model.embed(params, cfg, g["ids"], mask)
    stream, _ = model._blocks(
        params, cfg, x, mask, attend=attn.attention, train=False, rng=None, stop=3
    )
    stream = np.asarray(stream)[mask]
    bound = 3 * 10 * 2.0**-8 * np.abs(stream).max() / stream.std(-1).min()
    assert _real_max(np.asarray(h16, np.float32), g["hidden"], g["mask"]) < bound


def test_more_padding_changes_no_real_token():
    """Positions count from 0 whatever the padding, and padded keys are masked in both kinds of
    layer: a row padded with 9 more pad ids has the same states on its real tokens."""
    params, cfg = _tiny()
    g = _golden()
    ids = np.pad(g["ids"], ((0, 0), (0, 9)), constant_values=cfg.pad_id)
    mask = np.pad(g["mask"], ((0, 0), (0, 9)))
    h = _encode(params, cfg, g["ids"], g["mask"])
    assert _real_max(h, _encode(params, cfg, ids, mask)[:, :16], g["mask"]) < TOL
    # ... and each row alone, unpadded, equals it too.
    for b in range(len(g["ids"])):
        n = int(g["mask"][b].sum())
        alone = _encode(params, cfg, g["ids"][b : b + 1, :n], g["mask"][b : b + 1, :n])
        assert _real_max(alone[0], h[b, :n], np.ones(n)) < TOL


def test_inputs_that_cannot_work_are_one_line_errors():
    params, cfg = _tiny()
    for kw, words in (
        ({"ids_BxL": np.ones((1, 65), np.int32), "mask_BxL": np.ones((1, 65), bool)},
         "truncate to 64 tokens"),
        ({"ids_BxL": np.ones((1, 4), np.int32), "mask_BxL": np.ones((1, 4), bool),
          "types_BxL": np.ones((1, 4), np.int32)}, "no token types"),
        ({"ids_BxL": np.full((1, 4), 448, np.int32), "mask_BxL": np.ones((1, 4), bool)},
         "outside the vocabulary [0, 448)"),
    ):  # fmt: skip
        with pytest.raises(ValueError) as e:
            model.encode(params, cfg, **kw)
        assert words in str(e.value) and "\n" not in str(e.value)


def test_init_has_the_checkpoints_layout():
    params, cfg = _tiny()
    fresh = encoders.init(jax.random.key(0), cfg)
    assert jax.tree.structure(fresh) == jax.tree.structure(params)
    assert jax.tree.map(jnp.shape, fresh) == jax.tree.map(jnp.shape, params)
    assert "ln_att" not in fresh["layer_0"] and "ln_att" in fresh["layer_1"]
    w = np.asarray(fresh["layer_1"]["mha"]["q"]["w"])
    assert np.abs(w).max() <= 2 * cfg.initializer_range  # cut at 2 standard deviations


# --- step by step ----------------------------------------------------------------------------


@pytest.mark.parametrize("layer", [0, 2])
def test_steps_of_a_global_layer_are_encodes_own_weights_with_rotated_q_and_k(layer):
    params, cfg = _tiny()
    g = _golden()
    b = 1  # 7 real tokens, 9 padded
    ids, mask = g["ids"][b], g["mask"][b] > 0
    with jax.default_matmul_precision("float32"):
        st = STEPS(params, cfg, ids, mask, layer=layer)
        _, weights = ENCODE(params, cfg, ids[None], mask[None], return_weights=True)
    np.testing.assert_allclose(st.weights_HxLxL, weights[layer][0], atol=1e-6)
    # Q is X through the head's columns of Wq, then rotated by position (theta 160000).
    mha, k_dim = params[f"layer_{layer}"]["mha"], cfg.d_model // cfg.num_heads
    q = (np.asarray(st.x_LxD, np.float64) @ np.asarray(mha["q"]["w"], np.float64)).reshape(
        16, cfg.num_heads, k_dim
    )
    np.testing.assert_allclose(st.q_HxLxK, _rotate(q.transpose(1, 0, 2), 160000.0), atol=1e-5)
    q, k = np.asarray(st.q_HxLxK, np.float64), np.asarray(st.k_HxLxK, np.float64)
    np.testing.assert_allclose(st.raw_HxLxL, q @ k.transpose(0, 2, 1), atol=1e-5)
    assert models.steps_qk(attn.encoder_classifier.Config(encoder=cfg, max_len=16), layer) == (
        "Q = rotary(X Wq), θ=160000",
        "K = rotary(X Wk), θ=160000",
    )


def test_steps_x_is_what_the_attention_reads():
    params, cfg = _tiny()
    g = _golden()
    ids, mask = g["ids"][0], g["mask"][0] > 0
    st0 = STEPS(params, cfg, ids, mask, layer=0)
    e = model.embed(params, cfg, ids[None], mask[None])[0]
    np.testing.assert_allclose(st0.x_LxD, e, atol=1e-6)  # layer 0 has no attention LayerNorm
    # Layer 2's X is its attention LayerNorm of the stream after layers 0 and 1: the encoder of
    # those two layers with that LayerNorm as its final one.
    below, cfg_below = encoders.first_layers(params, cfg, 2)
    below = {**below, "final_ln": params["layer_2"]["ln_att"]}
    x = ENCODE(below, cfg_below, ids[None], mask[None])[0]
    st2 = STEPS(params, cfg, ids, mask, layer=2)
    np.testing.assert_allclose(st2.x_LxD, x, atol=1e-6)
    assert "layer 1" in model.steps_input(cfg, 2) and "no attention" in model.steps_input(cfg, 0)


def test_steps_of_a_local_layer_are_refused_in_one_line():
    params, cfg = _tiny()
    g = _golden()
    with pytest.raises(ValueError) as e:
        STEPS(params, cfg, g["ids"][0], g["mask"][0] > 0, layer=1)
    message = str(e.value)
    assert "layer 1 is a local layer" in message and "draw a global layer: 0, 2" in message
    assert "\n" not in message


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory) -> str:
    """configs/finetune.py:tiny on tiny_modernbert for 2 steps."""
    tmp = tmp_path_factory.mktemp("modernbert")
    words = ("dull boring", "fine moving")
    rows = [f"the film {i} was {words[i % 2]},{('neg', 'pos')[i % 2]}" for i in range(120)]
    (tmp / "reviews.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    workdir = str(tmp / "run")
    flags = [
        "--config=configs/finetune.py:tiny",
        f"--config.model.pretrained={TINY}",
        f"--config.data.path={tmp / 'reviews.csv'}",
        "--config.train.max_steps=2",
        "--config.train.baseline=False",
        f"--workdir={workdir}",
    ]
    assert cli.run(train.define_flags, train.main, ["train", *flags]) == 0
    return workdir


def test_visualize_draws_a_global_layer_and_refuses_a_local_one_in_one_line(
    finetuned, tmp_path, capsys
):
    out = str(tmp_path / "vis")
    argv = ("experiments.visualize", f"--workdir={finetuned}", f"--out={out}", "--steps")
    proc = run_here(*argv, "--layer=2", "a dull film", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    page = open(f"{out}/attention.html", encoding="utf-8").read()
    assert "<b>Q = rotary(X Wq), θ=160000</b>" in page and "Q = X Wq<" not in page
    before = tree_hash(finetuned)
    proc = run_here(*argv, "--layer=1", "a dull film", capsys=capsys)
    assert_one_line_error(proc, "--layer=1: layer 1 is a local layer", "draw a global layer")
    assert tree_hash(finetuned) == before
