"""Tests for the listwise, unpaired and rejected-only preference losses (RRHF, LiPO-lambda, PRO,
DRO, unpaired KTO, BCO, NPO) and the new pair losses (CPO, R-DPO): hand-derived cases, loops against the
vectorised code, garbage at padding answers, inputs not mutated."""
import math

import numpy as np
import paddle
import pytest

from ppo.algos import PREFERENCE_LOSSES, PreferenceInputs
from tests.preference_shims import dpo_loss

LN2 = math.log(2.0)


def t(a):
    return paddle.to_tensor(np.asarray(a, dtype="float64"))


def nlogsig(x):
    return float(np.log1p(np.exp(-x)))


def run(name, policy, reference=None, lengths=None, scores=None, valid=None, nll=None, kl_point=None, **hp):
    x = PreferenceInputs(t(policy), None if reference is None else t(reference), None if lengths is None else t(lengths),
                         None if scores is None else t(scores), None if valid is None else t(valid),
                         None if nll is None else t(nll), None if kl_point is None else t(kl_point))
    loss, stats = PREFERENCE_LOSSES[name](x, hp)
    return float(loss.numpy()), {k: float(v.numpy()) for k, v in stats.items()}


# ---------------------------------------------------------------- RRHF

def test_rrhf_one_violated_pair_plus_nll():
    """scores [2, 1, 0], lengths 1, p = [-1, -0.5, -2]: only (best, middle) is violated,
    max(0, -0.5 - (-1)) = 0.5; plus nll 1.5 -> 2.0."""
    loss, stats = run("rrhf", [[-1.0, -0.5, -2.0]], lengths=[[1, 1, 1]], scores=[[2, 1, 0]], nll=1.5)
    assert loss == pytest.approx(2.0) and stats["rrhf/rank_loss"] == pytest.approx(0.5)
    assert stats["rewards/chosen"] == -1.0 and stats["rewards/rejected"] == -2.0
    assert stats["rewards/accuracies"] == pytest.approx(2 / 3)  # (0,2), (1,2) right; (0,1) wrong


def test_rrhf_length_normalised_and_no_violation():
    """logp [-2, -3, -4] over lengths [2, 1, 4] -> p = [-1, -3, -1]: (middle, worst) violated by 2."""
    assert run("rrhf", [[-2.0, -3.0, -4.0]], lengths=[[2, 1, 4]], scores=[[2, 1, 0]], nll=0.0)[0] == pytest.approx(2.0)
    assert run("rrhf", [[-1.0, -2.0, -3.0]], lengths=[[1, 1, 1]], scores=[[2, 1, 0]], nll=0.25)[0] == pytest.approx(0.25)


# ---------------------------------------------------------------- LiPO-lambda

def test_lipo_pair_at_the_reference_has_a_gradient():
    """K = 2, psi = [1, 0], s = [0, 0] (ties by position: tau = [1, 2]):
    Delta = |2^1 - 1 - 0| |1/log2(2) - 1/log2(3)|, L = Delta log 2."""
    delta = 1.0 - 1.0 / math.log2(3.0)
    loss, stats = run("lipo", [[-3.0, -5.0]], reference=[[-3.0, -5.0]], scores=[[1, 0]], beta=0.5)
    assert loss == pytest.approx(delta * LN2)
    assert stats["rewards/margins"] == 0.0 and stats["rewards/accuracies"] == 0.0


def test_lipo_misranked_pair():
    """beta 0.5, log-ratios [0, 2] -> s = [0, 1]: tau = [2, 1], the same |1/D| gap;
    L = Delta * -log s(0 - 1)."""
    delta = 1.0 - 1.0 / math.log2(3.0)
    loss, _ = run("lipo", [[0.0, 2.0]], reference=[[0.0, 0.0]], scores=[[1, 0]], beta=0.5)
    assert loss == pytest.approx(delta * nlogsig(-1.0))


def test_lipo_three_answers_rank_weights():
    """psi [2, 1, 0], s = 0: G = [3, 1, 0], 1/D = [1, 1/log2 3, 1/2];
    Delta01 = 2 (1 - 1/log2 3), Delta02 = 3 / 2, Delta12 = 1/log2 3 - 1/2; L = sum Delta log 2."""
    inv3 = 1.0 / math.log2(3.0)
    expected = (2 * (1 - inv3) + 1.5 + (inv3 - 0.5)) * LN2
    assert run("lipo", [[0.0, 0.0, 0.0]], reference=[[0.0] * 3], scores=[[2, 1, 0]])[0] == pytest.approx(expected)


# ---------------------------------------------------------------- PRO

def test_pro_hand_computed():
    """K = 2, r = [0, 0]: log 2. K = 3, scores [2, 1, 0], r = [0, -1, -2]:
    (lse(0, -1, -2) - 0) + (lse(-1, -2) + 1) + 0."""
    assert run("pro", [[0.0, 0.0]], lengths=[[3, 5]], scores=[[1, 0]])[0] == pytest.approx(LN2)
    expected = math.log(1 + math.exp(-1) + math.exp(-2)) + math.log(math.exp(-1) + math.exp(-2)) + 1
    loss, stats = run("pro", [[0.0, -2.0, -2.0]], lengths=[[1, 2, 1]], scores=[[2, 1, 0]])
    assert loss == pytest.approx(expected) and stats["rewards/accuracies"] == 1.0


def test_dro_hand_computed():
    """r = [1, 0], rho = 0, tau 1: V = 0.5, L = 1/2 (0.25 + 0.25) / 2 = 0.125.
    tau 0.5, rho = [2, 0]: residuals [0, 0] -> L = 0 (the policy already fits the rewards)."""
    loss, stats = run("dro", [[-3.0, -5.0]], reference=[[-3.0, -5.0]], scores=[[1, 0]], beta=1.0)
    assert loss == pytest.approx(0.125) and stats["dro/value"] == 0.5
    assert run("dro", [[-1.0, -5.0]], reference=[[-3.0, -5.0]], scores=[[1, 0]], beta=0.5)[0] == pytest.approx(0.0)


# ---------------------------------------------------------------- loops against the vectorised code

def loop_rrhf(p, s, v):
    return sum(max(0.0, p[j] - p[i]) for i in range(len(p)) for j in range(len(p)) if v[i] and v[j] and s[i] > s[j])


def loop_lipo(sv, psi, v):
    idx = [i for i in range(len(sv)) if v[i]]
    order = sorted(idx, key=lambda i: (-sv[i], i))
    tau = {i: order.index(i) + 1 for i in idx}
    g = {i: 2.0 ** psi[i] - 1 for i in idx}
    total = 0.0
    for i in idx:
        for j in idx:
            if psi[i] > psi[j]:
                delta = abs(g[i] - g[j]) * abs(1 / math.log2(1 + tau[i]) - 1 / math.log2(1 + tau[j]))
                total += delta * nlogsig(sv[i] - sv[j])
    return total


def loop_pro(r, s, v):
    total = 0.0
    for k in range(len(r)):
        if v[k]:
            members = [r[i] for i in range(len(r)) if v[i] and s[i] <= s[k]]
            total += math.log(sum(math.exp(m) for m in members)) - r[k]
    return total


def random_lists(rng, B=4, K=5):
    pol, ref = rng.normal(size=(B, K)) - 6, rng.normal(size=(B, K)) - 6
    lengths = rng.integers(1, 7, (B, K)).astype("float64")
    scores = rng.integers(0, 4, (B, K)).astype("float64")
    valid = np.ones((B, K))
    valid[0, 3:] = 0
    valid[2, 2:] = 0
    return pol, ref, lengths, scores, valid


def test_list_losses_match_loops():
    rng = np.random.default_rng(3)
    pol, ref, lengths, scores, valid = random_lists(rng)
    p = pol / lengths
    rrhf = np.mean([loop_rrhf(p[b], scores[b], valid[b]) for b in range(4)]) + 0.5
    assert run("rrhf", pol, lengths=lengths, scores=scores, valid=valid, nll=0.5)[0] == pytest.approx(rrhf, rel=1e-10)
    sv = 0.3 * (pol - ref)
    lipo = np.mean([loop_lipo(sv[b], scores[b], valid[b]) for b in range(4)])
    assert run("lipo", pol, ref, scores=scores, valid=valid, beta=0.3)[0] == pytest.approx(lipo, rel=1e-10)
    dro = []
    for b in range(4):
        res = [scores[b, k] - 0.3 * (pol[b, k] - ref[b, k]) for k in range(5) if valid[b, k]]
        dro.append(0.5 * np.mean([(v - np.mean(res)) ** 2 for v in res]))
    assert run("dro", pol, ref, scores=scores, valid=valid, beta=0.3)[0] == pytest.approx(np.mean(dro), rel=1e-10)
    pro = np.mean([loop_pro(p[b], scores[b], valid[b]) for b in range(4)])
    assert run("pro", pol, lengths=lengths, scores=scores, valid=valid)[0] == pytest.approx(pro, rel=1e-10)


@pytest.mark.parametrize("name", ["rrhf", "lipo", "pro", "dro"])
def test_garbage_at_padding_answers_changes_nothing_and_inputs_kept(name):
    rng = np.random.default_rng(4)
    pol, ref, lengths, scores, valid = random_lists(rng)
    clean = run(name, pol, ref, lengths, scores, valid, nll=0.5)
    pad = valid == 0
    arrays = [a.copy() for a in (pol, ref, lengths, scores)]
    for a, junk in zip(arrays, (1e4, -1e4, 1e-3, 99.0)):
        a[pad] = junk
    tensors = [t(a) for a in arrays] + [t(valid)]
    before = [x.numpy().copy() for x in tensors]
    x = PreferenceInputs(*tensors, nll=t(0.5))
    loss, stats = PREFERENCE_LOSSES[name](x, {})
    assert float(loss.numpy()) == pytest.approx(clean[0], rel=1e-12)
    assert {k: float(v.numpy()) for k, v in stats.items()} == pytest.approx(clean[1], rel=1e-12)
    for b, x_ in zip(before, tensors):
        np.testing.assert_array_equal(b, x_.numpy())


# ---------------------------------------------------------------- unpaired KTO, NPO

def test_kto_unpaired_weights_and_accuracy():
    """beta 1, z0 0, labels [1, 0], r = [1, 1], w_d 2: (2 (1 - s(1)) + (1 - s(-1))) / 2."""
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    loss, stats = run("kto_unpaired", [[1.0], [1.0]], reference=[[0.0], [0.0]], scores=[[1], [0]], kl_point=0.0,
                      beta=1.0, desirable_weight=2.0)
    assert loss == pytest.approx((2 * (1 - sig(1)) + (1 - sig(-1))) / 2)
    assert stats["rewards/accuracies"] == 0.5 and stats["rewards/chosen"] == 1.0 and stats["rewards/rejected"] == 1.0


def test_bco_hand_computed():
    """beta 1, log-ratios [1, -1], labels [1, 0]: delta 0, both on their side: -log s(1).
    Log-ratios [1, 1]: delta 1, L = log 2; accuracy 0 (z > delta for neither)."""
    loss, stats = run("bco", [[1.0], [-1.0]], reference=[[0.0], [0.0]], scores=[[1], [0]], beta=1.0)
    assert loss == pytest.approx(nlogsig(1.0)) and stats["rewards/accuracies"] == 1.0 and stats["rewards/margins"] == 2.0
    loss, stats = run("bco", [[1.0], [1.0]], reference=[[0.0], [0.0]], scores=[[1], [0]], beta=1.0)
    assert loss == pytest.approx(LN2) and stats["bco/delta"] == 1.0 and stats["rewards/accuracies"] == 0.5


def test_npo_hand_computed():
    """pi = ref: (2 / beta) log 2; beta 0.5, log-ratio 2: -(2 / 0.5) log s(-1)."""
    assert run("npo", [[-4.0]], reference=[[-4.0]], beta=0.5)[0] == pytest.approx(4 * LN2)
    loss, stats = run("npo", [[-2.0], [-4.0]], reference=[[-4.0], [-6.0]], beta=0.5)
    assert loss == pytest.approx(4 * nlogsig(-1.0)) and stats["rewards/rejected"] == pytest.approx(1.0)


# ---------------------------------------------------------------- CPO, R-DPO

def test_cpo_hand_computed():
    """beta 1, pi_c - pi_r = 2, nll 0.7: -log s(2) + 0.7."""
    loss, stats = run("cpo", [[-1.0, -3.0]], nll=0.7, beta=1.0)
    assert loss == pytest.approx(nlogsig(2.0) + 0.7) and stats["rewards/margins"] == 2.0


def test_rdpo_length_term():
    """R-DPO, L = -log s(beta h + alpha (|y_c| - |y_r|)). beta 1, h = (-1 - -2) - 0 = 1, alpha 0.5:
    chosen 2 tokens longer -> z = 1 + 0.5 * 2 = 2, L = -log s(2) = 0.1269 (the longer chosen answer
    already carries margin, so the loss is smaller than DPO's -log s(1) = 0.3133); rejected 2 tokens
    longer -> z = 1 - 1 = 0, L = log 2 = 0.6931; alpha 0 is DPO."""
    pol, ref = [[-1.0, -2.0]], [[0.0, 0.0]]
    assert run("rdpo", pol, ref, [[4, 2]], beta=1.0, rdpo_alpha=0.5)[0] == pytest.approx(0.126928, abs=1e-6)
    assert run("rdpo", pol, ref, [[4, 2]], beta=1.0, rdpo_alpha=0.5)[0] == pytest.approx(nlogsig(2.0))
    assert run("rdpo", pol, ref, [[2, 4]], beta=1.0, rdpo_alpha=0.5)[0] == pytest.approx(LN2)
    dpo, _ = dpo_loss(t([-1.0]), t([-2.0]), t([0.0]), t([0.0]), beta=1.0)
    assert run("rdpo", pol, ref, [[4, 2]], beta=1.0, rdpo_alpha=0.0)[0] == pytest.approx(float(dpo.numpy()))


def test_rdpo_gradient_pushes_less_when_chosen_is_longer():
    """d L / d pi_c = -beta (1 - s(z)): with the chosen answer longer (z = 2) the push is
    1 - s(2) = 0.1192, with it shorter (z = 0) it is 1 - s(0) = 0.5, DPO's (z = 1) 0.2689 in between."""
    def grad(lengths):
        pol = t([[-1.0, -2.0]])
        pol.stop_gradient = False
        x = PreferenceInputs(pol, t([[0.0, 0.0]]), t(lengths), None, None, None, None)
        loss, _ = PREFERENCE_LOSSES["rdpo"](x, {"beta": 1.0, "rdpo_alpha": 0.5, "reference_free": False})
        loss.backward()
        return float(pol.grad.numpy()[0, 0])
    assert grad([[4, 2]]) == pytest.approx(-0.119203, abs=1e-6)
    assert grad([[2, 4]]) == pytest.approx(-0.5, abs=1e-6)
    assert grad([[3, 3]]) == pytest.approx(-0.268941, abs=1e-6)


def test_missing_inputs_are_errors():
    with pytest.raises(ValueError, match="rrhf needs the NLL"):
        run("rrhf", [[0.0, 0.0]], lengths=[[1, 1]], scores=[[1, 0]])
    with pytest.raises(ValueError, match="lipo needs reference"):
        run("lipo", [[0.0, 0.0]], scores=[[1, 0]])
    with pytest.raises(ValueError, match="cpo needs the NLL"):
        run("cpo", [[0.0, 0.0]])
