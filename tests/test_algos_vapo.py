"""Tests for ppo.algos.vapo (VAPO: decoupled and length-adaptive GAE, value pretraining,
positive-example LM loss), each against a hand computation, plus loop-versus-vectorised,
masked-garbage and no-mutation checks."""
import numpy as np
import paddle
import pytest

from ppo.algos import (
    ADV_ESTIMATORS,
    get_adv_estimator,
    in_value_pretraining,
    length_adaptive_lambda,
    positive_example_nll,
    vapo_advantages_and_returns,
    value_pretraining_targets,
)
from tests.test_algos_advantage import gae_loop, random_masks


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def test_length_adaptive_lambda_hand_values():
    """alpha 0.05: 1 - 1/(0.05 * l): l=100 -> 1 - 1/5 = 0.8; l=200 -> 1 - 1/10 = 0.9; l=20 -> 1 - 1 = 0;
    l=10 -> 1 - 2 = -1, clipped to 0; l=0 counts as 1 -> 1 - 20, clipped to 0."""
    lam = length_adaptive_lambda(paddle.to_tensor([100, 200, 20, 10, 0]), alpha=0.05)
    np.testing.assert_allclose(lam.numpy(), [0.8, 0.9, 0.0, 0.0, 0.0], atol=1e-7)
    assert lam.dtype == paddle.float32
    with pytest.raises(ValueError, match="alpha must be positive"):
        length_adaptive_lambda(paddle.to_tensor([5]), alpha=0.0)


def hand_case():
    """Row 0: 4 tokens, V = [0.5, 1, 0.5, 1], r = [0, 0, 0, 1]; alpha 0.5 -> lambda = 1 - 1/(0.5*4) = 0.5.
    gamma 1: deltas t3 = 1 - 1 = 0, t2 = 1 - 0.5 = 0.5, t1 = 0.5 - 1 = -0.5, t0 = 1 - 0.5 = 0.5;
    A3 = 0, A2 = 0.5, A1 = -0.5 + 0.5*0.5 = -0.25, A0 = 0.5 + 0.5*(-0.25) = 0.375.
    Row 1: 2 tokens (then 2 pads), V = [2, 1], r = [0, 1]; lambda = 1 - 1/(0.5*2) = 0 -> A = delta:
    t1 = 1 - 1 = 0, t0 = 1 - 2 = -1.
    Critic lambda 1: returns = reward-to-go = [1, 1, 1, 1] and [1, 1]."""
    values = t([[0.5, 1.0, 0.5, 1.0], [2.0, 1.0, 9.0, 9.0]])
    rewards = t([[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 7.0, 7.0]])
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0]])
    return values, rewards, mask


def test_vapo_advantages_and_returns_hand_computed():
    values, rewards, mask = hand_case()
    adv, ret = vapo_advantages_and_returns(values, rewards, mask, gamma=1.0, alpha=0.5, critic_lambda=1.0)
    np.testing.assert_allclose(adv.numpy(), [[0.375, -0.25, 0.5, 0.0], [-1.0, 0.0, 0.0, 0.0]], atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), [[1, 1, 1, 1], [1, 1, 0, 0]], atol=1e-12)


def test_decoupled_critic_lambda_changes_only_the_returns():
    """critic lambda 0.5 on row 0: returns = GAE(0.5) + V = [0.375+0.5, -0.25+1, 0.5+0.5, 0+1]; the
    actor's advantages (lambda from the length) do not move."""
    values, rewards, mask = hand_case()
    adv, ret = vapo_advantages_and_returns(values, rewards, mask, gamma=1.0, alpha=0.5, critic_lambda=0.5)
    np.testing.assert_allclose(ret.numpy()[0], [0.875, 0.75, 1.0, 1.0], atol=1e-12)
    adv1, _ = vapo_advantages_and_returns(values, rewards, mask, gamma=1.0, alpha=0.5, critic_lambda=1.0)
    np.testing.assert_allclose(adv.numpy(), adv1.numpy(), atol=0)


@pytest.mark.parametrize("holes", [False, True])
def test_vapo_loop_versus_vectorised(holes):
    """Each row against a plain-python GAE with that row's lambda 1 - 1/(alpha * its token count)."""
    rng = np.random.default_rng(3)
    B, T, gamma, alpha = 7, 9, 0.95, 0.3
    values, rewards = rng.normal(size=(B, T)), rng.normal(size=(B, T))
    mask = random_masks(rng, B, T, holes=holes)
    adv, ret = vapo_advantages_and_returns(t(values), t(rewards), t(mask), gamma=gamma, alpha=alpha, critic_lambda=0.9)
    for b in range(B):
        lam = min(max(1 - 1 / (alpha * max(mask[b].sum(), 1)), 0.0), 1.0)
        want_adv, _ = gae_loop(values[b:b + 1], rewards[b:b + 1], mask[b:b + 1], gamma, lam)
        _, want_ret = gae_loop(values[b:b + 1], rewards[b:b + 1], mask[b:b + 1], gamma, 0.9)
        np.testing.assert_allclose(adv.numpy()[b], want_adv[0], atol=1e-10)
        np.testing.assert_allclose(ret.numpy()[b], want_ret[0], atol=1e-10)


def test_vapo_ignores_garbage_and_does_not_mutate():
    values, rewards, mask = hand_case()
    before = [x.numpy().copy() for x in (values, rewards, mask)]
    adv, ret = vapo_advantages_and_returns(values, rewards, mask, alpha=0.5)
    garbage_v, garbage_r = values.numpy().copy(), rewards.numpy().copy()
    garbage_v[1, 2:], garbage_r[1, 2:] = np.nan, 1e30
    adv2, ret2 = vapo_advantages_and_returns(t(garbage_v), t(garbage_r), mask, alpha=0.5)
    np.testing.assert_array_equal(adv.numpy(), adv2.numpy())
    np.testing.assert_array_equal(ret.numpy(), ret2.numpy())
    for x, b in zip((values, rewards, mask), before):
        np.testing.assert_array_equal(x.numpy(), b)


def test_vapo_registry_entry():
    """A critic estimator with the paper's settings; called through the registry as the trainer calls it."""
    entry = get_adv_estimator("vapo")
    assert entry is ADV_ESTIMATORS["vapo"] and entry.needs_critic and not entry.per_group
    assert entry.settings == {"vapo_alpha": 0.05, "critic_gae_lambda": 1.0}
    values, rewards, mask = hand_case()
    adv, ret = entry(rewards, mask, values=values, gamma=1.0, vapo_alpha=0.5)
    np.testing.assert_allclose(adv.numpy()[0], [0.375, -0.25, 0.5, 0.0], atol=1e-12)
    with pytest.raises(ValueError, match="needs critic values"):
        entry(rewards, mask)

    class Args:
        vapo_alpha, critic_gae_lambda = 0.5, 0.5

    assert entry.settings_from(Args) == {"vapo_alpha": 0.5, "critic_gae_lambda": 0.5}


def test_value_pretraining_targets_hand_computed():
    """r = [0, 0.5, 1], gamma 0.9: G2 = 1, G1 = 0.5 + 0.9 = 1.4, G0 = 0.9 * 1.4 = 1.26; a pad after them is 0."""
    g = value_pretraining_targets(t([[0.0, 0.5, 1.0, 5.0]]), t([[1, 1, 1, 0]]), gamma=0.9)
    np.testing.assert_allclose(g.numpy(), [[1.26, 1.4, 1.0, 0.0]], atol=1e-12)
    values, rewards, mask = hand_case()  # the critic_lambda = 1 returns of VAPO, computed without values
    _, ret = vapo_advantages_and_returns(values, rewards, mask, gamma=0.9, alpha=0.5, critic_lambda=1.0)
    np.testing.assert_allclose(value_pretraining_targets(rewards, mask, gamma=0.9).numpy(), ret.numpy(), atol=1e-12)


def test_in_value_pretraining():
    assert [in_value_pretraining(s, 3) for s in range(5)] == [True, True, True, False, False]
    assert not in_value_pretraining(0, 0)


def test_positive_example_nll_hand_computed():
    """logp = [[-1, -2, pad], [-3, -4, -5]]; positive row 0 only: -(-1 - 2) / 2 = 1.5; both rows:
    (1 + 2 + 3 + 4 + 5) / 5 = 3; none: 0. The pad holds NaN and changes nothing."""
    logp = t([[-1.0, -2.0, np.nan], [-3.0, -4.0, -5.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    assert float(positive_example_nll(logp, mask, paddle.to_tensor([True, False]))) == pytest.approx(1.5)
    assert float(positive_example_nll(logp, mask, paddle.to_tensor([1, 1]))) == pytest.approx(3.0)
    assert float(positive_example_nll(logp, mask, paddle.to_tensor([0, 0]))) == 0.0


def test_positive_example_nll_gradient_reaches_only_positive_tokens():
    logp = paddle.to_tensor(np.array([[-1.0, -2.0], [-3.0, -4.0]], dtype="float32"), stop_gradient=False)
    positive_example_nll(logp, t([[1, 1], [1, 1]], "float32"), paddle.to_tensor([False, True])).backward()
    np.testing.assert_allclose(logp.grad.numpy(), [[0, 0], [-0.5, -0.5]])
