"""The batched forward pass's XLA options: YNNPACK's fusions off on CPU where jaxlib has them,
nothing passed where it does not, and the same probabilities either way."""

import jax
import jax.numpy as jnp
import numpy as np

from attn import classifier
from experiments.training import classify, xla_options

CFG = classifier.ModelConfig(vocab_size=300, d_model=64, num_heads=4, d_ff=256, max_len=64)


def _batch(b: int = 16, length: int = 64) -> dict:
    rng = np.random.default_rng(0)
    mask = np.arange(length)[None] < rng.integers(length // 2, length + 1, b)[:, None]
    tokens = np.where(mask, rng.integers(2, CFG.vocab_size, (b, length)), 0).astype(np.int32)
    return {
        "tokens": jnp.asarray(tokens),
        "mask": jnp.asarray(mask),
        "label": jnp.asarray(rng.integers(0, 2, b), jnp.int32),
        "weight": jnp.ones(b, jnp.float32),
    }


def _hlo(fn, params: dict, batch: dict) -> str:
    """The compiled program's text, where XLA names its YNNPACK fusions."""
    return fn.lower(params, batch, cfg=CFG).compile().as_text()


def test_eval_step_compiles_without_ynnpack_fusions_where_xla_makes_them():
    params, batch = classifier.init(jax.random.PRNGKey(0), CFG), _batch()
    plain = jax.jit(classify.sums_and_probabilities, static_argnames="cfg")
    served = _hlo(classify._jitted_eval_step(), params, batch)
    assert "ynn_fusion" not in served
    if "ynn_fusion" in _hlo(plain, params, batch):  # this jaxlib fuses into YNNPACK kernels
        assert xla_options.forward() == {"xla_cpu_experimental_ynn_fusion_type": ""}


def test_an_option_this_xla_does_not_know_is_not_passed(monkeypatch):
    monkeypatch.setattr(xla_options, "NO_YNN", {"xla_cpu_no_such_option_here": ""})
    xla_options.forward.cache_clear()
    try:
        assert xla_options.forward() == {}
    finally:
        xla_options.forward.cache_clear()


def test_eval_step_gives_the_probabilities_of_xlas_defaults():
    params, batch = classifier.init(jax.random.PRNGKey(1), CFG), _batch()
    sums, probs_BxC = classify.eval_step(params, batch, cfg=CFG)
    plain_sums, plain_BxC = jax.jit(classify.sums_and_probabilities, static_argnames="cfg")(
        params, batch, cfg=CFG
    )
    # float32 sums over d_model terms in another order: a few ulps of a probability
    np.testing.assert_allclose(np.asarray(probs_BxC), np.asarray(plain_BxC), atol=1e-6)
    np.testing.assert_allclose(float(sums["loss_sum"]), float(plain_sums["loss_sum"]), rtol=1e-5)
