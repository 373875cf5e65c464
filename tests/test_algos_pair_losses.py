"""PaddleNLP's kto_pair, sppo_hard, nca_pair and dpop losses of the registry (through
`tests.preference_shims.pair_loss`)."""
import numpy as np
import paddle
import pytest

from tests.preference_shims import PAIR_LOSS_TYPES, pair_loss


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def sig(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype="float64")))


def nlogsig(x):
    return np.log1p(np.exp(-np.asarray(x, dtype="float64")))


ZERO2 = [0.0, 0.0]


def test_kto_pair_hand_computed_kl_clipped_at_zero():
    """beta 1, a = [1, -1] (mean 0 -> K_c 0), b = [-2, 0] (mean -1 -> K_r 0):
    terms 1-s(1), 1-s(-1), 1-s(0-(-2)) = 1-s(2), 1-s(0) = 0.5;
    s(1) + s(-1) = 1, so loss = (1 + 1 - 0.8807971 + 0.5) / 4 = 0.4048008."""
    loss, stats = pair_loss(t([1.0, -1.0]), t([-2.0, 0.0]), t(ZERO2), t(ZERO2), beta=1.0, loss_type="kto_pair")
    np.testing.assert_allclose(loss.numpy(), (2.0 - sig(2.0) + 0.5) / 4, rtol=1e-9)
    np.testing.assert_allclose(loss.numpy(), 0.4048008, rtol=1e-6)
    np.testing.assert_allclose(stats["rewards/chosen"].numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(stats["rewards/rejected"].numpy(), -1.0)
    np.testing.assert_allclose(stats["rewards/accuracies"].numpy(), 0.5)  # 1 > -2, -1 < 0


def test_kto_pair_hand_computed_positive_kl():
    """beta 0.5, a = [2, 0] (K_c = 1), b = [1, 1] (K_r = 1), with nonzero references:
    terms 1-s(0.5), 1-s(-0.5), 1-s(0), 1-s(0) -> (1 + 1) / 4 = 0.5."""
    rc, rr = t([0.5, -0.5]), t([-1.0, 2.0])
    loss, _ = pair_loss(rc + t([2.0, 0.0]), rr + t([1.0, 1.0]), rc, rr, beta=0.5, loss_type="kto_pair")
    np.testing.assert_allclose(loss.numpy(), 0.5, rtol=1e-9)


def test_sppo_hard_hand_computed():
    """beta 0.5 (target 1/(2 beta) = 1): a = [1, 0], b = [-1, 1]:
    pair 0: (1-1)^2 + (-1+1)^2 = 0; pair 1: (0-1)^2 + (1+1)^2 = 5; mean 2.5."""
    loss, stats = pair_loss(t([1.0, 0.0]), t([-1.0, 1.0]), t(ZERO2), t(ZERO2), beta=0.5, loss_type="sppo_hard")
    np.testing.assert_allclose(loss.numpy(), 2.5, rtol=1e-12)
    np.testing.assert_allclose(stats["rewards/margins"].numpy(), 0.5 * np.mean([2.0, -1.0]))


def test_nca_pair_hand_computed():
    """beta 1: a = b = 0: -log s(0) - 0.5 log s(0) - 0.5 log s(0) = 2 log 2 = 1.3862944;
    a = 1, b = -1: 1.5 * (-log s(1)) + 0.5 * (-log s(-1)) = 1.5 * 0.3132617 + 0.5 * 1.3132617 = 1.1265234."""
    loss, _ = pair_loss(t([0.0]), t([0.0]), t([0.0]), t([0.0]), beta=1.0, loss_type="nca_pair")
    np.testing.assert_allclose(loss.numpy(), 2 * np.log(2.0), rtol=1e-9)
    loss, _ = pair_loss(t([1.0]), t([-1.0]), t([0.0]), t([0.0]), beta=1.0, loss_type="nca_pair")
    np.testing.assert_allclose(loss.numpy(), 1.1265234, rtol=1e-6)


def test_dpop_hand_computed_penalty_and_dpo_regime():
    """beta 1, lambda 1: chosen below its reference (pi_c - ref_c = -1), rejected at it:
    h = -1, penalty max(0, 1) = 1 -> -log s(-2) = 2.1269280. Chosen above its reference
    (a = 1, b = 0): no penalty, plain DPO -log s(1) = 0.3132617."""
    loss, _ = pair_loss(t([-1.0]), t([0.0]), t([0.0]), t([0.0]), beta=1.0, loss_type="dpop", dpop_lambda=1.0)
    np.testing.assert_allclose(loss.numpy(), 2.1269280, rtol=1e-6)
    loss, _ = pair_loss(t([1.0]), t([0.0]), t([0.0]), t([0.0]), beta=1.0, loss_type="dpop", dpop_lambda=1.0)
    np.testing.assert_allclose(loss.numpy(), 0.3132617, rtol=1e-6)


def loop_reference(pc, pr, rc, rr, beta, loss_type, lam):
    a, b = pc - rc, pr - rr
    if loss_type == "kto_pair":
        kc, kr = max(0.0, a.mean()), max(0.0, b.mean())
        terms = [1 - sig(beta * (a[i] - kr)) for i in range(len(a))] + [1 - sig(beta * (kc - b[i])) for i in range(len(b))]
        return float(np.mean(terms))
    out = []
    for i in range(len(a)):
        if loss_type == "sppo_hard":
            out.append((a[i] - 0.5 / beta) ** 2 + (b[i] + 0.5 / beta) ** 2)
        elif loss_type == "nca_pair":
            out.append(nlogsig(beta * a[i]) + 0.5 * nlogsig(-beta * a[i]) + 0.5 * nlogsig(-beta * b[i]))
        else:
            out.append(nlogsig(beta * ((a[i] - b[i]) - lam * max(0.0, rc[i] - pc[i]))))
    return float(np.mean(out))


@pytest.mark.parametrize("loss_type", PAIR_LOSS_TYPES)
def test_loop_matches_vectorised(loss_type):
    rng = np.random.default_rng(5)
    pc, pr, rc, rr = (rng.normal(-20, 3, size=7) for _ in range(4))
    loss, _ = pair_loss(t(pc), t(pr), t(rc), t(rr), beta=0.3, loss_type=loss_type, dpop_lambda=2.0)
    np.testing.assert_allclose(loss.numpy(), loop_reference(pc, pr, rc, rr, 0.3, loss_type, 2.0), rtol=1e-10)


@pytest.mark.parametrize("loss_type", PAIR_LOSS_TYPES)
def test_gradient_reaches_policy_only_and_inputs_unchanged(loss_type):
    rng = np.random.default_rng(1)
    arrays = [rng.normal(-5, 1, size=4) for _ in range(4)]
    pc, pr, rc, rr = (t(a) for a in arrays)
    for x in (pc, pr, rc, rr):
        x.stop_gradient = False
    loss, _ = pair_loss(pc, pr, rc, rr, beta=0.2, loss_type=loss_type, dpop_lambda=3.0)
    loss.backward()
    assert pc.grad is not None and np.abs(pc.grad.numpy()).sum() > 0
    assert rc.grad is None and rr.grad is None  # references are detached
    for x, a in zip((pc, pr, rc, rr), arrays):
        np.testing.assert_array_equal(x.numpy(), a)


def test_unknown_type_is_refused():
    with pytest.raises(ValueError, match="Unknown pair loss_type 'sigmoid'"):
        pair_loss(t([0.0]), t([0.0]), t([0.0]), t([0.0]), loss_type="sigmoid")
