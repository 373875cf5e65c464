"""Tests for ppo.algos.lagrangian (PPO-Lagrangian, Safe RLHF): the multiplier step, its delay,
window and clamp, the combined advantage, the KL shaping (the full penalty on rewards and costs) and cost advantages
through the existing GAE.

Checked line by line against safe-rlhf's `safe_rlhf/algorithms/ppo_lag/trainer.py`
(`PPOLagTrainer`, the main branch; align-anything's `ppo_lag` trainer has the same shaping):
- `__init__`: `log_lambda = Parameter(log(lambda_init))`, `log_lambda_optimizer = SGD([log_lambda],
  lr=lambda_lr)`, `log_lambda_max = log(lambda_max) if lambda_max else None`,
  `episode_costs = deque(maxlen=episode_cost_window_size)` -> `LagrangeMultiplier.__init__`;
- `post_rollout`: `episode_costs.extend(cost.tolist())` -> `LagrangeMultiplier.record`;
- `rl_step`: `episode_cost = tensor(episode_costs).mean()`; `if global_step >=
  lambda_update_delay_steps: lambda_loss = -(episode_cost - threshold) * log_lambda.exp();
  backward; SGD step; log_lambda.clamp_(max=log_lambda_max)` -> `LagrangeMultiplier.update` /
  `lagrange_multiplier_step` (test_matches_safe_rlhf_autograd_sgd_on_log_lambda runs that
  literal autograd + SGD form and compares the trajectories);
- `actor_loss_fn`: `multiplier = log_lambda.exp().item(); advantages = (reward_advantages -
  multiplier * cost_advantages) / (1.0 + multiplier)` -> `combined_advantages`;
- `add_kl_divergence_regularization`: `kl_penalty_rewards = -kl_coeff * (log_probs -
  ref_log_probs)`, rewards get `kl_penalty_rewards` plus the reward at the end index,
  costs get `-kl_penalty_rewards` plus the cost -> `kl_shaped_rewards` once per objective, the
  cost's with kl_weight -1 (`ppo/trainer/advantages.py`; safe-rlhf then clamps the token rewards
  and costs to +-clip_range_score; here the score and cost are clipped before they are added);
- cost advantages and returns: the same `get_advantages_and_returns` (GAE) as the reward's
  -> `gae_advantages_and_returns` on the token costs and the cost critic's values.
"""
import math

import numpy as np
import paddle
import pytest

from ppo.algos import (
    LagrangeMultiplier,
    combined_advantages,
    gae_advantages_and_returns,
    kl_shaped_rewards,
    lagrange_multiplier_step,
)


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


# ---------------------------------------------------------------- the multiplier step
def test_step_above_threshold_raises_lambda():
    """log lambda 0 (lambda 1), J_C 0.5, d 0, lr 0.1: gradient of -(J_C - d) e^x at x = 0 is -0.5,
    SGD: x' = 0 + 0.1 * 0.5 = 0.05, lambda' = e^0.05 = 1.0512711."""
    x = lagrange_multiplier_step(0.0, 0.5, 0.0, 0.1)
    assert x == pytest.approx(0.05, abs=1e-15)
    assert math.exp(x) == pytest.approx(1.0512711, rel=1e-7)


def test_step_below_threshold_lowers_lambda():
    """J_C -0.5 < d 0: x' = 0 + 0.1 * (-0.5) * 1 = -0.05, lambda' = e^-0.05 = 0.9512294 (still > 0)."""
    x = lagrange_multiplier_step(0.0, -0.5, 0.0, 0.1)
    assert x == pytest.approx(-0.05, abs=1e-15)
    assert math.exp(x) == pytest.approx(0.9512294, rel=1e-7)


def test_step_scales_with_lambda_and_uses_the_threshold():
    """lambda 2, J_C 1, d 0.25, lr 0.1: x' = log 2 + 0.1 * 0.75 * 2 = log 2 + 0.15,
    lambda' = 2 e^0.15 = 2.3236685."""
    x = lagrange_multiplier_step(math.log(2.0), 1.0, 0.25, 0.1)
    assert x == pytest.approx(math.log(2.0) + 0.15, abs=1e-12)
    assert math.exp(x) == pytest.approx(2.3236685, rel=1e-7)


def test_step_clamps_at_lambda_max_and_none_or_zero_means_no_cap():
    """The same step as above with lambda_max 2.2 stops at log 2.2; None or 0 leave 2.3236685
    (safe-rlhf: `log(lambda_max) if lambda_max else None`); a cap never raises lambda."""
    assert math.exp(lagrange_multiplier_step(math.log(2.0), 1.0, 0.25, 0.1, lambda_max=2.2)) == pytest.approx(2.2, rel=1e-12)
    for no_cap in (None, 0, 0.0):
        assert math.exp(lagrange_multiplier_step(math.log(2.0), 1.0, 0.25, 0.1, no_cap)) == pytest.approx(2.3236685, rel=1e-7)
    assert math.exp(lagrange_multiplier_step(0.0, -1.0, 0.0, 0.1, lambda_max=5.0)) == pytest.approx(math.exp(-0.1), rel=1e-12)


def test_matches_safe_rlhf_autograd_sgd_on_log_lambda():
    """safe-rlhf's literal form: a parameter log_lambda, lambda_loss = -(J_C - d) * exp(log_lambda),
    backward, SGD(lr).step(), clamp to log(lambda_max). Ten steps with alternating costs give the
    same trajectory as the closed-form step."""
    costs = [0.8, 0.6, -0.2, 1.5, 0.0, -1.0, 2.0, 2.0, 2.0, -0.3]
    d, lr, lam_max = 0.1, 0.2, 3.0
    param = paddle.create_parameter([1], "float64", default_initializer=paddle.nn.initializer.Constant(math.log(0.5)))
    sgd = paddle.optimizer.SGD(learning_rate=lr, parameters=[param])
    x = math.log(0.5)
    for c in costs:
        loss = -(c - d) * paddle.exp(param)
        sgd.clear_grad()
        loss.backward()
        sgd.step()
        with paddle.no_grad():
            param.set_value(paddle.clip(param, max=math.log(lam_max)))
        x = lagrange_multiplier_step(x, c, d, lr, lam_max)
        assert x == pytest.approx(float(param.numpy()[0]), abs=1e-12)


def test_constant_cost_moves_lambda_monotonically_and_it_stays_positive():
    """A constant J_C above d raises lambda every step (up to lambda_max); below d it falls every
    step and stays positive (log space)."""
    up, down = LagrangeMultiplier(1.0, 0.5, lambda_max=4.0), LagrangeMultiplier(1.0, 0.5)
    ups, downs = [], []
    for step in range(30):
        up.update(step, 1.0)
        down.update(step, -1.0)
        ups.append(up.value)
        downs.append(down.value)
    assert all(b >= a for a, b in zip(ups, ups[1:])) and ups[-1] == pytest.approx(4.0)
    assert all(b < a for a, b in zip(downs, downs[1:])) and 0 < downs[-1] < 0.1


# ---------------------------------------------------------------- delay, window, state
def test_no_update_before_the_delay_steps():
    """delay 2: steps 0 and 1 keep lambda at lambda_init; step 2 takes the first step
    (J_C 1, d 0, lr 0.1: log lambda 0.1, lambda 1.1051709)."""
    m = LagrangeMultiplier(1.0, 0.1, update_delay_steps=2)
    assert [m.update(s, 1.0) for s in (0, 1)] == [False, False] and m.value == 1.0
    assert m.update(2, 1.0) and m.value == pytest.approx(math.exp(0.1), rel=1e-12)


def test_window_keeps_the_last_episodes():
    """window 3: record [1, 2] then [3, 4] -> window [2, 3, 4], mean 3; an empty window raises."""
    m = LagrangeMultiplier(1.0, 0.1, window_size=3)
    with pytest.raises(ValueError):
        m.episode_cost()
    m.record([1.0, 2.0])
    assert m.episode_cost() == pytest.approx(1.5)
    m.record([3.0, 4.0])
    assert m.window == [2.0, 3.0, 4.0] and m.episode_cost() == pytest.approx(3.0)


def test_state_dict_round_trip_continues_the_same_trajectory():
    a = LagrangeMultiplier(0.7, 0.3, lambda_max=5.0, window_size=4, threshold=0.2)
    b = LagrangeMultiplier(0.7, 0.3, lambda_max=5.0, window_size=4, threshold=0.2)
    for step, costs in enumerate([[1, 0], [0.5, 0.5], [2, 1]]):
        a.record(costs)
        a.update(step, a.episode_cost())
    b.set_state_dict(a.state_dict())
    for step, costs in enumerate([[0, 0], [3, 3]], start=3):
        for m in (a, b):
            m.record(costs)
            m.update(step, m.episode_cost())
    assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_lambda_init_must_be_positive(bad):
    with pytest.raises(ValueError, match="lambda_init must be positive"):
        LagrangeMultiplier(bad, 0.1)


# ---------------------------------------------------------------- combined advantage
def test_combined_advantage_hand_computed():
    """A_R [1, -1, 0], A_C [2, 0, 3]: lambda 1 -> [(1-2)/2, (-1-0)/2, (0-3)/2] = [-0.5, -0.5, -1.5];
    lambda 3 -> [(1-6)/4, -1/4, -9/4] = [-1.25, -0.25, -2.25]; lambda 0 -> A_R."""
    ar, ac = t([[1.0, -1.0, 0.0]]), t([[2.0, 0.0, 3.0]])
    before = (ar.numpy().copy(), ac.numpy().copy())
    np.testing.assert_allclose(combined_advantages(ar, ac, 1.0).numpy(), [[-0.5, -0.5, -1.5]], rtol=1e-15)
    np.testing.assert_allclose(combined_advantages(ar, ac, 3.0).numpy(), [[-1.25, -0.25, -2.25]], rtol=1e-15)
    np.testing.assert_array_equal(combined_advantages(ar, ac, 0.0).numpy(), ar.numpy())
    np.testing.assert_array_equal(ar.numpy(), before[0])
    np.testing.assert_array_equal(ac.numpy(), before[1])


def test_combined_advantage_loop_equals_vectorised():
    rng = np.random.default_rng(1)
    ar, ac = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    lam = 1.7
    loop = [[(ar[i, j] - lam * ac[i, j]) / (1 + lam) for j in range(4)] for i in range(3)]
    np.testing.assert_allclose(combined_advantages(t(ar), t(ac), lam).numpy(), loop, rtol=1e-14)


# ---------------------------------------------------------------- shaping and cost GAE
def lagrangian_shaped_rewards(scores, costs, logprobs, ref_logprobs, mask, kl_coeff, clip_range_score):
    """Safe RLHF's shaping as the trainer runs it (`ppo/trainer/advantages.py`): one
    `kl_shaped_rewards` per objective, the cost's at `-kl_coeff` (its `kl_weight` -1)."""
    rewards, kl = kl_shaped_rewards(scores, logprobs, ref_logprobs, mask, kl_coeff, clip_range_score)
    token_costs, _ = kl_shaped_rewards(costs, logprobs, ref_logprobs, mask, -kl_coeff, clip_range_score)
    return rewards, token_costs, kl


def shaped_example(garbage=0.0):
    """Row 0: logp [-1, -2, pad], ref [-1.5, -1.7, pad] (k1 kl [0.5, -0.3]), score 3, cost -2;
    row 1: one token, logp -1, ref -1 (kl 0), score 20 (clipped to 10), cost 0.5."""
    lp = t([[-1.0, -2.0, garbage], [-1.0, garbage, garbage]])
    ref = t([[-1.5, -1.7, -garbage], [-1.0, 7 * garbage, garbage]])
    mask = t([[1, 1, 0], [1, 0, 0]], "int64")
    return lagrangian_shaped_rewards(t([3.0, 20.0]), t([-2.0, 0.5]), lp, ref, mask, 0.1, 10.0)


def test_full_kl_on_rewards_and_costs_hand_computed():
    """kl_coeff 0.1 on each side: rewards row 0 = [-0.1*0.5, -0.1*(-0.3) + 3] = [-0.05, 3.03];
    costs row 0 = [+0.05, -0.03 - 2] = [0.05, -2.03]; row 1 score clipped 20 -> 10."""
    rewards, costs, kl = shaped_example()
    np.testing.assert_allclose(rewards.numpy(), [[-0.05, 3.03, 0.0], [10.0, 0.0, 0.0]], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(costs.numpy(), [[0.05, -2.03, 0.0], [0.5, 0.0, 0.0]], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(kl.numpy(), [[0.5, -0.3, 0.0], [0.0, 0.0, 0.0]], rtol=1e-12, atol=1e-15)


def test_masked_garbage_changes_nothing():
    for a, b in zip(shaped_example(0.0), shaped_example(1e6)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_cost_gae_hand_computed():
    """Token costs [0.05, -2.03], cost values [0.5, -1.0], gamma 1, lambda 0.95:
    delta_1 = -2.03 + 0 - (-1.0) = -1.03, A_1 = -1.03; delta_0 = 0.05 + (-1.0) - 0.5 = -1.45,
    A_0 = -1.45 + 0.95 * (-1.03) = -2.4285; returns = A + V = [-1.9285, -2.03]."""
    _, costs, _ = shaped_example()
    values = t([[0.5, -1.0, 0.0], [0.0, 0.0, 0.0]])
    adv, ret = gae_advantages_and_returns(values, costs, t([[1, 1, 0], [1, 0, 0]], "int64"), gamma=1.0, gae_lambda=0.95)
    np.testing.assert_allclose(adv.numpy()[0], [-2.4285, -1.03, 0.0], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ret.numpy()[0], [-1.9285, -2.03, 0.0], rtol=1e-12, atol=1e-15)


def test_kl_weight_in_the_combined_advantage_does_not_depend_on_lambda():
    """GAE is linear in the rewards, so with zero values, gamma = gae_lambda = 1 the combined
    advantage is that of the token reward -kl_coeff * kl + (score - lambda cost) / (1 + lambda)
    at the last token, for every lambda (kl_coeff 0.1: the KL weight of plain PPO's reward)."""
    rewards, costs, kl = shaped_example()
    mask = t([[1, 1, 0], [1, 0, 0]], "int64")
    zeros = paddle.zeros_like(rewards)
    ar, _ = gae_advantages_and_returns(zeros, rewards, mask, 1.0, 1.0)
    ac, _ = gae_advantages_and_returns(zeros, costs, mask, 1.0, 1.0)
    last = t([[0, 1, 0], [1, 0, 0]])
    for lam in (0.0, 0.5, 4.0):
        end = (t([3.0, 10.0]) - lam * t([-2.0, 0.5])) / (1 + lam)
        direct = -0.1 * kl + last * end.reshape([-1, 1])
        expect, _ = gae_advantages_and_returns(zeros, direct, mask, 1.0, 1.0)
        np.testing.assert_allclose(combined_advantages(ar, ac, lam).numpy(), expect.numpy(), rtol=1e-12, atol=1e-14)


def test_full_kl_at_half_the_coefficient_is_the_former_half_kl_exactly():
    """The shipped Safe RLHF configs halved kl_coeff when the shaping moved from half the KL on
    each side to the full KL: kl_coeff 0.05 now gives bit for bit the token rewards and costs
    that 0.5 * 0.1 gave (0.5 * 0.1 == 0.05 in binary floating point), e.g. row 0 rewards
    [-0.05 * 0.5, -0.05 * (-0.3) + 3] = [-0.025, 3.015], costs [0.025, -2.015]."""
    lp, ref = t([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]]), t([[-1.5, -1.7, 0.0], [-1.0, 0.0, 0.0]])
    mask = t([[1, 1, 0], [1, 0, 0]], "int64")
    scores, costs = t([3.0, 20.0]), t([-2.0, 0.5])
    rewards, token_costs, _ = lagrangian_shaped_rewards(scores, costs, lp, ref, mask, 0.05, 10.0)
    former_rewards, _ = kl_shaped_rewards(scores, lp, ref, mask, 0.5 * 0.1, 10.0)
    former_costs, _ = kl_shaped_rewards(costs, lp, ref, mask, -0.5 * 0.1, 10.0)
    np.testing.assert_array_equal(rewards.numpy(), former_rewards.numpy())
    np.testing.assert_array_equal(token_costs.numpy(), former_costs.numpy())
    np.testing.assert_allclose(rewards.numpy()[0], [-0.025, 3.015, 0.0], rtol=1e-12)
    np.testing.assert_allclose(token_costs.numpy()[0], [0.025, -2.015, 0.0], rtol=1e-12)


def test_rewards_match_plain_ppo_shaping_at_the_same_coefficient():
    """safe-rlhf's PPO-Lagrangian reward is plain PPO's KL-shaped reward: the same kl_coeff gives
    the same token rewards (a safe-rlhf config ported unchanged gets safe-rlhf's KL)."""
    rewards, _, _ = shaped_example()
    lp, ref = t([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]]), t([[-1.5, -1.7, 0.0], [-1.0, 0.0, 0.0]])
    plain, _ = kl_shaped_rewards(t([3.0, 20.0]), lp, ref, t([[1, 1, 0], [1, 0, 0]], "int64"), 0.1, 10.0)
    np.testing.assert_array_equal(rewards.numpy(), plain.numpy())
