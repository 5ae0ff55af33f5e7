"""attn.masked_lm: which tokens are hidden and how (statistics over many rows), the head and the
loss against plain numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close32, tol32

from attn import masked_lm

V = 50


def _rows(key, batch=512, length=40):
    """Random rows of real tokens (ids >= 3) with PAD tails, CLS first and some UNK inside."""
    k1, k2, k3 = jax.random.split(key, 3)
    tokens = jax.random.randint(k1, (batch, length), 3, V)
    lengths = jax.random.randint(k2, (batch, 1), 0, length + 1)
    tokens = jnp.where(jnp.arange(length)[None] < lengths, tokens, 0)
    unk = jax.random.bernoulli(k3, 0.05, tokens.shape) & (tokens > 0)
    tokens = jnp.where(unk, 1, tokens)
    return tokens.at[:, 0].set(jnp.where(lengths[:, 0] > 0, 2, 0))


def test_masking_statistics():
    tokens = _rows(jax.random.PRNGKey(0), batch=4096)
    corrupted, t = masked_lm.corrupt(jax.random.PRNGKey(1), tokens, vocab_size=V, rate=0.15)
    tokens, corrupted = np.asarray(tokens), np.asarray(corrupted)
    pos, ids, w = (np.asarray(t[k]) for k in ("positions", "ids", "weight"))
    assert pos.shape == (4096, masked_lm.num_targets(40, 0.15)) == (4096, 6)

    eligible = tokens >= 3
    chosen = np.zeros_like(eligible)
    for b in range(len(tokens)):
        used = pos[b][w[b] > 0]
        assert len(set(used)) == len(used)  # without replacement
        chosen[b, used] = True
        n = eligible[b].sum()
        assert len(used) == (max(1, round(0.15 * n)) if n else 0)
        np.testing.assert_array_equal(ids[b][w[b] > 0], tokens[b, used])
    assert not (chosen & ~eligible).any()  # never PAD, CLS or UNK
    np.testing.assert_array_equal(corrupted[~chosen], tokens[~chosen])  # only targets change
    assert abs(chosen.sum() / eligible.sum() - 0.15) < 0.01

    shown, original = corrupted[chosen], tokens[chosen]
    as_unk = shown == 1
    kept = shown == original
    random = ~as_unk & ~kept
    n = len(shown)
    assert abs(as_unk.mean() - 0.8) < 0.015, as_unk.mean()
    # A random replacement equals the original 1 time in 47: "kept" holds about 0.1 + 0.1/47.
    assert abs(kept.mean() - (0.1 + 0.1 / (V - 3))) < 0.012, kept.mean()
    assert abs(random.mean() - 0.1 * (1 - 1 / (V - 3))) < 0.012, random.mean()
    assert ((shown[random] >= 3) & (shown[random] < V)).all()
    assert n > 10_000


def test_positions_are_uniform_over_the_eligible_ones():
    tokens = jnp.full((4000, 10), 7).at[:, 0].set(2)  # CLS and 9 real tokens: 1 target each
    _, t = masked_lm.corrupt(jax.random.PRNGKey(3), tokens, vocab_size=V, rate=0.15)
    first = np.asarray(t["positions"])[:, 0]
    counts = np.bincount(first, minlength=10)
    assert counts[0] == 0
    assert np.all(np.abs(counts[1:] / 4000 - 1 / 9) < 0.02), counts


def test_masks_depend_on_the_key_only():
    tokens = _rows(jax.random.PRNGKey(4), batch=8)
    a = masked_lm.corrupt(jax.random.PRNGKey(5), tokens, vocab_size=V)
    b = masked_lm.corrupt(jax.random.PRNGKey(5), tokens, vocab_size=V)
    c = masked_lm.corrupt(jax.random.PRNGKey(6), tokens, vocab_size=V)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a[0], c[0])


def test_an_all_pad_row_has_no_targets_and_is_unchanged():
    tokens = jnp.zeros((2, 8), jnp.int32).at[1, :3].set(jnp.array([2, 5, 6]))
    corrupted, t = masked_lm.corrupt(jax.random.PRNGKey(0), tokens, vocab_size=V)
    assert float(t["weight"][0].sum()) == 0
    assert float(t["weight"][1].sum()) == 1
    np.testing.assert_array_equal(corrupted[0], tokens[0])


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_rate_outside_its_range_is_refused(rate):
    with pytest.raises(ValueError, match="rate"):
        masked_lm.corrupt(
            jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32), vocab_size=V, rate=rate
        )


def test_head_and_loss_against_numpy():
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(7), 4)
    d = 8
    head = masked_lm.init_head(k1, d, V)
    head["bias"] = jax.random.normal(k4, (V,))
    table = jax.random.normal(k2, (V, d))
    h = jax.random.normal(k3, (2, 5, d))
    positions = jnp.array([[4, 0], [2, 2]])
    targets = {
        "positions": positions,
        "ids": jnp.array([[3, 9], [11, 0]]),
        "weight": jnp.array([[1.0, 1.0], [1.0, 0.0]]),
    }
    logits = masked_lm.head_logits(head, table, h, positions)
    loss, sums = masked_lm.loss(logits, targets)

    hn, tab, hd = (
        np.asarray(h, np.float64),
        np.asarray(table, np.float64),
        jax.tree.map(np.asarray, head),
    )
    want = np.zeros((2, 2, V))
    for b in range(2):
        for m in range(2):
            x = hn[b, positions[b, m]] @ hd["transform"]["w"] + hd["transform"]["b"]
            x = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))  # tanh GELU
            x = (x - x.mean()) / np.sqrt(x.var() + 1e-6) * hd["ln"]["scale"] + hd["ln"]["bias"]
            want[b, m] = x @ tab.T / np.sqrt(d) + hd["bias"]
    # The head's sums: its transform over d, LayerNorm's mean and variance, the table's dot.
    assert_close32(logits, want, 5 * d)
    logp = want - np.log(np.exp(want).sum(-1, keepdims=True))
    nll = [-logp[0, 0, 3], -logp[0, 1, 9], -logp[1, 0, 11]]
    assert float(loss) == pytest.approx(
        np.mean(nll), abs=tol32(5 * d + 2 * V, max(1, np.mean(nll)))
    )
    assert float(sums["count"]) == 3
    correct = [want[0, 0].argmax() == 3, want[0, 1].argmax() == 9, want[1, 0].argmax() == 11]
    assert float(sums["correct"]) == sum(correct)


def test_predicted_keeps_targets_among_the_most_frequent_ids():
    tokens = _rows(jax.random.PRNGKey(11), batch=1024)
    k = 20
    corrupted, t = masked_lm.corrupt(
        jax.random.PRNGKey(12), tokens, vocab_size=V, rate=0.15, predicted=k
    )
    tokens, corrupted = np.asarray(tokens), np.asarray(corrupted)
    pos, ids, w = (np.asarray(t[key]) for key in ("positions", "ids", "weight"))
    used = w > 0
    assert ((ids[used] >= 3) & (ids[used] < k)).all()
    eligible = (tokens >= 3) & (tokens < k)
    for b in range(len(tokens)):
        n = eligible[b].sum()
        assert used[b].sum() == (max(1, round(0.15 * n)) if n else 0)
    rare = tokens >= k
    chosen = np.zeros_like(rare)
    np.put_along_axis(chosen, pos, used, axis=1)
    np.testing.assert_array_equal(corrupted[rare & ~chosen], tokens[rare & ~chosen])
    # The head scores the first k rows of the table, with the first k entries of its bias.
    head = masked_lm.init_head(jax.random.PRNGKey(13), 8, V)
    head["bias"] = jnp.arange(V, dtype=jnp.float32)
    table = jax.random.normal(jax.random.PRNGKey(14), (V, 8))
    h = jax.random.normal(jax.random.PRNGKey(15), (2, 5, 8))
    p = jnp.array([[0, 1], [2, 3]])
    full = masked_lm.head_logits(head, table, h, p)
    part = masked_lm.head_logits(head, table[:k], h, p)
    assert part.shape == (2, 2, k)
    assert_close32(part, full[..., :k], 5 * 8)
    with pytest.raises(ValueError, match="predicted"):
        masked_lm.corrupt(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32), vocab_size=V,
                          predicted=V + 1)  # fmt: skip
