"""Sampling frequencies of the rollout sampler (custom op and pure-Paddle fallback) match the
target distribution: softmax(logits / T), truncated to the top-k, then to the top-p nucleus
(smallest prefix of the sorted, renormalised distribution whose mass before each kept token is
< top_p), renormalised. Chi-square goodness of fit on 20000 draws with a fixed seed; tokens
outside the support must never appear."""
import numpy as np
import paddle
import pytest
from scipy.stats import chisquare

from tests.rollout_ops_helpers import custom_and_fallback_ops

LOGITS = np.array([2.0, 1.5, 1.4, 0.3, 0.0, -0.5, -1.0, 3.0], "float32")
N_DRAWS = 20000


@pytest.fixture(scope="module")
def rollout_ops():
    return custom_and_fallback_ops()


def target_distribution(logits, temperature, top_k, top_p, penalty=1.0, seen=()):
    x = logits.astype("float64").copy()
    for t in seen:
        x[t] = x[t] / penalty if x[t] > 0 else x[t] * penalty
    p = np.exp(x / temperature - (x / temperature).max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, dtype=bool)
    k = top_k if 0 < top_k < len(p) else len(p)
    keep[order[:k]] = True
    q = np.where(keep, p, 0)
    q /= q.sum()
    if top_p < 1.0:
        before = np.cumsum(q[order]) - q[order]
        nucleus = np.zeros_like(keep)
        nucleus[order[(before < top_p) & keep[order]]] = True
        nucleus[order[0]] = True
        q = np.where(nucleus, q, 0)
        q /= q.sum()
    return q


@pytest.mark.parametrize("impl", ["custom", "paddle"])
@pytest.mark.parametrize("temperature,top_k,top_p,penalty", [
    (1.0, 0, 1.0, 1.0),
    (0.8, 4, 1.0, 1.0),
    (1.0, 0, 0.7, 1.0),
    (1.3, 5, 0.8, 1.0),
    (0.9, 0, 1.0, 2.0),
])
def test_sampling_frequencies_match_target(rollout_ops, impl, temperature, top_k, top_p, penalty):
    ops = rollout_ops[0] if impl == "custom" else rollout_ops[1]
    V = len(LOGITS)
    seen = (7, 3)  # tokens already present (repetition penalty)
    logits = paddle.to_tensor(np.tile(LOGITS, (N_DRAWS, 1)))
    presence = np.zeros((N_DRAWS, V), "uint8")
    presence[:, list(seen)] = 1
    rng = np.random.default_rng(1234)
    uniforms = paddle.to_tensor(np.minimum(rng.random((1, N_DRAWS), dtype=np.float32), 1 - 2 ** -20))
    tok, lp = ops.sample(logits, paddle.to_tensor(presence), paddle.arange(N_DRAWS, dtype="int64"), uniforms,
                         paddle.zeros([N_DRAWS], "int32"), 0, temperature, top_k, top_p, penalty, True, 3, [])
    counts = np.bincount(tok.numpy(), minlength=V)
    q = target_distribution(LOGITS, temperature, top_k, top_p, penalty, seen if penalty != 1.0 else ())
    support = q > 0
    assert counts[~support].sum() == 0, f"sampled outside the support: {counts}, target {q}"
    stat, pvalue = chisquare(counts[support], q[support] * N_DRAWS)
    assert pvalue > 0.001, f"chi-square p={pvalue:.2e}: counts {counts}, expected {np.round(q * N_DRAWS)}"
    if top_k:
        assert support.sum() <= top_k


def test_greedy_flag_ignores_uniforms(rollout_ops):
    for ops in rollout_ops:
        logits = paddle.to_tensor(np.tile(LOGITS, (5, 1)))
        tok, _ = ops.sample(logits, paddle.zeros([1, 1], "uint8"), paddle.arange(5, dtype="int64"),
                            paddle.rand([1, 5]), paddle.zeros([5], "int32"), 0, 1.0, 0, 1.0, 1.0, False, 3, [])
        np.testing.assert_array_equal(tok.numpy(), 7)
