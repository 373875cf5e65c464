"""Pass@k advantages (ppo.algos.pass_at_k, estimator `pass_at_k`): the analytic form against the
enumeration of every k-subset of a group, hand cases per regime, k = 1 as GRPO with the population
std, the authors' calc_adv (RUCAIBox/Passk_Training code/passk_adv.py), loop versus vectorised,
garbage, no mutation and the registry entry's settings."""
import itertools
import math
from fractions import Fraction

import numpy as np
import paddle
import pytest

from ppo.algos import ADV_ESTIMATORS, get_adv_estimator, pass_at_k_advantages


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def enumerated(correct, k):
    """Exact advantages: every k-subset g gets R(g) = any correct; A_i = mean over the subsets
    holding i of (R(g) - rho) / sigma with rho, sigma the mean and (population) std of R."""
    n = len(correct)
    subsets = list(itertools.combinations(range(n), k))
    R = {g: Fraction(int(any(correct[i] for i in g))) for g in subsets}
    rho = sum(R.values()) / len(subsets)
    var = rho * (1 - rho)
    out = []
    for i in range(n):
        mine = [R[g] - rho for g in subsets if i in g]
        out.append(float(sum(mine) / len(mine)) / math.sqrt(var) if var else 0.0)
    return out


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_matches_enumeration_of_every_k_subset(n):
    """All 2^n correctness patterns (in order), every k: the closed form equals the enumeration
    (eps = 1e-300: sigma + eps is sigma, and 0 / eps = 0 where sigma = 0)."""
    for pattern in itertools.product([0, 1], repeat=n):
        for k in range(1, n + 1):
            got = pass_at_k_advantages(t(pattern), n, k, eps=1e-300).numpy()
            want = enumerated(pattern, k)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{pattern} k={k}")


# (id, scores of one group, k, want): hand-derived in the docstring of pass_at_k_advantages
REGIMES = [
    # n = 4, one correct, k = 2: rho = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2: A+ = 1, A- = (1/2 - 2/3)/(1/2) = -1/3
    ("one_correct_k2", [0.0, 1.0, 0.0, 0.0], 2, [-1 / 3, 1.0, -1 / 3, -1 / 3]),
    # n = 4, two correct, k = 3: only 2 incorrect < k, every 3-subset passes: rho = 1 -> all 0
    ("every_subset_passes", [1.0, 0.0, 1.0, 0.0], 3, [0.0] * 4),
    # nobody correct: rho = 0 -> all 0; everybody correct: rho = 1 -> all 0
    ("none_correct", [0.0, 0.2, 0.0, 0.5], 2, [0.0] * 4),
    ("all_correct", [1.0, 0.7, 0.9, 1.0], 2, [0.0] * 4),
    # k = 1 is GRPO with the population std: c/n = 1/4, sigma = sqrt(3)/4: A+ = (3/4)/sigma = sqrt(3), A- = -(1/4)/sigma
    ("k1_is_grpo", [1.0, 0.0, 0.0, 0.0], 1, [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]),
    # n = 3, one correct, k = 3 (k = n): rho = 1 -> 0
    ("k_equals_n", [0.0, 0.0, 1.0], 3, [0.0] * 3),
]


@pytest.mark.parametrize("case", REGIMES, ids=[c[0] for c in REGIMES])
def test_hand_regimes(case):
    _, scores, k, want = case
    got = pass_at_k_advantages(t(scores), len(scores), k).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)  # sigma + 1e-6


def test_without_std_scaling():
    """scale_by_std False: n = 4, one correct, k = 2 -> A+ = 1 - 1/2 = 1/2, A- = 1/2 - 2/3 = -1/6."""
    got = pass_at_k_advantages(t([0.0, 1.0, 0.0, 0.0]), 4, 2, scale_by_std=False).numpy()
    np.testing.assert_allclose(got, [-1 / 6, 1 / 2, -1 / 6, -1 / 6], rtol=1e-12)


def authors_calc_adv(val, k):
    """calc_adv of RUCAIBox/Passk_Training code/passk_adv.py (rewards exactly 1 or 0): rho = 1 -
    C(n-c,k)/C(n,k), sigma = sqrt(rho(1-rho)), A+ = (1-rho)/(sigma+1e-6), A- = (1-rho-C(n-c-1,k-1)/
    C(n-1,k-1))/(sigma+1e-6); written here with math.comb."""
    n, c = len(val), int(sum(val))
    rho = 1 - math.comb(n - c, k) / math.comb(n, k)
    sigma = math.sqrt(rho * (1 - rho))
    a_pos = (1 - rho) / (sigma + 1e-6)
    a_neg = (1 - rho - (math.comb(n - c - 1, k - 1) if n - c >= 1 else 0) / math.comb(n - 1, k - 1)) / (sigma + 1e-6)
    return [a_pos if v == 1 else a_neg for v in val]


def test_matches_the_authors_and_loop_versus_vectorised():
    """Random 0/1 groups of 8, several k: the vectorised advantages equal the authors' per-group
    calc_adv (a Python loop over groups)."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 2, size=12 * 8).astype("float64")
    for k in (1, 2, 4, 8):
        got = pass_at_k_advantages(t(scores), 8, k).numpy()
        want = [a for g in scores.reshape(12, 8) for a in authors_calc_adv(list(g), k)]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_registered_estimator_settings_garbage_and_no_mutation():
    """The `pass_at_k` entry scores rows by their masked reward sums (garbage outside the mask
    is ignored), broadcasts onto the response tokens, reads pass_k / pass_k_threshold, refuses
    other settings and k > group size; inputs are not written into."""
    est = get_adv_estimator("pass_at_k")
    assert est.per_group and not est.needs_critic and not est.whitens and est.settings == {"pass_k": 4,
                                                                                          "pass_k_threshold": 0.5}
    assert all(e.settings == {} for n, e in ADV_ESTIMATORS.items() if n not in ("pass_at_k", "vapo"))
    mask = np.array([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0]], "float64")
    rewards = np.zeros((4, 4))
    rewards[0, 2] = rewards[2, 3] = 1.0  # two correct of four
    r, m = t(np.where(mask == 1, rewards, 1e6)), t(mask)
    copies = (r.numpy().copy(), m.numpy().copy())
    adv, ret = est(r, m, group_size=4, pass_k=2)
    np.testing.assert_array_equal(r.numpy(), copies[0])
    np.testing.assert_array_equal(m.numpy(), copies[1])
    per_row = pass_at_k_advantages(t([1.0, 0.0, 1.0, 0.0]), 4, 2).numpy()
    np.testing.assert_allclose(adv.numpy(), per_row[:, None] * mask, rtol=1e-12)
    assert ret is None and adv.stop_gradient
    adv_hi, _ = est(t(rewards * 0.4), m, group_size=4, pass_k=2, pass_k_threshold=0.3)
    np.testing.assert_allclose(adv_hi.numpy(), adv.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="takes no"):
        est(t(rewards), m, group_size=4, k=2)
    with pytest.raises(ValueError, match="k <= group_size"):
        est(t(rewards), m, group_size=4, pass_k=5)
    with pytest.raises(ValueError, match="takes no"):
        get_adv_estimator("grpo")(t(rewards), m, group_size=4, pass_k=2)

    class Args:
        pass_k, pass_k_threshold, rollout_n = 2, 0.3, 4

    assert est.settings_from(Args) == {"pass_k": 2, "pass_k_threshold": 0.3}
    assert get_adv_estimator("grpo").settings_from(Args) == {}


def test_float32():
    got = pass_at_k_advantages(t([0, 1, 0, 0, 1, 1, 0, 1], "float32"), 4, 2)
    assert got.dtype == paddle.float32 and np.isfinite(got.numpy()).all()
