"""The DeBERTa-v2 family (attn.encoders.deberta) beyond the shared tests of test_encoders.py: every
config.json option it does not compute is refused in one line; its log buckets and disentangled
score against independent numpy references (written here from transformers' algorithm: HF's
bucket formula per element, its gathers and transposes literally); chunked equals matrix and stays
linear in memory; jit, vmap and grad; dropout; bfloat16; padding; the attention steps and their
figure titles; the task heads skipped."""

import dataclasses
import functools
import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT
from safetensors.numpy import load_file, save_file

import attn
from attn import encoders, pooling
from attn.encoders.deberta import model
from attn.encoders.deberta import score as disentangled
from experiments.explain import step_plots

DATA = ROOT / "tests" / "data" / "encoders"
NAMES = ("deberta-v2", "deberta-v2-variant")
# As in test_encoders.py: float32 through two blocks of width 32 with values up to about 5.
TOL = 1e-5


def _load(name: str = "deberta-v2"):
    return encoders.load(DATA / f"tiny_{name}")


def _golden(name: str = "deberta-v2") -> dict:
    return dict(np.load(DATA / f"tiny_{name}_golden.npz", allow_pickle=False))


# Compiled once per config and attend: the eager forward dispatches every small op alone.
_jitted = jax.jit(model.encode, static_argnums=1, static_argnames=("attend",))


def _encode(params, cfg, g, **kw) -> np.ndarray:
    types = g["types"] if cfg.type_vocab_size else None
    with jax.default_matmul_precision("float32"):
        return np.asarray(_jitted(params, cfg, g["ids"], g["mask"] > 0, types, **kw))


def _real_max_diff(a, b, mask) -> float:
    return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))[mask > 0].max())


# ---------------------------------------------------------------- config.json refused


def _with_config(tmp_path, **changes):
    src = DATA / "tiny_deberta-v2"
    d = tmp_path / "model"
    d.mkdir()
    save_file(load_file(src / "model.safetensors"), d / "model.safetensors")
    hf = json.loads((src / "config.json").read_text(encoding="utf-8"))
    hf.update(changes)
    (d / "config.json").write_text(json.dumps(hf), encoding="utf-8")
    return d


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new' (only 'gelu'"),
        ({"relative_attention": False}, "relative_attention False (only true"),
        ({"conv_kernel_size": 3}, "conv_kernel_size 3 (no convolution layer"),
        ({"embedding_size": 16}, "embedding_size 16 (only hidden_size, 32)"),
        ({"attention_head_size": 4}, "attention_head_size 4 (only hidden_size / num_att"),
        ({"pos_att_type": ["c2p", "p2p"]}, "pos_att_type 'p2p' (only c2p and p2c)"),
        ({"pos_att_type": "p2c|p2p"}, "pos_att_type 'p2p' (only c2p and p2c)"),
        ({"pos_att_type": 3}, "pos_att_type 3 (a list of c2p and p2c)"),
        ({"norm_rel_ebd": "batch_norm"}, "norm_rel_ebd 'batch_norm' (only 'layer_norm' or"),
        ({"position_buckets": 8, "max_relative_positions": 5}, "log buckets need"),
        ({"architectures": ["DebertaV2ForPreTraining"]}, "architecture DebertaV2ForPreTraining"),
    ],
)
def test_an_option_attn_does_not_compute_is_refused_in_one_line(tmp_path, changes, named):
    with pytest.raises(encoders.CheckpointError) as e:
        encoders.load(_with_config(tmp_path, **changes))
    assert named in str(e.value) and "\n" not in str(e.value)


def test_older_configs_pos_att_type_string_is_read(tmp_path):
    _, cfg = encoders.load(_with_config(tmp_path, pos_att_type="p2c|c2p"))
    assert cfg.pos_att_type == ("c2p", "p2c")


# ---------------------------------------------------------------- buckets and the score


def _hf_bucket(r: int, buckets: int, max_position: int) -> int:
    """make_log_bucket_position for one relative position, in float64 math."""
    mid = buckets // 2
    if abs(r) <= mid:
        return r
    log_pos = math.ceil(math.log(abs(r) / mid) / math.log((max_position - 1) / mid) * (mid - 1))
    return int(math.copysign(log_pos + mid, r))


@pytest.mark.parametrize("buckets, max_position", [(8, 64), (256, 512), (32, 100)])
def test_log_buckets_are_transformers(buckets, max_position):
    rel = np.arange(-3 * max_position, 3 * max_position)
    want = [_hf_bucket(int(r), buckets, max_position) for r in rel]
    assert disentangled.log_bucket(rel, buckets, max_position).tolist() == want
    if buckets == 8:  # transformers' own relative_pos of the golden (L = 16)
        pos = np.arange(16)
        np.testing.assert_array_equal(
            disentangled.log_bucket(pos[:, None] - pos[None, :], 8, 64),
            _golden()["relative_pos"],
        )
        np.testing.assert_array_equal(
            np.arange(16)[:, None] - np.arange(16)[None, :],
            _golden("deberta-v2-variant")["relative_pos"],
        )


def _reference_scores(q, k, pk, pq, buckets, max_position, span, terms):
    """transformers' disentangled_attention_bias (+ the content term, scaled) in float64 numpy,
    as it computes it: relative_pos [L, L], c2p gathered at clamp(rel + span), p2c gathered at
    clamp(-rel + span) along the keys' own rows and then transposed."""
    q, k, pk, pq = (np.asarray(a, np.float64) for a in (q, k, pk, pq))
    n = q.shape[0]
    rel = np.array(
        [
            [_hf_bucket(i - j, buckets, max_position) if buckets > 0 else i - j for j in range(n)]
            for i in range(n)
        ]
    )
    s = q @ k.T
    if "c2p" in terms:
        c2p = q @ pk.T
        s += np.take_along_axis(c2p, np.clip(rel + span, 0, 2 * span - 1), axis=-1)
    if "p2c" in terms:
        p2c = k @ pq.T
        s += np.take_along_axis(p2c, np.clip(-rel + span, 0, 2 * span - 1), axis=-1).T
    return s / np.sqrt(q.shape[1] * (1 + len(terms)))


@pytest.mark.parametrize(
    "buckets, max_position, span",
    [(8, 64, 8), (-1, 6, 6), (4, 10, 4)],
)
@pytest.mark.parametrize("terms", [(), ("c2p",), ("p2c",), ("c2p", "p2c")])
def test_the_disentangled_score_is_transformers(buckets, max_position, span, terms):
    n, d = 21, 8
    sc = disentangled.score(span, buckets, max_position, n, terms, d)
    q, k = jax.random.normal(jax.random.key(0), (2, n, d))
    params = sc.init(jax.random.key(1), d)
    assert sorted(params) == sorted(
        {"c2p": "pos_key_rxK", "p2c": "pos_query_rxK"}[t] for t in terms
    )
    pk = params.get("pos_key_rxK", np.zeros((2 * span, d)))
    pq = params.get("pos_query_rxK", np.zeros((2 * span, d)))
    want = _reference_scores(q, k, pk, pq, buckets, max_position, span, terms)
    pos = jnp.arange(n)
    got = attn.scores.evaluate(sc, params, q, k, pos, pos)
    # Sums of 3 * 8 float32 products of N(0, 1) values: errors of a few 1e-7 on scores of a few.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    raw = attn.scores.evaluate(sc.unscaled, params, q, k, pos, pos)
    np.testing.assert_allclose(raw, want * np.sqrt(d * (1 + len(terms))), rtol=1e-5, atol=1e-4)
    assert sc.unscaled.name == " + ".join(("content", *terms))
    assert sc.divisor == f"√({d}·{1 + len(terms)})"


def test_the_score_in_chunks_of_any_size_equals_its_matrix_form():
    n, d = 37, 8
    sc = disentangled.score(8, 8, 64, n, ("c2p", "p2c"), d)
    q, k, v = jax.random.normal(jax.random.key(2), (3, n, d))
    params = sc.init(jax.random.key(3), d)
    mask = jnp.arange(n) < 30
    want, _ = attn.attention(q, k, v, mask, score=sc, score_params=params)
    for cq, ck in ((5, 3), (16, 16), (37, 1)):
        got, _ = attn.attention(
            q, k, v, mask, score=sc, score_params=params, implementation="chunked",
            q_chunk=cq, k_chunk=ck,
        )  # fmt: skip
        np.testing.assert_allclose(got, want, atol=1e-5)


def _temp_bytes(length: int) -> int:
    sc = disentangled.score(256, 256, 4096, 4096, ("c2p", "p2c"), 32)
    params = jax.eval_shape(lambda: sc.init(jax.random.key(0), 32))
    q = jax.ShapeDtypeStruct((length, 32), jnp.float32)

    def loss(q, params):
        out, _ = attn.attention(
            q, q, q, score=sc, score_params=params, implementation="chunked", q_chunk=128,
            k_chunk=128,
        )  # fmt: skip
        return out.sum()

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(q, params).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_chunked_backward_memory_is_linear_in_length():
    """Forward and backward over the score's tables in blocks: 4x the length costs at most
    about 4x the memory (an [L, L] float32 matrix at L = 4096 would be 64 MiB alone)."""
    small, large = _temp_bytes(1024), _temp_bytes(4096)
    assert large / small <= 4.5, (small, large)
    assert large < 4096 * 4096 * 4 / 8


# ---------------------------------------------------------------- the encoder


@pytest.mark.parametrize("name", NAMES)
def test_chunked_attention_equals_the_matrix_form(name):
    params, cfg = _load(name)
    g = _golden(name)
    chunked = attn.Attention(implementation="chunked", q_chunk=5, k_chunk=3)
    h = _encode(params, cfg, g)
    assert _real_max_diff(_encode(params, cfg, g, attend=chunked), h, g["mask"]) < TOL
    partial = functools.partial(attn.attention, implementation="chunked", q_chunk=4)
    assert _real_max_diff(_encode(params, cfg, g, attend=partial), h, g["mask"]) < TOL


def test_what_cannot_compute_the_score_is_refused_in_one_line():
    params, cfg = _load()
    g = _golden()
    for attend, named in (
        (attn.Attention(implementation="xla"), "implementation 'xla'"),
        (functools.partial(attn.attention, implementation="xla"), "implementation 'xla'"),
        (attn.Attention(score="additive"), "attend's score 'additive' would be dropped"),
        (lambda *a, **kw: None, "attend must be attn.attention, an attn.Attention"),
    ):
        with pytest.raises(ValueError, match=named) as e:
            encoders.encode(params, cfg, g["ids"], g["mask"] > 0, attend=attend)
        assert "\n" not in str(e.value)
    # The fine-tuning config says so before anything is traced.
    no_att = dataclasses.replace(cfg, attention_dropout=0.0)
    with pytest.raises(ValueError, match="'xla' cannot run the deberta-v2 encoder: jax.nn") as e:
        attn.encoder_classifier.Config(encoder=no_att, max_len=16, implementation="xla")


@pytest.mark.parametrize("name", NAMES)
def test_more_padding_changes_no_real_token(name):
    params, cfg = _load(name)
    g = _golden(name)
    h = _encode(params, cfg, g)
    pad = lambda x, v: np.pad(x, ((0, 0), (0, 9)), constant_values=v)
    longer = {
        "ids": pad(g["ids"], cfg.pad_id),
        "mask": pad(g["mask"], 0),
        "types": pad(g["types"], 0),
    }
    h_long = _encode(params, cfg, longer)[:, : h.shape[1]]
    assert _real_max_diff(h, h_long, g["mask"]) < TOL  # float rounding of other shapes only
    # ... and the 7-token row alone, unpadded, is that row.
    alone = {k: g[k][1:2, :7] for k in ("ids", "mask", "types")}
    assert _real_max_diff(_encode(params, cfg, alone)[0], h[1, :7], g["mask"][1, :7]) < TOL


def test_jit_vmap_and_grad():
    params, cfg = _load("deberta-v2-variant")
    g = _golden("deberta-v2-variant")
    h = np.asarray(model.encode(params, cfg, g["ids"], g["mask"] > 0, g["types"]))  # eager
    np.testing.assert_allclose(_encode(params, cfg, g), h, atol=1e-5)  # jit
    # vmap over a leading axis of batches equals encoding each batch.
    both = lambda x: np.stack([x, x[::-1]])
    two = jax.jit(jax.vmap(lambda i, m, t: model.encode(params, cfg, i, m, t)))(
        both(g["ids"]), both(g["mask"] > 0), both(g["types"])
    )
    np.testing.assert_allclose(two[0], h, atol=1e-5)
    np.testing.assert_allclose(two[1], h[::-1], atol=1e-5)

    def loss(p):
        h_BxLxD = model.encode(p, cfg, g["ids"], g["mask"] > 0, g["types"])
        pooled_BxD = jax.vmap(pooling.mean_pool)(h_BxLxD, g["mask"] > 0)
        return jnp.square(pooled_BxD).mean()

    grads = jax.jit(jax.grad(loss))(params)
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert bool(jnp.isfinite(leaf).all()), path
        assert float(jnp.abs(leaf).max()) > 0, jax.tree_util.keystr(path)


def test_dropout_needs_rng_and_draws_new_masks():
    params, cfg = _load()
    g = _golden()
    args = (params, cfg, g["ids"], g["mask"] > 0)
    with pytest.raises(ValueError, match="needs an rng"):
        model.encode(*args, train=True)
    a = model.encode(*args, train=True, rng=jax.random.key(0))
    b = model.encode(*args, train=True, rng=jax.random.key(0))
    c = model.encode(*args, train=True, rng=jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert float(jnp.abs(a - c).max()) > 0.1
    assert float(jnp.abs(a - model.encode(*args)).max()) > 0.1
    # Attention dropout needs the weights; without it the chunked form trains.
    chunked = attn.Attention(implementation="chunked")
    with pytest.raises(ValueError, match="implementation='matrix'"):
        model.encode(*args, train=True, rng=jax.random.key(0), attend=chunked)
    no_att = dataclasses.replace(cfg, attention_dropout=0.0)
    out = model.encode(params, no_att, *args[2:], train=True, rng=jax.random.key(0), attend=chunked)
    assert bool(jnp.isfinite(out).all()) and float(jnp.abs(out - model.encode(*args)).max()) > 0.1


def test_bfloat16_compute_keeps_float32_params_and_stays_close():
    """bfloat16 keeps 8 significant bits: each rounding is off by up to 2^-9 of the value, and
    the hidden states (up to about 5 after a LayerNorm) go through some 20 roundings in two
    blocks, so a few hundredths, well under 0.15; a dropped term or a wrong scale is off by 1."""
    params, cfg = _load()
    g = _golden()
    h16 = model.encode(params, dataclasses.replace(cfg, dtype="bfloat16"), g["ids"], g["mask"] > 0)
    assert h16.dtype == jnp.bfloat16
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    assert _real_max_diff(h16, g["hidden"], g["mask"]) < 0.15


@pytest.mark.parametrize("layer", [0, 1])
def test_attention_steps_are_encodes_weights_and_draw_the_scaled_score(layer):
    params, cfg = _load()
    g = _golden()
    ids, mask = g["ids"][1], g["mask"][1] > 0  # 7 real tokens of 16
    st = model.attention_steps(params, cfg, ids, mask, layer=layer)
    _, weights = model.encode(params, cfg, ids[None], mask[None], return_weights=True)
    np.testing.assert_allclose(st.weights_HxLxL, weights[layer][0], atol=1e-6)
    assert float(jnp.abs(st.weights_HxLxL[..., 7:]).max()) == 0.0  # padding keys masked
    # The softmax sees content + c2p + p2c divided by √(K · 3); the figure says so.
    np.testing.assert_allclose(st.scaled_HxLxL, st.raw_HxLxL / np.sqrt(8 * 3), rtol=1e-5, atol=1e-6)
    raw_title, scaled_title = step_plots.score_titles(st.score, 8)
    assert raw_title == "scores S = content + c2p + p2c  [disentangled]"
    assert scaled_title == "scaled S / √(8·3)  (softmax input)"
    if layer == 1:  # X is the first block's output
        below, cfg_below = encoders.first_layers(params, cfg, 1)
        want = model.encode(below, cfg_below, ids[None], mask[None])[0]
        np.testing.assert_allclose(st.x_LxD, want, atol=1e-6)
    assert model.steps_input(cfg, 0) == "X: word embeddings after LayerNorm"
    _, variant = _load("deberta-v2-variant")
    assert "word + position + token type" in model.steps_input(variant, 0)


def test_task_model_layouts_load_the_same_encoder(tmp_path):
    """A masked-LM checkpoint (encoder under "deberta.", lm_predictions.* and the legacy cls.*
    head) loads as the base model; its heads are skipped."""
    params, cfg = _load()
    tensors = load_file(DATA / "tiny_deberta-v2" / "model.safetensors")
    renamed = {f"deberta.{k}": v for k, v in tensors.items()}
    renamed["lm_predictions.lm_head.dense.weight"] = np.zeros((32, 32), np.float32)
    renamed["lm_predictions.lm_head.bias"] = np.zeros((192,), np.float32)
    renamed["cls.predictions.bias"] = np.zeros((192,), np.float32)
    d = tmp_path / "mlm"
    d.mkdir()
    save_file(renamed, d / "model.safetensors")
    hf = json.loads((DATA / "tiny_deberta-v2" / "config.json").read_text(encoding="utf-8"))
    hf["architectures"] = ["DebertaV2ForMaskedLM"]
    (d / "config.json").write_text(json.dumps(hf), encoding="utf-8")
    loaded, cfg_mlm = encoders.load(d)
    assert cfg_mlm == cfg
    for a, b in itertools.zip_longest(jax.tree.leaves(loaded), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
