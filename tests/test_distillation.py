"""attn.distillation against a float64 loop over examples and classes written from the papers'
formulas, its gradient against the closed form, and what it must ignore."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn import distillation


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _reference(student, teacher, labels, labelled, *, loss, temperature, weight) -> np.ndarray:
    """Per example, in float64: the hard cross-entropy, the teacher's term and their mix."""
    out = []
    for z_s, z_t, y, has in zip(student, teacher, labels, labelled, strict=True):
        z_s, z_t = z_s.astype(np.float64), z_t.astype(np.float64)
        if loss == "soft":
            p_t, q_s = _softmax(z_t / temperature), _softmax(z_s / temperature)
            taught = temperature**2 * -sum(p * np.log(q) for p, q in zip(p_t, q_s, strict=True))
        else:
            c_s, c_t = z_s - z_s.mean(), z_t - z_t.mean()
            taught = sum((a - b) ** 2 for a, b in zip(c_s, c_t, strict=True)) / len(z_s)
        hard = -np.log(_softmax(z_s)[y])
        out.append((1 - weight) * hard + weight * taught if has else taught)
    return np.array(out)


@pytest.fixture
def batch():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    student_BxC = 3 * jax.random.normal(k1, (6, 3))
    teacher_BxC = 3 * jax.random.normal(k2, (6, 3))
    label_B = jax.random.randint(k3, (6,), 0, 3)
    labelled_B = jnp.array([1, 0, 1, 1, 0, 1], jnp.float32)
    return student_BxC, teacher_BxC, label_B, labelled_B


@pytest.mark.parametrize(
    "loss,temperature,weight", [("soft", 1.0, 0.5), ("soft", 4.0, 1.0), ("mse", 1.0, 0.3)]
)
def test_mixed_is_the_papers_formula_per_example(batch, loss, temperature, weight):
    got = distillation.mixed(*batch, loss=loss, temperature=temperature, weight=weight)
    want = _reference(
        *(np.asarray(x) for x in batch), loss=loss, temperature=temperature, weight=weight
    )
    assert got.shape == (6,)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=2e-6)


def test_neither_loss_sees_a_constant_added_to_a_teachers_row(batch):
    """A served teacher gives log-probabilities: its logits less a per-text constant."""
    student, teacher, _, _ = batch
    shifted = teacher + jnp.array([[5.0], [-3.0], [0.5], [40.0], [-7.0], [1.0]])
    for fn in (
        lambda t: distillation.soft_cross_entropy(student, t, 2.0),
        lambda t: distillation.logit_mse(student, t),
    ):
        np.testing.assert_allclose(fn(shifted), fn(teacher), rtol=1e-5, atol=1e-5)


def test_soft_gradient_is_t_times_the_softmax_difference(batch):
    student, teacher, _, _ = batch
    t = 3.0
    grad = jax.grad(lambda s: distillation.soft_cross_entropy(s, teacher, t).sum())(student)
    want = t * (jax.nn.softmax(student / t) - jax.nn.softmax(teacher / t))
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)


def test_at_a_high_temperature_soft_targets_match_logits_half_the_squared_error(batch):
    """Hinton et al. 2015: as T grows, the T^2-scaled soft loss's gradient tends to that of
    matching centred logits, here (1/C) (c_s - c_t), half of logit_mse's (2/C) (c_s - c_t)."""
    student, teacher, _, _ = batch
    soft = jax.grad(lambda s: distillation.soft_cross_entropy(s, teacher, 1e3).sum())(student)
    mse = jax.grad(lambda s: distillation.logit_mse(s, teacher).sum())(student)
    np.testing.assert_allclose(soft, 0.5 * mse, atol=2e-2)
    assert float(jnp.abs(mse).max()) > 1.0  # a gradient far from zero: the match means something


def test_weight_zero_is_the_hard_cross_entropy_where_labelled(batch):
    student, teacher, label, labelled = batch
    got = distillation.mixed(
        student, teacher, label, labelled, loss="soft", temperature=2.0, weight=0.0
    )
    hard = -jax.nn.log_softmax(student)[jnp.arange(6), label]
    taught = distillation.soft_cross_entropy(student, teacher, 2.0)
    np.testing.assert_allclose(got, jnp.where(labelled > 0, hard, taught), rtol=1e-6, atol=1e-6)


def test_mixed_refuses_an_unknown_loss_or_weight(batch):
    with pytest.raises(ValueError, match="loss must be one of"):
        distillation.mixed(*batch, loss="kl", temperature=1.0, weight=0.5)
    with pytest.raises(ValueError, match="weight must be in"):
        distillation.mixed(*batch, loss="soft", temperature=1.0, weight=1.5)
