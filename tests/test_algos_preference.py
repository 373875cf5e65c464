"""Tests for ppo.algos.preference (reward-model losses, DPO family, KTO)."""
import numpy as np
import paddle
import pytest

from tests.preference_shims import dpo_loss
from ppo.algos import (
    kto_kl_reference_point,
    kto_loss,
    pairwise_reward_loss,
    tokenwise_pairwise_reward_loss,
)


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def nlogsig(x):
    """-log sigmoid(x) in numpy."""
    return np.log1p(np.exp(-np.asarray(x, dtype="float64")))


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


# ---------------------------------------------------------------- reward model

def test_pairwise_reward_loss_hand_computed():
    """better [2, 0], worse [1, 1]: differences [1, -1];
    loss = (-log s(1) - log s(-1)) / 2 = (0.3132617 + 1.3132617) / 2 = 0.8132617;
    accuracy 1/2, margin mean(1, -1) = 0.
    With margin 0.5 and regularization 0.1: differences [0.5, -1.5] and
    + 0.1 * (mean(4, 0) + mean(1, 1)) = 0.3.
    """
    b, w = t([2.0, 0.0]), t([1.0, 1.0])
    loss, stats = pairwise_reward_loss(b, w)
    np.testing.assert_allclose(loss.numpy(), 0.8132617, rtol=1e-6)
    np.testing.assert_allclose(stats["rm/loss"].numpy(), loss.numpy())
    np.testing.assert_allclose(stats["rm/accuracy"].numpy(), 0.5)
    np.testing.assert_allclose(stats["rm/margin"].numpy(), 0.0)
    loss2, _ = pairwise_reward_loss(b, w, margin=0.5, regularization=0.1)
    np.testing.assert_allclose(loss2.numpy(), (nlogsig(0.5) + nlogsig(-1.5)) / 2 + 0.3, rtol=1e-12)
    loss3, _ = pairwise_reward_loss(b, w, margin=t([0.5, 0.0]))
    np.testing.assert_allclose(loss3.numpy(), (nlogsig(0.5) + nlogsig(-1.0)) / 2, rtol=1e-12)


def tokenwise_reference(bs, ws, bids, wids, bm, wm, reg):
    """Python loop following safe-rlhf RewardTrainer.loss (loss_type == 'token-wise')."""
    losses = []
    for i in range(bs.shape[0]):
        end = max(np.nonzero(bm[i])[0][-1], np.nonzero(wm[i])[0][-1])
        div = np.nonzero(bids[i] != wids[i])[0][0]
        h, l = bs[i, div:end + 1], ws[i, div:end + 1]
        li = nlogsig(h - l).mean()
        if reg > 0:
            li += reg * ((l**2).mean() + (h**2).mean())
        losses.append(li)
    return np.mean(losses)


def test_tokenwise_pairwise_reward_loss_hand_computed():
    """Pair 0: better ids [1,2,3,4,0,0] (mask ends at 3), worse [1,2,5,0,0,0] (ends at 2):
    diverge at 2, end = max(3, 2) = 3, span = {2, 3}; score differences there 0 and 1:
    L0 = (log 2 + 0.3132617) / 2 = 0.5032044.
    Pair 1: ids differ from column 1; ends 4 and 5 -> span {1..5}, all differences 2:
    L1 = -log s(2) = 0.1269280. loss = (L0 + L1) / 2 = 0.3150662.
    End scores: pair 0 better s+(3) = 1 vs worse s-(2) = 0.5; pair 1 s+(4) = 2 vs s-(5) = 0.
    accuracy 1, margin ((1 - 0.5) + (2 - 0)) / 2 = 1.25.
    Scores outside the spans are garbage (1e6) and must not matter.
    """
    G = 1e6
    b_ids = np.array([[1, 2, 3, 4, 0, 0], [7, 8, 9, 9, 9, 0]])
    w_ids = np.array([[1, 2, 5, 0, 0, 0], [7, 1, 1, 1, 1, 1]])
    b_m = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]])
    w_m = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    b_s = np.array([[G, G, 0.5, 1.0, G, G], [G, 2.0, 2.0, 2.0, 2.0, 2.0]])
    w_s = np.array([[-G, -G, 0.5, 0.0, G, G], [-G, 0.0, 0.0, 0.0, 0.0, 0.0]])
    args = [t(b_s), t(w_s), paddle.to_tensor(b_ids), paddle.to_tensor(w_ids), paddle.to_tensor(b_m), paddle.to_tensor(w_m)]
    copies = [a.numpy().copy() for a in args]
    loss, stats = tokenwise_pairwise_reward_loss(*args)
    l0 = (np.log(2) + nlogsig(1.0)) / 2
    l1 = nlogsig(2.0)
    np.testing.assert_allclose(loss.numpy(), (l0 + l1) / 2, rtol=1e-12)
    np.testing.assert_allclose(loss.numpy(), 0.3150662, rtol=1e-6)
    np.testing.assert_allclose(stats["rm/accuracy"].numpy(), 1.0)
    np.testing.assert_allclose(stats["rm/margin"].numpy(), 1.25)
    for a, c in zip(args, copies):
        np.testing.assert_array_equal(a.numpy(), c)


def test_tokenwise_loop_reference_random():
    """Random right-padded pairs sharing a random prefix; compare with the safe-rlhf loop."""
    rng = np.random.default_rng(0)
    B, L = 4, 8
    b_ids = rng.integers(1, 50, size=(B, L))
    w_ids = b_ids.copy()
    b_m, w_m = np.zeros((B, L), int), np.zeros((B, L), int)
    for i in range(B):
        div = rng.integers(1, L - 1)
        w_ids[i, div:] = rng.integers(50, 99, size=L - div)
        b_m[i, : rng.integers(div + 1, L + 1)] = 1
        w_m[i, : rng.integers(div + 1, L + 1)] = 1
    b_s, w_s = rng.normal(size=(B, L)), rng.normal(size=(B, L))
    for reg in (0.0, 0.05):
        ref = tokenwise_reference(b_s, w_s, b_ids, w_ids, b_m, w_m, reg)
        loss, _ = tokenwise_pairwise_reward_loss(
            t(b_s), t(w_s), paddle.to_tensor(b_ids), paddle.to_tensor(w_ids),
            paddle.to_tensor(b_m), paddle.to_tensor(w_m), regularization=reg,
        )
        np.testing.assert_allclose(loss.numpy(), ref, rtol=1e-10)


# ---------------------------------------------------------------- DPO family

# Two pairs, reference log-probs equal for chosen and rejected so h = pi_c - pi_r = [2, -1].
PC, PR, RC, RR = [-1.0, -2.0], [-3.0, -1.0], [-2.0, -2.0], [-2.0, -2.0]


def _dpo(loss_type, **kw):
    return dpo_loss(t(PC), t(PR), t(RC), t(RR), loss_type=loss_type, **kw)


def test_dpo_sigmoid_hand_computed():
    """beta 0.5, h = [2, -1]: loss = (-log s(1) - log s(-0.5)) / 2 = (0.3132617 + 0.9740770) / 2
    = 0.6436693. Rewards beta (pi - ref): chosen [0.5, 0], rejected [-0.5, 0.5];
    means 0.25 and 0; accuracy 1/2; margins mean(1, -0.5) = 0.25."""
    loss, s = _dpo("sigmoid", beta=0.5)
    np.testing.assert_allclose(loss.numpy(), 0.6436693, rtol=1e-6)
    np.testing.assert_allclose(s["rewards/chosen"].numpy(), 0.25)
    np.testing.assert_allclose(s["rewards/rejected"].numpy(), 0.0)
    np.testing.assert_allclose(s["rewards/accuracies"].numpy(), 0.5)
    np.testing.assert_allclose(s["rewards/margins"].numpy(), 0.25)


def test_dpo_sigmoid_label_smoothing_cdpo():
    """e = 0.1, z = beta h = [1, -0.5]: per pair 0.9 (-log s(z)) + 0.1 (-log s(-z)):
    0.9 * 0.3132617 + 0.1 * 1.3132617 = 0.4132617; 0.9 * 0.9740770 + 0.1 * 0.4740770 = 0.9240770;
    mean 0.6686693."""
    loss, _ = _dpo("sigmoid", beta=0.5, label_smoothing=0.1)
    np.testing.assert_allclose(loss.numpy(), 0.6686693, rtol=1e-6)


def test_dpo_ipo_hand_computed():
    """beta 0.5: 1/(2 beta) = 1; (h - 1)^2 = [1, 4] -> 2.5.
    With lengths chosen [2, 4], rejected [4, 1] the log-probs are averaged first:
    pi_c/l = [-0.5, -0.5], pi_r/l = [-0.75, -1], ref_c/l = [-1, -0.5], ref_r/l = [-0.5, -2];
    h = [0.25, 0.5] - [-0.5, 1.5] = [0.75, -1]; (h - 1)^2 = [0.0625, 4] -> 2.03125."""
    loss, _ = _dpo("ipo", beta=0.5)
    np.testing.assert_allclose(loss.numpy(), 2.5)
    lc, lr = np.array([2.0, 4.0]), np.array([4.0, 1.0])
    h = (np.array(PC) / lc - np.array(PR) / lr) - (np.array(RC) / lc - np.array(RR) / lr)
    loss_n, _ = _dpo("ipo", beta=0.5, chosen_lengths=t(lc), rejected_lengths=t(lr))
    np.testing.assert_allclose(h, [0.75, -1.0])
    np.testing.assert_allclose(loss_n.numpy(), 2.03125, rtol=1e-12)


def test_dpo_hinge_hand_computed():
    """beta 0.5: relu(1 - 0.5 h) = relu([0, 1.5]) -> 0.75."""
    loss, _ = _dpo("hinge", beta=0.5)
    np.testing.assert_allclose(loss.numpy(), 0.75)


def test_dpo_reference_free_equals_zero_reference():
    """reference_free drops the reference terms: same as passing zeros."""
    a, _ = dpo_loss(t(PC), t(PR), beta=0.3, reference_free=True)
    b, _ = dpo_loss(t(PC), t(PR), t([0.0, 0.0]), t([0.0, 0.0]), beta=0.3)
    np.testing.assert_allclose(a.numpy(), b.numpy())
    np.testing.assert_allclose(a.numpy(), np.mean(nlogsig(0.3 * np.array([2.0, -1.0]))), rtol=1e-12)


def test_simpo_hand_computed():
    """Sums PC = [-1, -2] over lengths [2, 4] -> a_c = [-0.5, -0.5]; PR = [-3, -1] over
    [3, 1] -> a_r = [-1, -1]. beta 2, gamma 0.5: z = 2 * 0.5 - 0.5 = 0.5 for both pairs,
    loss = -log s(0.5) = 0.4740770. Rewards beta * a: chosen -1, rejected -2,
    accuracy 1, margin 1."""
    loss, s = dpo_loss(t(PC), t(PR), beta=2.0, loss_type="simpo", simpo_gamma=0.5,
                       chosen_lengths=t([2.0, 4.0]), rejected_lengths=t([3.0, 1.0]))
    np.testing.assert_allclose(loss.numpy(), 0.4740770, rtol=1e-6)
    np.testing.assert_allclose(s["rewards/chosen"].numpy(), -1.0)
    np.testing.assert_allclose(s["rewards/rejected"].numpy(), -2.0)
    np.testing.assert_allclose(s["rewards/accuracies"].numpy(), 1.0)
    np.testing.assert_allclose(s["rewards/margins"].numpy(), 1.0)


def test_orpo_hand_computed():
    """Same averages a_c = -0.5, a_r = -1:
    log_odds = (a_c - a_r) - (log(1 - e^-0.5) - log(1 - e^-1))
             = 0.5 - (-0.9327521 + 0.4586751) = 0.9740770;
    loss = -beta log s(0.9740770) = 0.1 * 0.3202998 = 0.0320300 (+ NLL 1.5 when given)."""
    kw = dict(beta=0.1, loss_type="orpo", chosen_lengths=t([2.0, 4.0]), rejected_lengths=t([3.0, 1.0]))
    log_odds = 0.5 - (np.log(1 - np.exp(-0.5)) - np.log(1 - np.exp(-1.0)))
    np.testing.assert_allclose(log_odds, 0.9740770, rtol=1e-6)
    loss, s = dpo_loss(t(PC), t(PR), **kw)
    np.testing.assert_allclose(loss.numpy(), 0.1 * nlogsig(log_odds), rtol=1e-10)
    np.testing.assert_allclose(loss.numpy(), 0.0320300, rtol=1e-5)
    np.testing.assert_allclose(s["orpo/log_odds_ratio"].numpy(), log_odds, rtol=1e-10)
    loss_nll, s2 = dpo_loss(t(PC), t(PR), policy_chosen_nll=t(1.5), **kw)
    np.testing.assert_allclose(loss_nll.numpy(), 1.5 + 0.1 * nlogsig(log_odds), rtol=1e-10)
    loss_lam, _ = dpo_loss(t(PC), t(PR), orpo_lambda=0.2, **kw)
    np.testing.assert_allclose(loss_lam.numpy(), 0.2 * nlogsig(log_odds), rtol=1e-10)


def test_dpo_gradient_flows_to_policy_only_and_no_mutation():
    """dL/d pi_c = -beta s(-beta h) / B for the sigmoid loss; reference gets no gradient."""
    pc, pr, rc, rr = t(PC), t(PR), t(RC), t(RR)
    for x in (pc, pr, rc, rr):
        x.stop_gradient = False
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=0.5)
    loss.backward()
    h = np.array([2.0, -1.0])
    np.testing.assert_allclose(pc.grad.numpy(), -0.5 * sig(-0.5 * h) / 2, rtol=1e-10)
    assert rc.grad is None and rr.grad is None
    np.testing.assert_array_equal(pc.numpy(), PC)


def test_dpo_errors():
    with pytest.raises(ValueError) as e:
        dpo_loss(t(PC), t(PR), t(RC), t(RR), loss_type="kto")
    assert "sigmoid" in str(e.value) and "orpo" in str(e.value)
    with pytest.raises(ValueError):
        dpo_loss(t(PC), t(PR), loss_type="simpo")  # lengths missing
    with pytest.raises(ValueError):
        dpo_loss(t(PC), t(PR), loss_type="sigmoid")  # reference missing


# ---------------------------------------------------------------- KTO

def test_kto_hand_computed():
    """policy [-1, -2, -3], ref [-1.5, -1.5, -2] -> r = [0.5, -0.5, -1]; desirable [1, 0, 1];
    z0 = 0.2, beta 0.5, weights w_d = 1, w_u = 2:
    L0 = 1 - s(0.5 (0.5 - 0.2)) = 1 - s(0.15); L1 = 2 (1 - s(0.5 (0.2 + 0.5))) = 2 (1 - s(0.35));
    L2 = 1 - s(0.5 (-1 - 0.2)) = 1 - s(-0.6); loss = mean.
    rewards/chosen = mean(0.25, -0.5) = -0.125, rewards/rejected = -0.25, kto/kl = 0.2.
    A negative reference point is clamped to 0."""
    pol, ref, des = t([-1.0, -2.0, -3.0]), t([-1.5, -1.5, -2.0]), paddle.to_tensor([True, False, True])
    z0 = t(0.2)
    z0.stop_gradient = False
    pol.stop_gradient = False
    loss, s = kto_loss(pol, ref, des, z0, beta=0.5, desirable_weight=1.0, undesirable_weight=2.0)
    expected = np.mean([1 - sig(0.15), 2 * (1 - sig(0.35)), 1 - sig(-0.6)])
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(s["rewards/chosen"].numpy(), -0.125)
    np.testing.assert_allclose(s["rewards/rejected"].numpy(), -0.25)
    np.testing.assert_allclose(s["rewards/margins"].numpy(), 0.125)
    np.testing.assert_allclose(s["kto/kl"].numpy(), 0.2)
    loss.backward()
    assert z0.grad is None  # the reference point is detached
    assert pol.grad is not None
    loss_neg, s_neg = kto_loss(t([-1.0]), t([-1.5]), paddle.to_tensor([1]), -0.7, beta=0.5)
    np.testing.assert_allclose(loss_neg.numpy(), 1 - sig(0.25), rtol=1e-12)
    np.testing.assert_allclose(s_neg["kto/kl"].numpy(), 0.0)
    np.testing.assert_allclose(s_neg["rewards/rejected"].numpy(), 0.0)  # no undesirable example


def test_kto_kl_reference_point():
    """mean([0.5, -0.1]) = 0.2; mean([-0.5, 0.1]) = -0.2 -> clamped to 0."""
    np.testing.assert_allclose(kto_kl_reference_point(t([-1.0, -2.0]), t([-1.5, -1.9])).numpy(), 0.2)
    np.testing.assert_allclose(kto_kl_reference_point(t([-1.5, -1.9]), t([-1.0, -2.0])).numpy(), 0.0)
