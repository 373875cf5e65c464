"""pass@k, maj@k and mean@k (ppo/evaluation/metrics.py) against exact combinatorics."""
import itertools
from fractions import Fraction
from math import comb

import pytest

from ppo.evaluation.metrics import default_ks, majority_correct, pass_at_k, sampled_metrics


def closed_form(n, c, k):
    """1 - C(n - c, k) / C(n, k) in exact arithmetic (Chen et al. 2021, eq. 1)."""
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def enumerated(n, c, k):
    """The fraction of the k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_closed_form_and_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            exact = closed_form(n, c, k)
            assert exact == enumerated(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_values_and_large_n():
    """n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7; pass@1 = c/n; stable where C(n, k) overflows floats."""
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    assert pass_at_k(2000, 3, 1000) == pytest.approx(float(closed_form(2000, 3, 1000)), rel=1e-12)
    for bad in ((4, 5, 1), (4, 1, 0), (4, 1, 5)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_majority_vote():
    assert majority_correct(["3", "4", "3"], [True, False, True]) == 1.0
    assert majority_correct(["4", "3", "4"], [False, True, False]) == 0.0
    assert majority_correct(["3", "4"], [False, True]) == 0.0  # a tie goes to the first seen
    assert majority_correct([None, None, "4"], [False, False, True]) == 1.0  # no answer, no vote
    assert majority_correct([None, None], [False, False]) == 0.0


def test_sampled_metrics_table():
    """Prompt 1: 1 of 4 correct, answers a,b,b,c (majority b, wrong); prompt 2: 4 of 4 correct."""
    correct = [[True, False, False, False], [True] * 4]
    answers = [["a", "b", "b", "c"], ["x"] * 4]
    m = sampled_metrics(correct, answers)
    assert default_ks(4) == [1, 2, 4] and default_ks(6) == [1, 2, 4, 6] and default_ks(1) == [1]
    assert m["pass@1"] == pytest.approx((0.25 + 1) / 2)
    assert m["pass@2"] == pytest.approx((float(closed_form(4, 1, 2)) + 1) / 2)
    assert m["pass@4"] == 1.0 and m["maj@4"] == 0.5 and m["mean@4"] == pytest.approx(0.625)
    with pytest.raises(ValueError, match="same number"):
        sampled_metrics([[True], [True, False]], [["a"], ["a", "b"]])
