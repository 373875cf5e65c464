"""Tests for ppo.algos.cost (the Safe RLHF cost-model losses and metrics)."""
import numpy as np
import paddle
import pytest

from ppo.algos import cost_metrics, pairwise_cost_loss, tokenwise_pairwise_cost_loss


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def nlogsig(x):
    """-log sigmoid(x) in numpy."""
    return np.log1p(np.exp(-np.asarray(x, dtype="float64")))


def test_sequence_wise_hand_computed():
    """Safer costs [-1, 0.5], unsafer [2, 0]; safety signs safer [+1, +1], unsafer [-1, +1]
    (cost signs sigma = -safety sign: safer [-1, -1], unsafer [+1, -1]).
    Pair 0: -log s(2 - (-1)) - log s(-1 * -1) - log s(+1 * 2) = 0.0485874 + 0.3132617 + 0.1269280 = 0.4887771.
    Pair 1: -log s(0 - 0.5) - log s(-0.5) - log s(0) = 2 * 0.9740770 + 0.6931472 = 2.6413012.
    loss = 1.5650391. accuracy: 2 > -1 yes, 0 > 0.5 no -> 0.5.
    sign accuracy: sigma*c = [1, -0.5] (safer), [2, 0] (unsafer; 0 is wrong) -> 2/4 = 0.5.
    margin = mean(3, -0.5) = 1.25. regularization 0.1 adds 0.1 * mean(1, 0.25, 4, 0) = 0.13125.
    """
    cs, cu = t([-1.0, 0.5]), t([2.0, 0.0])
    ss, su = paddle.to_tensor([1, 1]), paddle.to_tensor([-1, 1])
    copies = [x.numpy().copy() for x in (cs, cu, ss, su)]
    loss, stats = pairwise_cost_loss(cs, cu, ss, su)
    np.testing.assert_allclose(loss.numpy(), 1.5650391, rtol=1e-6)
    np.testing.assert_allclose(stats["cost/loss"].numpy(), loss.numpy())
    np.testing.assert_allclose(stats["cost/accuracy"].numpy(), 0.5)
    np.testing.assert_allclose(stats["cost/sign_accuracy"].numpy(), 0.5)
    np.testing.assert_allclose(stats["cost/margin"].numpy(), 1.25)
    loss_reg, _ = pairwise_cost_loss(cs, cu, ss, su, regularization=0.1)
    np.testing.assert_allclose(loss_reg.numpy(), 1.5650391 + 0.13125, rtol=1e-6)
    for x, c in zip((cs, cu, ss, su), copies):
        np.testing.assert_array_equal(x.numpy(), c)


def test_sign_terms_push_unsafe_up_and_safe_down():
    """d/dc of -log s(sigma c) is -sigma * s(-sigma c): negative for an unsafe answer
    (gradient descent raises its cost), positive for a safe one. With both answers
    unsafe and equal costs 0, the pairwise term gives -/+ 0.5 and each sign term -0.5:
    dL/dc_s = (0.5 - 0.5) / 1 = 0, dL/dc_u = (-0.5 - 0.5) = -1 (B = 1)."""
    cs, cu = t([0.0]), t([0.0])
    cs.stop_gradient = cu.stop_gradient = False
    loss, _ = pairwise_cost_loss(cs, cu, paddle.to_tensor([-1]), paddle.to_tensor([-1]))
    loss.backward()
    np.testing.assert_allclose(cs.grad.numpy(), [0.0], atol=1e-12)
    np.testing.assert_allclose(cu.grad.numpy(), [-1.0], atol=1e-12)


def test_well_separated_costs_give_small_loss_and_full_accuracy():
    cs, cu = t([-6.0, -6.0, 5.0]), t([6.0, -3.0, 9.0])  # pair 1 both safe, pair 2 both unsafe
    ss, su = paddle.to_tensor([1, 1, -1]), paddle.to_tensor([-1, 1, -1])
    loss, stats = pairwise_cost_loss(cs, cu, ss, su)
    assert float(loss) < 0.1
    assert float(stats["cost/accuracy"]) == 1.0 and float(stats["cost/sign_accuracy"]) == 1.0
    flipped, flipped_stats = pairwise_cost_loss(cs, cu, -ss, -su)  # every label wrong
    assert float(flipped) > 5.0 and float(flipped_stats["cost/sign_accuracy"]) == 0.0


def test_cost_metrics_float_signs_and_lists():
    stats = cost_metrics(t([-1.0, 1.0]), t([1.0, 2.0]), [1.0, -1.0], [-1.0, -1.0])
    np.testing.assert_allclose(stats["cost/accuracy"].numpy(), 1.0)
    np.testing.assert_allclose(stats["cost/sign_accuracy"].numpy(), 1.0)
    np.testing.assert_allclose(stats["cost/margin"].numpy(), 1.5)


def hand_tokenwise():
    """Pair 0: safer ids [1,2,3,4,0,0] (mask ends at 3), unsafer [1,2,5,0,0,0] (ends at 2):
    span {2, 3}. Pair 1: ids differ from column 1, ends 4 and 5 -> span {1..5}.
    Costs outside the spans are garbage (1e6) and must not matter."""
    G = 1e6
    s_ids = np.array([[1, 2, 3, 4, 0, 0], [7, 8, 9, 9, 9, 0]])
    u_ids = np.array([[1, 2, 5, 0, 0, 0], [7, 1, 1, 1, 1, 1]])
    s_m = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]])
    u_m = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    s_c = np.array([[G, G, 0.0, -1.0, G, G], [G, 1.0, 1.0, 1.0, 1.0, 1.0]])
    u_c = np.array([[-G, -G, 0.0, 1.0, G, G], [-G, 3.0, 3.0, 3.0, 3.0, 3.0]])
    return s_c, u_c, s_ids, u_ids, s_m, u_m


def test_tokenwise_hand_computed():
    """Pair 0 (safer safe, unsafer unsafe): over span costs safer [0, -1], unsafer [0, 1]:
    pairwise mean(-log s([0, 2])) = (log 2 + 0.1269280) / 2; safer sign terms (sigma -1)
    mean(-log s([0, 1])) = (log 2 + 0.3132617) / 2; unsafer (sigma +1) the same.
    Pair 1 (both unsafe, sigma +1): -log s(2) + -log s(1) + -log s(3).
    End costs: pair 0 safer c(3) = -1, unsafer c(2) = 0; pair 1 safer c(4) = 1, unsafer c(5) = 3:
    accuracy 1; signs right for -1 (safe), 1, 3 (unsafe), wrong for 0 -> 3/4; margin (1 + 2) / 2.
    regularization 0.1: pair 0 + 0.1 * ((0 + 1) / 2 + (0 + 1) / 2) / 2 = 0.05, pair 1 + 0.1 * (1 + 9) / 2 = 0.5.
    """
    s_c, u_c, s_ids, u_ids, s_m, u_m = hand_tokenwise()
    args = [t(s_c), t(u_c), paddle.to_tensor(s_ids), paddle.to_tensor(u_ids), paddle.to_tensor(s_m), paddle.to_tensor(u_m),
            paddle.to_tensor([1, -1]), paddle.to_tensor([-1, -1])]
    copies = [a.numpy().copy() for a in args]
    loss, stats = tokenwise_pairwise_cost_loss(*args)
    l0 = (np.log(2) + nlogsig(2.0)) / 2 + 2 * (np.log(2) + nlogsig(1.0)) / 2
    l1 = nlogsig(2.0) + nlogsig(1.0) + nlogsig(3.0)
    np.testing.assert_allclose(loss.numpy(), (l0 + l1) / 2, rtol=1e-12)
    np.testing.assert_allclose(stats["cost/accuracy"].numpy(), 1.0)
    np.testing.assert_allclose(stats["cost/sign_accuracy"].numpy(), 0.75)
    np.testing.assert_allclose(stats["cost/margin"].numpy(), 1.5)
    loss_reg, _ = tokenwise_pairwise_cost_loss(*args, regularization=0.1)
    np.testing.assert_allclose(loss_reg.numpy(), (l0 + 0.05 + l1 + 0.5) / 2, rtol=1e-12)
    for a, c in zip(args, copies):
        np.testing.assert_array_equal(a.numpy(), c)


def test_tokenwise_garbage_outside_span_is_ignored():
    s_c, u_c, s_ids, u_ids, s_m, u_m = hand_tokenwise()
    rest = [paddle.to_tensor(x) for x in (s_ids, u_ids, s_m, u_m)] + [paddle.to_tensor([1, -1]), paddle.to_tensor([-1, -1])]
    base, _ = tokenwise_pairwise_cost_loss(t(s_c), t(u_c), *rest, regularization=0.1)
    for arr in (s_c, u_c):
        arr[0, :2] = -123.0
        arr[1, 0] = 7e5
    other, _ = tokenwise_pairwise_cost_loss(t(s_c), t(u_c), *rest, regularization=0.1)
    np.testing.assert_allclose(other.numpy(), base.numpy(), rtol=1e-12)


def safe_rlhf_sequence_wise(lower, higher, safer_safety_sign, unsafer_safety_sign, reg):
    """safe-rlhf CostTrainer.loss, loss_type 'sequence-wise', line by line in numpy."""
    lower_cost_sign, higher_cost_sign = -safer_safety_sign, -unsafer_safety_sign
    loss = (nlogsig(higher - lower) + nlogsig(lower_cost_sign * lower) + nlogsig(higher_cost_sign * higher)).mean()
    if reg > 0.0:
        loss = loss + reg * (np.square(np.stack([lower, higher]))).mean()
    return loss


def safe_rlhf_token_wise(lower_costs, higher_costs, s_ids, u_ids, s_m, u_m, safer_safety_sign, unsafer_safety_sign, reg):
    """safe-rlhf CostTrainer.loss, loss_type 'token-wise': the per-pair loop in numpy."""
    losses = []
    for i in range(lower_costs.shape[0]):
        end_index = max(np.nonzero(s_m[i])[0][-1], np.nonzero(u_m[i])[0][-1])
        diverge_index = np.nonzero(s_ids[i] != u_ids[i])[0][0]
        lo = lower_costs[i, diverge_index:end_index + 1]
        hi = higher_costs[i, diverge_index:end_index + 1]
        li = nlogsig(hi - lo).mean() + nlogsig(-safer_safety_sign[i] * lo).mean() + nlogsig(-unsafer_safety_sign[i] * hi).mean()
        if reg > 0.0:
            li += reg * np.square(np.stack([lo, hi])).mean()
        losses.append(li)
    return np.mean(losses)


def random_pairs(seed, B=6, L=9):
    rng = np.random.default_rng(seed)
    s_ids = rng.integers(1, 50, size=(B, L))
    u_ids = s_ids.copy()
    s_m, u_m = np.zeros((B, L), int), np.zeros((B, L), int)
    for i in range(B):
        div = rng.integers(1, L - 1)
        u_ids[i, div:] = rng.integers(50, 99, size=L - div)
        s_m[i, : rng.integers(div + 1, L + 1)] = 1
        u_m[i, : rng.integers(div + 1, L + 1)] = 1
    unsafer_sign = rng.choice([-1, 1], size=B)
    safer_sign = np.where(unsafer_sign == 1, 1, rng.choice([-1, 1], size=B))  # a safe unsafer answer has a safe partner
    return rng.normal(size=(B, L)) * 2, rng.normal(size=(B, L)) * 2, s_ids, u_ids, s_m, u_m, safer_sign, unsafer_sign


@pytest.mark.parametrize("reg", [0.0, 0.05])
def test_matches_safe_rlhf_reference_random(reg):
    """Random pairs and signs: both variants equal safe-rlhf's own formulas (ported above)."""
    s_c, u_c, s_ids, u_ids, s_m, u_m, ss, su = random_pairs(0)
    ref = safe_rlhf_token_wise(s_c, u_c, s_ids, u_ids, s_m, u_m, ss, su, reg)
    loss, _ = tokenwise_pairwise_cost_loss(
        t(s_c), t(u_c), *(paddle.to_tensor(x) for x in (s_ids, u_ids, s_m, u_m, ss, su)), regularization=reg
    )
    np.testing.assert_allclose(loss.numpy(), ref, rtol=1e-10)
    lower, higher = s_c[:, 0], u_c[:, 0]
    loss_seq, stats = pairwise_cost_loss(t(lower), t(higher), paddle.to_tensor(ss), paddle.to_tensor(su), regularization=reg)
    np.testing.assert_allclose(loss_seq.numpy(), safe_rlhf_sequence_wise(lower, higher, ss, su, reg), rtol=1e-10)
    sign_right = np.concatenate([-ss * lower > 0, -su * higher > 0]).mean()  # safe-rlhf accuracy_sign
    np.testing.assert_allclose(stats["cost/sign_accuracy"].numpy(), sign_right)
    np.testing.assert_allclose(stats["cost/accuracy"].numpy(), (higher > lower).mean())


def test_tokenwise_loop_versus_vectorised_batches():
    """A batch's loss is the mean of its pairs' one-pair losses."""
    s_c, u_c, s_ids, u_ids, s_m, u_m, ss, su = random_pairs(1, B=4)
    tensors = lambda sl: [t(s_c[sl]), t(u_c[sl])] + [paddle.to_tensor(x[sl]) for x in (s_ids, u_ids, s_m, u_m, ss, su)]  # noqa: E731
    whole, _ = tokenwise_pairwise_cost_loss(*tensors(slice(None)), regularization=0.01)
    singles = [float(tokenwise_pairwise_cost_loss(*tensors(slice(i, i + 1)), regularization=0.01)[0]) for i in range(4)]
    np.testing.assert_allclose(whole.numpy(), np.mean(singles), rtol=1e-12)
