"""Tests for ppo.algos.advantage (GAE, GRPO / Dr.GRPO, RLOO, REINFORCE++)."""
import numpy as np
import paddle
import pytest

from ppo.algos import (
    ADV_ESTIMATORS,
    broadcast_sequence_advantages,
    gae_advantages_and_returns,
    get_adv_estimator,
    group_zero_std_fraction,
    grpo_advantages,
    reinforce_pp_advantages_and_returns,
    rloo_advantages,
)


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def random_masks(rng, B, T, holes=False):
    """Masks with a random left offset (prompt) and right padding; optional holes."""
    mask = np.zeros((B, T))
    for b in range(B):
        start = rng.integers(0, T)
        end = rng.integers(start, T + 1)
        mask[b, start:end] = 1
        if holes and end - start > 2:
            mask[b, rng.integers(start + 1, end - 1)] = 0
    mask[0, :] = 0  # always one empty row
    mask[-1, :] = 1  # and one full row
    return mask


def gae_loop(values, rewards, mask, gamma, lam):
    """Plain python GAE over the masked tokens of each row (masked tokens compressed)."""
    adv = np.zeros_like(values)
    for b in range(values.shape[0]):
        idx = np.nonzero(mask[b])[0]
        last, next_v = 0.0, 0.0
        for i in idx[::-1]:
            delta = rewards[b, i] + gamma * next_v - values[b, i]
            last = delta + gamma * lam * last
            adv[b, i] = last
            next_v = values[b, i]
    return adv, np.where(mask == 1, adv + values, 0.0)


def test_gae_hand_computed():
    """values [1, 2, 3], rewards [0, 0, 1], gamma 0.9, lambda 0.8 (gamma * lambda = 0.72):

    t=2: delta = 1 + 0 - 3 = -2, A2 = -2
    t=1: delta = 0 + 0.9*3 - 2 = 0.7, A1 = 0.7 + 0.72*(-2) = -0.74
    t=0: delta = 0 + 0.9*2 - 1 = 0.8, A0 = 0.8 + 0.72*(-0.74) = 0.2672
    returns = A + V = [1.2672, 1.26, 1.0].
    Row 2 holds the same response after a 1-token left prompt and before 1 pad token.
    """
    values = t([[1.0, 2.0, 3.0, 0.0, 0.0], [7.0, 1.0, 2.0, 3.0, 9.0]])
    rewards = t([[0.0, 0.0, 1.0, 0.0, 0.0], [5.0, 0.0, 0.0, 1.0, 4.0]])
    mask = t([[1, 1, 1, 0, 0], [0, 1, 1, 1, 0]])
    adv, ret = gae_advantages_and_returns(values, rewards, mask, gamma=0.9, gae_lambda=0.8)
    np.testing.assert_allclose(adv.numpy(), [[0.2672, -0.74, -2.0, 0, 0], [0, 0.2672, -0.74, -2.0, 0]], atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), [[1.2672, 1.26, 1.0, 0, 0], [0, 1.2672, 1.26, 1.0, 0]], atol=1e-12)


@pytest.mark.parametrize("holes", [False, True])
def test_gae_loop_vs_vectorised(holes):
    """Random values/rewards/masks (left offsets, right padding, empty and full rows)."""
    rng = np.random.default_rng(0)
    B, T = 6, 9
    values, rewards = rng.normal(size=(B, T)), rng.normal(size=(B, T))
    mask = random_masks(rng, B, T, holes)
    for gamma, lam in [(1.0, 0.95), (0.9, 0.5), (0.99, 1.0)]:
        adv, ret = gae_advantages_and_returns(t(values), t(rewards), t(mask), gamma=gamma, gae_lambda=lam)
        ref_adv, ref_ret = gae_loop(values, rewards, mask, gamma, lam)
        np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-10, atol=1e-12)


def test_gae_garbage_invariance_and_no_mutation():
    rng = np.random.default_rng(1)
    B, T = 5, 8
    values, rewards = rng.normal(size=(B, T)), rng.normal(size=(B, T))
    mask = random_masks(rng, B, T)
    gv = np.where(mask == 1, values, rng.uniform(-1e6, 1e6, size=(B, T)))
    gr = np.where(mask == 1, rewards, rng.uniform(-1e6, 1e6, size=(B, T)))
    v_t, r_t, m_t = t(gv), t(gr), t(mask)
    adv_g, ret_g = gae_advantages_and_returns(v_t, r_t, m_t)
    adv, ret = gae_advantages_and_returns(t(values), t(rewards), t(mask))
    np.testing.assert_array_equal(adv_g.numpy(), adv.numpy())
    np.testing.assert_array_equal(ret_g.numpy(), ret.numpy())
    np.testing.assert_array_equal(v_t.numpy(), gv)
    np.testing.assert_array_equal(r_t.numpy(), gr)
    np.testing.assert_array_equal(m_t.numpy(), mask)


def test_gae_outputs_carry_no_gradient():
    v = t([[1.0, 2.0]])
    v.stop_gradient = False
    adv, ret = gae_advantages_and_returns(v, t([[0.0, 1.0]]), t([[1, 1]]))
    assert adv.stop_gradient and ret.stop_gradient


def test_grpo_hand_computed():
    """Groups of 3: [1, 2, 3] has mean 2, unbiased std 1 -> [-1, 0, 1] / (1 + eps);
    [0, 0, 0] has std 0 -> [0, 0, 0]. Dr.GRPO (no std): [-1, 0, 1] and [0, 0, 0]."""
    s = t([1.0, 2.0, 3.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(grpo_advantages(s, 3).numpy(), np.array([-1, 0, 1, 0, 0, 0]) / (1 + 1e-6))
    np.testing.assert_allclose(grpo_advantages(s, 3, scale_by_std=False).numpy(), [-1, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(group_zero_std_fraction(s, 3).numpy(), 0.5)


def test_grpo_and_rloo_loop_vs_vectorised():
    """Versus a per-group python loop on random scores, several group sizes."""
    rng = np.random.default_rng(2)
    for n in (2, 4, 5):
        s = rng.normal(size=3 * n)
        grpo, drgrpo, rloo = np.zeros_like(s), np.zeros_like(s), np.zeros_like(s)
        for g in range(3):
            grp = s[g * n:(g + 1) * n]
            for i in range(n):
                grpo[g * n + i] = (grp[i] - grp.mean()) / (grp.std(ddof=1) + 1e-6)
                drgrpo[g * n + i] = grp[i] - grp.mean()
                rloo[g * n + i] = grp[i] - (grp.sum() - grp[i]) / (n - 1)
        np.testing.assert_allclose(grpo_advantages(t(s), n).numpy(), grpo, rtol=1e-10)
        np.testing.assert_allclose(grpo_advantages(t(s), n, scale_by_std=False).numpy(), drgrpo, rtol=1e-10)
        np.testing.assert_allclose(rloo_advantages(t(s), n).numpy(), rloo, rtol=1e-10, atol=1e-12)


def test_grpo_group_size_one_and_errors():
    """group_size 1: mean 0, std 1 (verl) -> A = s / (1 + eps)."""
    s = t([2.0, -1.0])
    np.testing.assert_allclose(grpo_advantages(s, 1).numpy(), np.array([2.0, -1.0]) / (1 + 1e-6))
    with pytest.raises(ValueError):
        grpo_advantages(t([1.0, 2.0, 3.0]), 2)
    with pytest.raises(ValueError):
        rloo_advantages(s, 1)


def test_rloo_hand_computed():
    """[1, 2, 3]: baselines (2+3)/2 = 2.5, (1+3)/2 = 2, (1+2)/2 = 1.5 -> [-1.5, 0, 1.5]."""
    np.testing.assert_allclose(rloo_advantages(t([1.0, 2.0, 3.0]), 3).numpy(), [-1.5, 0.0, 1.5])


def test_group_estimators_do_not_mutate():
    s = t([1.0, 5.0, 2.0, 2.0])
    grpo_advantages(s, 2)
    rloo_advantages(s, 2)
    np.testing.assert_array_equal(s.numpy(), [1.0, 5.0, 2.0, 2.0])


def test_reinforce_pp_hand_computed():
    """rewards [0, 0, 1] at columns 1..3 (column 0 prompt, column 4 pad), gamma 0.5:

    G3 = 1, G2 = 0 + 0.5*1 = 0.5, G1 = 0.25 -> returns [0, 0.25, 0.5, 1, 0].
    Whitening over the 3 tokens: mean 7/12, unbiased var = 0.1458333 (= 7/48).
    """
    rewards = t([[3.0, 0.0, 0.0, 1.0, 8.0]])
    mask = t([[0, 1, 1, 1, 0]])
    adv, ret = reinforce_pp_advantages_and_returns(rewards, mask, gamma=0.5)
    np.testing.assert_allclose(ret.numpy(), [[0, 0.25, 0.5, 1.0, 0]], atol=1e-12)
    g = np.array([0.25, 0.5, 1.0])
    assert np.isclose(g.var(ddof=1), 7 / 48)
    expected = (g - 7 / 12) / np.sqrt(7 / 48 + 1e-8)
    np.testing.assert_allclose(adv.numpy(), [[0, *expected, 0]], atol=1e-12)


def test_reinforce_pp_loop_vs_vectorised_and_garbage():
    rng = np.random.default_rng(3)
    B, T = 5, 7
    rewards = rng.normal(size=(B, T))
    mask = random_masks(rng, B, T, holes=True)
    gamma = 0.9
    ret = np.zeros((B, T))
    for b in range(B):
        run = 0.0
        for i in np.nonzero(mask[b])[0][::-1]:
            run = rewards[b, i] + gamma * run
            ret[b, i] = run
    sel = ret[mask == 1]
    adv = np.where(mask == 1, (ret - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8), 0.0)
    a, r = reinforce_pp_advantages_and_returns(t(rewards), t(mask), gamma=gamma)
    np.testing.assert_allclose(r.numpy(), ret, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.numpy(), adv, rtol=1e-9, atol=1e-12)
    garbage = np.where(mask == 1, rewards, 1e6)
    a_g, r_g = reinforce_pp_advantages_and_returns(t(garbage), t(mask), gamma=gamma)
    np.testing.assert_array_equal(a_g.numpy(), a.numpy())
    np.testing.assert_array_equal(r_g.numpy(), r.numpy())


def test_broadcast_sequence_advantages():
    """adv [2, -1] onto masks [[0,1,1],[1,0,0]] -> [[0,2,2],[-1,0,0]]."""
    out = broadcast_sequence_advantages(t([2.0, -1.0]), t([[0, 1, 1], [1, 0, 0]]))
    np.testing.assert_array_equal(out.numpy(), [[0, 2, 2], [-1, 0, 0]])


def test_registry():
    assert set(ADV_ESTIMATORS) == {"gae", "vapo", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "pass_at_k"}
    assert [n for n, e in ADV_ESTIMATORS.items() if e.needs_critic] == ["gae", "vapo"]
    assert [n for n, e in ADV_ESTIMATORS.items() if e.whitens] == ["gae", "vapo"]
    assert {n for n, e in ADV_ESTIMATORS.items() if e.per_group} == {"grpo", "rloo", "reinforce_pp_baseline", "pass_at_k"}
    assert get_adv_estimator("grpo").name == "grpo"
    with pytest.raises(ValueError) as e:
        get_adv_estimator("ppo")
    for name in ADV_ESTIMATORS:
        assert name in str(e.value)
