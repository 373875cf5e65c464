"""Clip-Cov / KL-Cov (ppo.algos.covariance_losses) and token selection (ppo.algos.token_selection):
hand-derived cases per regime, the authors' selection rules (PRIME-RL/Entropy-Mechanism-of-RL,
verl, Beyond-the-80-20-Rule-RLVR), loop versus vectorised, garbage and no-mutation checks."""
import math
from fractions import Fraction

import numpy as np
import paddle
import pytest

from ppo.algos import (
    clip_cov_token_losses,
    count_from_fraction,
    high_entropy_mask,
    kl_cov_token_losses,
    token_covariance,
    top_k_mask,
)


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def leaf(a):
    x = t(a)
    x.stop_gradient = False
    return x


def batch(seed, B=6, T=40):
    rng = np.random.default_rng(seed)
    lp = rng.normal(scale=1.0, size=(B, T)) - 2.0
    old = lp + rng.normal(scale=0.3, size=(B, T))
    adv = rng.normal(scale=2.0, size=(B, T))
    mask = (rng.random((B, T)) > 0.25).astype("float64")
    return lp, old, adv, mask, rng.random((B, T))


# ------------------------------------------------------------------ selection helpers

def test_top_k_mask_hand_cases():
    """Scores [[1, 3], [3, 2]]: k = 2 takes both 3s (ties: row-major order); with [0, 1]
    ineligible the 3 at [1, 0] and the 2 go; k larger than the eligible count takes them all."""
    s = t([[1.0, 3.0], [3.0, 2.0]])
    all_ = t([[1, 1], [1, 1]]) != 0
    assert top_k_mask(s, all_, 2).numpy().tolist() == [[False, True], [True, False]]
    assert top_k_mask(s, all_, 1).numpy().tolist() == [[False, True], [False, False]]
    some = t([[1, 0], [1, 1]]) != 0
    assert top_k_mask(s, some, 2).numpy().tolist() == [[False, False], [True, True]]
    assert top_k_mask(s, some, 9).numpy().tolist() == [[True, False], [True, True]]
    assert top_k_mask(s, some, paddle.to_tensor(0.0, "float64")).numpy().sum() == 0


def test_top_k_mask_loop_versus_vectorised():
    """Random scores with ties (rounded to 1 decimal), random eligibility, several k: the mask is
    the first k eligible indices sorted by (-score, index) in a plain Python sort."""
    rng = np.random.default_rng(0)
    score = np.round(rng.normal(size=(5, 13)), 1)
    eligible = rng.random((5, 13)) > 0.4
    for k in (0, 1, 3, 17, 100):
        got = top_k_mask(t(score), t(eligible.astype("float64")) != 0, k).numpy()
        flat = sorted((i for i in range(score.size) if eligible.reshape(-1)[i]), key=lambda i: (-score.reshape(-1)[i], i))
        want = np.zeros(score.size, bool)
        want[flat[:k]] = True
        np.testing.assert_array_equal(got, want.reshape(score.shape))


@pytest.mark.parametrize("n,frac,up,want", [(7, 0.2, False, 1), (7, 0.2, True, 2), (10, 0.3, True, 3), (10, 0.3, False, 3),
                                            (5000, 2e-4, False, 1), (3, 2e-4, False, 1), (0, 0.5, True, 0)])
def test_count_from_fraction(n, frac, up, want):
    """max(1, floor(frac N)) (verl's Clip-Cov / KL-Cov count) or max(1, floor(frac N + 0.9999))
    (the Beyond-80/20 authors' ceiling: 0.3 * 10 = 3.0000000000000004 stays 3); 0 tokens -> 0."""
    mask = t([[1.0] * n + [0.0] * 3])
    assert float(count_from_fraction(mask, frac, round_up=up)) == want


def test_high_entropy_mask_hand_cases():
    """[0.1, 0.9, 0.5, 0.7], top half -> the 0.9 and the 0.7; masking the 0.9 out leaves N = 3,
    k = ceil(1.5) = 2: the 0.7 and the 0.5."""
    ent = t([[0.1, 0.9, 0.5, 0.7]])
    assert high_entropy_mask(ent, t([[1, 1, 1, 1]]), 0.5).numpy().tolist() == [[0, 1, 0, 1]]
    assert high_entropy_mask(ent, t([[1, 0, 1, 1]]), 0.5).numpy().tolist() == [[0, 0, 1, 1]]
    assert high_entropy_mask(ent, t([[0, 0, 0, 0]]), 0.5).numpy().sum() == 0
    with pytest.raises(ValueError):
        high_entropy_mask(ent, t([[1, 1, 1, 1]]), 0.0)


def authors_entropy_mask(ent, mask, ratio):
    """get_global_entropy_top_mask of zhouxiangxin1998/Beyond-the-80-20-Rule-RLVR
    (verl/trainer/ppo/core_algos.py:53-86) as it behaves: top-k over the response tokens,
    k = max(1, int(N * ratio + 0.9999)); written here in numpy (no ties in random data)."""
    flat, idx = ent.reshape(-1), np.flatnonzero(mask.reshape(-1))
    k = max(1, int(len(idx) * ratio + 0.9999))
    out = np.zeros(flat.size)
    out[idx[np.argsort(-flat[idx], kind="stable")[:k]]] = 1
    return out.reshape(ent.shape)


@pytest.mark.parametrize("ratio", [0.05, 0.2, 0.3, 0.5, 0.77, 1.0])
def test_high_entropy_mask_matches_the_authors(ratio):
    _, _, _, mask, ent = batch(1)
    np.testing.assert_array_equal(high_entropy_mask(t(ent), t(mask), ratio).numpy(), authors_entropy_mask(ent, mask, ratio))


@pytest.mark.parametrize("n", [7, 10, 11, 13, 100, 333])
def test_trl_quantile_count_as_documented(n):
    """TRL's get_high_entropy_mask keeps the tokens at or above the (1 - frac) quantile (linear):
    1 + floor(frac (N - 1)) of N distinct entropies; ours keeps ceil(frac N); the two agree
    unless 0 < frac(frac N) < frac (the docstring's claim), e.g. N = 7, frac = 0.3: 2 vs 3."""
    ent = np.random.default_rng(n).random(n)
    for frac in (Fraction(1, 5), Fraction(3, 10), Fraction(1, 2)):
        trl = int((ent >= np.quantile(ent, 1 - float(frac))).sum())
        assert trl == 1 + math.floor(frac * (n - 1))
        ours = int(high_entropy_mask(t([ent]), t([np.ones(n)]), float(frac)).numpy().sum())
        assert ours == math.ceil(frac * n)
        part = frac * n - math.floor(frac * n)
        assert (ours == trl) == (part == 0 or part >= frac), (n, frac)


# ------------------------------------------------------------------ covariance

def test_token_covariance_hand_and_loop():
    """logp [-1, -3], A [2, 0]: means -2, 1 -> [(1)(1), (-1)(-1)] = [1, 1]; a masked third token is 0."""
    np.testing.assert_allclose(token_covariance(t([[-1.0, -3.0, 7.0]]), t([[2.0, 0.0, 9.0]]), t([[1, 1, 0]])).numpy(),
                               [[1.0, 1.0, 0.0]])
    lp, _, adv, mask, _ = batch(2)
    real = mask == 1
    want = np.where(real, (lp - lp[real].mean()) * (adv - adv[real].mean()), 0)
    np.testing.assert_allclose(token_covariance(t(lp), t(adv), t(mask)).numpy(), want, rtol=1e-12, atol=1e-14)


def test_clip_cov_hand_case():
    """logp [-1, -3, -2] = old, A [3, 0, 0]: cov [2, 1, 0]; only token 0 lies in (1, 5), n = 1:
    it is dropped (loss 0, gradient 0 instead of PPO's -3); the others' loss -A r = 0."""
    x = leaf([[-1.0, -3.0, -2.0]])
    tok, stats = clip_cov_token_losses(x, t([[-1.0, -3.0, -2.0]]), t([[3.0, 0.0, 0.0]]), t([[1, 1, 1]]),
                                       uniforms=t([[0.5, 0.1, 0.2]]))
    tok.sum().backward()
    np.testing.assert_allclose(tok.numpy(), [[0.0, 0.0, 0.0]], atol=0)
    np.testing.assert_allclose(x.grad.numpy(), [[0.0, 0.0, 0.0]], atol=0)
    assert float(stats["policy/cov_clipfrac_avg"]) == pytest.approx(1 / 3)
    # above the upper bound (cov 2 > ub 1.5) nothing is dropped: PPO's gradient -A r = -3 returns
    x2 = leaf([[-1.0, -3.0, -2.0]])
    tok2, stats2 = clip_cov_token_losses(x2, t([[-1.0, -3.0, -2.0]]), t([[3.0, 0.0, 0.0]]), t([[1, 1, 1]]),
                                         clip_cov_lb=0.5, clip_cov_ub=1.5, uniforms=t([[0.5, 0.1, 0.2]]))
    tok2.sum().backward()
    np.testing.assert_allclose(x2.grad.numpy(), [[-3.0, 0.0, 0.0]])
    assert float(stats2["policy/cov_clipfrac_avg"]) == pytest.approx(1 / 3)  # token 1 (cov 1) is the candidate


def clip_cov_reference(lp, old, adv, mask, ratio_c, lb, ub, eps=0.2):
    """What the authors' compute_policy_loss_clip_cov (PRIME-RL/Entropy-Mechanism-of-RL
    core_algos.py:469-518) and verl's (core_algos.py:1450-1552) compute, in numpy: the PPO
    token losses, the candidates (real, not clipped by PPO, lb < cov < ub) and the count
    max(int(ratio * N), 1) of them that torch.randperm drops."""
    r = np.exp(lp - old)
    pg1, pg2 = -adv * r, -adv * np.clip(r, 1 - eps, 1 + eps)
    real = mask == 1
    cov = (adv - adv[real].mean()) * (lp - lp[real].mean())
    cand = real & ~(pg2 > pg1) & (cov > lb) & (cov < ub)
    return np.maximum(pg1, pg2), cand, max(int(ratio_c * real.sum()), 1), pg2 > pg1


@pytest.mark.parametrize("ratio_c", [2e-4, 0.02, 0.2, 1.0])
def test_clip_cov_matches_the_authors(ratio_c):
    """Same candidates and count; the dropped tokens are the `count` candidates with the smallest
    uniforms (a uniformly random subset, as randperm's); every other token keeps PPO's loss."""
    lp, old, adv, mask, u = batch(3)
    ppo, cand, n, by_ppo = clip_cov_reference(lp, old, adv, mask, ratio_c, 1.0, 5.0)
    tok, stats = clip_cov_token_losses(t(lp), t(old), t(adv), t(mask), clip_cov_ratio=ratio_c, uniforms=t(u))
    tok = tok.numpy()
    dropped = (tok == 0) & (ppo != 0) & (mask == 1)
    assert cand.sum() > 5 and dropped.sum() == min(n, cand.sum())
    assert not (dropped & ~cand).any()
    chosen = np.flatnonzero(cand.reshape(-1))[np.argsort(u.reshape(-1)[cand.reshape(-1)], kind="stable")[:n]]
    assert set(np.flatnonzero(dropped.reshape(-1))) == set(chosen)
    np.testing.assert_allclose(tok[(mask == 1) & ~dropped], ppo[(mask == 1) & ~dropped], rtol=1e-12)
    assert float(stats["policy/clipfrac_avg"]) == pytest.approx(by_ppo[mask == 1].mean())
    assert float(stats["policy/cov_clipfrac_avg"]) == pytest.approx(dropped[mask == 1].mean())


def test_kl_cov_hand_case():
    """logp [-1, -3, -2], old [-1.5, -3, -2], A [3, 0, 0]: cov [2, 1, 0]; k = 1 picks token 0:
    L_0 = -3 e^0.5 + |0.5|, dL_0/dlogp = -3 e^0.5 + 1; the others -A r = 0, gradient 0."""
    x = leaf([[-1.0, -3.0, -2.0]])
    tok, stats = kl_cov_token_losses(x, t([[-1.5, -3.0, -2.0]]), t([[3.0, 0.0, 0.0]]), t([[1, 1, 1]]))
    tok.sum().backward()
    np.testing.assert_allclose(tok.numpy(), [[-3 * math.exp(0.5) + 0.5, 0.0, 0.0]], rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), [[-3 * math.exp(0.5) + 1.0, 0.0, 0.0]], rtol=1e-12)
    assert float(stats["policy/cov_klfrac_avg"]) == pytest.approx(1 / 3)
    # on-policy: the penalty is 0 in value and in (sub)gradient
    x2 = leaf([[-1.0, -3.0, -2.0]])
    tok2, _ = kl_cov_token_losses(x2, t([[-1.0, -3.0, -2.0]]), t([[3.0, 0.0, 0.0]]), t([[1, 1, 1]]))
    tok2.sum().backward()
    np.testing.assert_allclose(x2.grad.numpy(), [[-3.0, 0.0, 0.0]])


def kl_cov_reference(lp, old, adv, mask, ratio_k, coef):
    """The authors' compute_policy_loss_kl_cov (PRIME-RL/Entropy-Mechanism-of-RL core_algos.py:426-467,
    k_percent in percent) / verl's (core_algos.py:1555-1632, a fraction), in numpy: top
    max(1, int(N ratio)) covariances of the real tokens get -A r + coef |d|, the rest -A r."""
    d = lp - old
    out = -adv * np.exp(d)
    idx = np.flatnonzero(mask.reshape(-1) == 1)
    a, lpv = adv.reshape(-1)[idx], lp.reshape(-1)[idx]
    cov = (a - a.mean()) * (lpv - lpv.mean())
    top = idx[np.argsort(-cov, kind="stable")[:max(1, int(len(idx) * ratio_k))]]
    flat = out.reshape(-1)
    flat[top] += coef * np.abs(d.reshape(-1)[top])
    return flat.reshape(out.shape), top


@pytest.mark.parametrize("ratio_k,coef", [(2e-4, 1.0), (2e-3, 1.0), (0.05, 2.0), (0.5, 0.1)])
def test_kl_cov_matches_the_authors(ratio_k, coef):
    lp, old, adv, mask, _ = batch(4)
    want, top = kl_cov_reference(lp, old, adv, mask, ratio_k, coef)
    tok, stats = kl_cov_token_losses(t(lp), t(old), t(adv), t(mask), kl_cov_ratio=ratio_k, kl_cov_coef=coef)
    real = mask == 1
    np.testing.assert_allclose(tok.numpy()[real], want[real], rtol=1e-12)
    assert float(stats["policy/cov_klfrac_avg"]) == pytest.approx(len(top) / real.sum())


@pytest.mark.parametrize("fn", [clip_cov_token_losses, kl_cov_token_losses])
def test_covariance_losses_garbage_and_no_mutation(fn):
    lp, old, adv, mask, u = batch(5)
    kw = {"uniforms": t(u)} if fn is clip_cov_token_losses else {}
    kw_ratio = {"clip_cov_ratio": 0.05} if fn is clip_cov_token_losses else {"kl_cov_ratio": 0.05}
    args = [t(lp), t(old), t(adv), t(mask)]
    copies = [a.numpy().copy() for a in args]
    x = leaf(lp)
    tok, stats = fn(x, *args[1:], **kw, **kw_ratio)
    (tok * t(mask)).sum().backward()
    for a, c in zip(args, copies):
        np.testing.assert_array_equal(a.numpy(), c)
    g = lambda a, v: np.where(mask == 1, a, v)  # noqa: E731
    xg = leaf(g(lp, 1e3))
    tok_g, stats_g = fn(xg, t(g(old, -1e3)), t(g(adv, 1e6)), t(mask), **kw, **kw_ratio)
    (tok_g * t(mask)).sum().backward()
    np.testing.assert_array_equal(tok_g.numpy()[mask == 1], tok.numpy()[mask == 1])
    np.testing.assert_array_equal(xg.grad.numpy()[mask == 1], x.grad.numpy()[mask == 1])
    for k in stats:
        assert stats_g[k].numpy().tobytes() == stats[k].numpy().tobytes(), k


def test_clip_cov_without_uniforms_draws_a_random_subset_of_the_right_size():
    lp, old, adv, mask, _ = batch(6)
    _, cand, n, _ = clip_cov_reference(lp, old, adv, mask, 0.01, 1.0, 5.0)
    _, stats = clip_cov_token_losses(t(lp), t(old), t(adv), t(mask), clip_cov_ratio=0.01)
    assert float(stats["policy/cov_clipfrac_avg"]) == pytest.approx(min(n, cand.sum()) / mask.sum())
