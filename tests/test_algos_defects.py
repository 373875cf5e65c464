"""Regression tests for three defects found by comparing ppo.algos with verl / TRL / OpenRLHF.

Each test failed before its fix (value clip-fraction over-reporting, non-zero GRPO/RLOO
advantages for equal-score groups in float32, NaN in ORPO's log(1 - p))."""
import numpy as np
import paddle

from ppo.algos import group_zero_std_fraction, grpo_advantages, rloo_advantages, value_loss
from tests.preference_shims import dpo_loss


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def test_value_clipfrac_counts_only_clipped_tokens_float64():
    """v=0.29, old=-0.27, c=5: |v - old| = 0.56 < 5, so nothing is clipped. The old form
    ``old + clip(v - old)`` = -0.27 + 0.56 rounds to 0.29000000000000004 != v, and its
    squared error to R = 0 exceeded (v - R)^2, so the token counted as clipped (clipfrac 1.0)."""
    v, old, ret = t([[0.29]]), t([[-0.27]]), t([[0.0]])
    loss, stats = value_loss(v, old, ret, t([[1.0]]), clip_range_value=5.0)
    assert float(stats["val/clipfrac_avg"]) == 0.0
    np.testing.assert_allclose(float(loss), 0.5 * 0.29**2, rtol=1e-12)


def test_value_clipfrac_float32_near_zero():
    """Random float32 values near 0, all well inside the clip band: clipfrac must be 0
    (the old form reported 4-7 %), and the loss equals the unclipped loss exactly."""
    rng = np.random.default_rng(0)
    v = rng.normal(0, 0.05, (64, 32)).astype("float32")
    old = (v + rng.normal(0, 0.05, v.shape)).astype("float32")
    ret = rng.normal(0, 0.05, v.shape).astype("float32")
    mask = np.ones_like(v)
    loss, stats = value_loss(t(v, "float32"), t(old, "float32"), t(ret, "float32"), t(mask, "float32"), clip_range_value=5.0)
    assert float(stats["val/clipfrac_avg"]) == 0.0
    unclipped, _ = value_loss(t(v, "float32"), t(old, "float32"), t(ret, "float32"), t(mask, "float32"), clip_range_value=None)
    assert float(loss) == float(unclipped)


def test_value_clip_gradient_unchanged_when_clipped():
    """v=3, old=0, c=1, R=-2: v_clip = 1, (1+2)^2 = 9 < (3+2)^2 = 25, so the unclipped
    term wins and dL/dv = v - R = 5; with R=10: v_clip term (1-10)^2 = 81 > 49 wins and
    the gradient through the clipped value is 0."""
    for ret, grad, frac in ((-2.0, 5.0, 0.0), (10.0, 0.0, 1.0)):
        v = t([[3.0]])
        v.stop_gradient = False
        loss, stats = value_loss(v, t([[0.0]]), t([[ret]]), t([[1.0]]), clip_range_value=1.0)
        loss.backward()
        np.testing.assert_allclose(v.grad.numpy(), [[grad]])
        assert float(stats["val/clipfrac_avg"]) == frac


def test_grpo_equal_scores_float32_give_zero():
    """Six copies of -1.3 and sixteen copies of 16.891075 in float32 used to give +0.105
    and -0.772: the float32 mean is 1 ulp off, divided by std + eps ~ 1e-6."""
    for value, n in ((-1.3, 6), (16.891075, 16)):
        s = t([value] * n + list(np.linspace(-1, 1, n)), "float32")
        adv = grpo_advantages(s, n).numpy()
        assert np.all(adv[:n] == 0.0), adv[:n]
        assert np.abs(adv[n:]).max() > 0.5
        assert float(group_zero_std_fraction(s, n)) == 0.5
        assert np.all(grpo_advantages(s, n, scale_by_std=False).numpy()[:n] == 0.0)
        assert np.all(rloo_advantages(s, n).numpy()[:n] == 0.0)


def test_orpo_finite_loss_and_gradient_near_zero_logp_float32():
    """Mean log-probs -1e-8 (rejected) and -1e-9 (chosen): log1p(-exp(a)) = log1p(-1) = -inf
    in float32, so the old loss was NaN (and the chosen side's gradient NaN)."""
    for chosen, rejected in ((-0.5, -1e-8), (-1e-9, -0.5), (0.0, 0.0), (-1e-9, -1e-8)):
        pc = t([chosen], "float32")
        pr = t([rejected], "float32")
        pc.stop_gradient = False
        pr.stop_gradient = False
        loss, stats = dpo_loss(pc, pr, loss_type="orpo", beta=0.1, chosen_lengths=t([1.0], "float32"),
                               rejected_lengths=t([1.0], "float32"))
        loss.backward()
        assert np.isfinite(float(loss)), (chosen, rejected)
        assert np.isfinite(pc.grad.numpy()).all() and np.isfinite(pr.grad.numpy()).all(), (chosen, rejected)
        assert np.isfinite(float(stats["orpo/log_odds_ratio"]))
