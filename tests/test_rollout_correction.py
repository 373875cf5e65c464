"""Rollout/training mismatch (ppo.algos.rollout_correction): the diagnostics and the truncated
(TIS) / masked (MIS) importance weights by hand per regime, against verl's rollout_corr_helper
and TRL's vLLM importance sampling, loop versus vectorised, garbage, no mutation, and how the
weights enter the policy loss (equal log-probs leave every loss unchanged to the bit)."""
import math

import numpy as np
import paddle
import pytest

from ppo.algos import POLICY_LOSSES, get_policy_loss, rollout_correction, rollout_is_weights, rollout_mismatch_metrics


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def num(stats):
    return {k: float(v) for k, v in stats.items()}


def batch(seed, B=6, T=12, scale=0.3):
    rng = np.random.default_rng(seed)
    old = rng.normal(scale=0.8, size=(B, T)) - 1.5
    rollout = old + rng.normal(scale=scale, size=(B, T))
    mask = (rng.random((B, T)) > 0.3).astype("float64")
    mask[2] = 0
    return old, rollout, mask


# ------------------------------------------------------------------ diagnostics

def test_mismatch_metrics_hand_cases():
    """Row 0: |d| = [0.5, 0.5], equal row means -> ratio 1; row 1: old [-1, -1], rollout [-2, -2]:
    |d| = 1, 1, PPL_train / PPL_rollout = exp(-2 - (-1)) = e^-1; row 2 empty (left out).
    mean |d| = (0.5 + 0.5 + 1 + 1) / 4 = 0.75, max 1, ppl_ratio = (1 + e^-1) / 2."""
    old = [[-1.0, -2.0], [-1.0, -1.0], [5.0, 5.0]]
    rollout = [[-1.5, -1.5], [-2.0, -2.0], [-9.0, 9.0]]
    got = num(rollout_mismatch_metrics(t(old), t(rollout), t([[1, 1], [1, 1], [0, 0]])))
    assert got == pytest.approx({"rollout/logprob_diff_mean": 0.75, "rollout/logprob_diff_max": 1.0,
                                 "rollout/ppl_ratio": (1 + math.exp(-1)) / 2}, rel=1e-12)
    same = num(rollout_mismatch_metrics(t(old), t(old), t([[1, 1], [1, 1], [0, 0]])))
    assert same == {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0, "rollout/ppl_ratio": 1.0}
    empty = num(rollout_mismatch_metrics(t(old), t(rollout), t([[0, 0], [0, 0], [0, 0]])))
    assert empty == {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0, "rollout/ppl_ratio": 0.0}


def test_mismatch_metrics_match_trl_and_verl():
    """TRL grpo_trainer.py:2779-2790: mean / max of |old - sampling| over the mask; verl
    rollout_corr_helper.py:905-921: ppl_ratio = mean over rows of exp(mean rollout - mean old)
    (all rows; here none is empty). Written in numpy from those definitions."""
    old, rollout, mask = batch(1)
    mask[2, 0] = 1
    real = mask == 1
    d = np.abs(old - rollout)[real]
    rows = (rollout * mask).sum(-1) / mask.sum(-1) - (old * mask).sum(-1) / mask.sum(-1)
    got = num(rollout_mismatch_metrics(t(old), t(rollout), t(mask)))
    assert got == pytest.approx({"rollout/logprob_diff_mean": d.mean(), "rollout/logprob_diff_max": d.max(),
                                 "rollout/ppl_ratio": np.exp(rows).mean()}, rel=1e-12)


# ------------------------------------------------------------------ weights

def test_token_weights_regimes():
    """C = 2, bounds [0.5, 3]: w = 1.5 kept; 2.5 truncated to 2; 4 and 0.4 masked to 0; 1 kept;
    the sixth token is padding. mean (1.5 + 2 + 0 + 0 + 1) / 5 = 0.9; 1/5 truncated, 2/5 masked."""
    w_true = [1.5, 2.5, 4.0, 0.4, 1.0, 7.0]
    old = [[math.log(w) for w in w_true]]
    w, stats = rollout_is_weights(t(old), t([[0.0] * 6]), t([[1, 1, 1, 1, 1, 0]]), "token", 2.0, 0.5, 3.0)
    np.testing.assert_allclose(w.numpy(), [[1.5, 2.0, 0.0, 0.0, 1.0, 0.0]], rtol=1e-12)
    assert w.stop_gradient
    assert num(stats) == pytest.approx({"rollout/is_weight_mean": 0.9, "rollout/is_weight_max": 2.0,
                                        "rollout/is_weight_min": 0.0, "rollout/is_truncated_frac": 0.2,
                                        "rollout/is_masked_frac": 0.4}, rel=1e-12)


def test_sequence_weights_regimes():
    """Row 0 log-diffs [0.3, 0.4] -> w = e^0.7 = 2.014 on both tokens: kept with C = 2.1,
    truncated to 2 with C = 2, masked to 0 with upper 1.5. Row 1: [0.1, -0.1] -> w = 1.
    Fractions are over the 2 non-empty rows (the third is empty)."""
    old, rollout, mask = [[0.3, 0.4], [0.1, -0.1], [3.0, 3.0]], [[0.0, 0.0]] * 3, [[1, 1], [1, 1], [0, 0]]
    w, st = rollout_is_weights(t(old), t(rollout), t(mask), "sequence", 2.1)
    np.testing.assert_allclose(w.numpy(), [[math.exp(0.7)] * 2, [1.0, 1.0], [0, 0]], rtol=1e-12)
    assert float(st["rollout/is_truncated_frac"]) == 0.0
    w, st = rollout_is_weights(t(old), t(rollout), t(mask), "sequence", 2.0)
    np.testing.assert_allclose(w.numpy(), [[2.0, 2.0], [1.0, 1.0], [0, 0]], rtol=1e-12)
    assert float(st["rollout/is_truncated_frac"]) == 0.5
    w, st = rollout_is_weights(t(old), t(rollout), t(mask), "sequence", None, None, 1.5)
    np.testing.assert_allclose(w.numpy(), [[0.0, 0.0], [1.0, 1.0], [0, 0]], rtol=1e-12)
    assert float(st["rollout/is_masked_frac"]) == 0.5 and float(st["rollout/is_truncated_frac"]) == 0.0


def reference_weights(old, rollout, mask, level, threshold=None, lower=None, upper=None):
    """verl's compute_rollout_correction_weights (rollout_corr_helper.py:481-598: exp of the
    [-20, 20]-clamped token or summed log-ratio, times the mask, clamped at the threshold) and
    TRL's vllm importance sampling (grpo_trainer.py:2579-2623: the *_mask modes zero a ratio
    outside [clip_min, clip_max]); numpy, written from their definitions."""
    d = (old - rollout) * mask
    if level == "sequence":
        d = np.repeat(d.sum(-1, keepdims=True), d.shape[1], axis=1)
    raw = np.exp(d)
    keep = np.ones_like(raw, bool)
    if lower is not None:
        keep &= raw >= lower
    if upper is not None:
        keep &= raw <= upper
    w = np.exp(np.clip(d, -20, 20)) * mask
    if threshold is not None:
        w = np.minimum(w, threshold)
    return np.where(keep, w, 0.0)


CASES = [("token", 2.0, None, None), ("sequence", 2.0, None, None), ("token", None, 0.8, 1.25),
         ("sequence", None, 0.5, 2.0), ("token", 1.2, 0.9, 1.5), ("sequence", 5.0, None, 3.0)]


@pytest.mark.parametrize("level,threshold,lower,upper", CASES)
def test_weights_match_verl_and_trl(level, threshold, lower, upper):
    """TIS (threshold only) is verl's rollout_is token / sequence and TRL's *_truncate with clip_min
    None; MIS (bounds only) is TRL's token_mask / sequence_mask; both at once compose them."""
    old, rollout, mask = batch(2)
    w, stats = rollout_is_weights(t(old), t(rollout), t(mask), level, threshold, lower, upper)
    want = reference_weights(old, rollout, mask, level, threshold, lower, upper)
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-12, atol=0)
    real = mask == 1
    assert float(stats["rollout/is_weight_mean"]) == pytest.approx(want[real].mean(), rel=1e-12)
    assert float(stats["rollout/is_weight_max"]) == pytest.approx(want[real].max(), rel=1e-12)
    assert float(stats["rollout/is_weight_min"]) == pytest.approx(want[real].min(), rel=1e-12, abs=0)


def loop_weights(old, rollout, mask, level, threshold, lower, upper):
    """The same weights with one Python loop per row and token."""
    out = np.zeros_like(old)
    for b in range(old.shape[0]):
        idx = [j for j in range(old.shape[1]) if mask[b, j]]
        seq = sum(old[b, j] - rollout[b, j] for j in idx)
        for j in idx:
            lw = seq if level == "sequence" else old[b, j] - rollout[b, j]
            w = math.exp(lw)
            if (lower is not None and w < lower) or (upper is not None and w > upper):
                continue
            out[b, j] = min(w, threshold) if threshold is not None else w
    return out


@pytest.mark.parametrize("level,threshold,lower,upper", CASES)
def test_loop_versus_vectorised(level, threshold, lower, upper):
    old, rollout, mask = batch(3, scale=0.2)
    w, _ = rollout_is_weights(t(old), t(rollout), t(mask), level, threshold, lower, upper)
    np.testing.assert_allclose(w.numpy(), loop_weights(old, rollout, mask, level, threshold, lower, upper), rtol=1e-12)


def test_garbage_and_no_mutation():
    old, rollout, mask = batch(4)
    args = [t(old), t(rollout), t(mask)]
    copies = [a.numpy().copy() for a in args]
    w, stats = rollout_correction(*args, rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_lower=0.1)
    for a, c in zip(args, copies):
        np.testing.assert_array_equal(a.numpy(), c)
    g = lambda a, v: np.where(mask == 1, a, v)  # noqa: E731
    w_g, stats_g = rollout_correction(t(g(old, 1e4)), t(g(rollout, -1e4)), t(mask), rollout_is="sequence",
                                      rollout_is_threshold=2.0, rollout_is_lower=0.1)
    np.testing.assert_array_equal(w_g.numpy(), w.numpy())
    assert num(stats_g) == num(stats)


def test_none_and_bad_arguments():
    old, rollout, mask = batch(5)
    w, stats = rollout_correction(t(old), t(rollout), t(mask))
    assert w is None and set(stats) == {"rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/ppl_ratio"}
    for bad in (dict(rollout_is="seq"), dict(rollout_is="token", rollout_is_threshold=0.0),
                dict(rollout_is="token", rollout_is_lower=2.0, rollout_is_upper=1.0)):
        with pytest.raises(ValueError):
            rollout_correction(t(old), t(rollout), t(mask), **bad)


# ------------------------------------------------------------------ in the policy loss

def uniforms_for(name, shape):
    return {"uniforms": t(np.random.default_rng(0).random(shape))} if POLICY_LOSSES[name].random else {}


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_equal_logprobs_leave_every_loss_unchanged(name, level):
    """When the rollout engine's log-probs equal the training forward's, every weight is exactly 1
    (TIS and MIS alike) and the corrected loss and gradient equal the on-policy ones to the bit."""
    rng = np.random.default_rng(6)
    old, _, mask = batch(6)
    lp, adv = old + rng.normal(scale=0.2, size=old.shape), rng.normal(size=old.shape)
    w, stats = rollout_correction(t(old), t(old), t(mask), rollout_is=level, rollout_is_threshold=2.0,
                                  rollout_is_lower=0.5, rollout_is_upper=1.5)
    assert (w.numpy()[mask == 1] == 1.0).all() and float(stats["rollout/logprob_diff_max"]) == 0.0
    results = []
    for weights in (None, w):
        x = t(lp)
        x.stop_gradient = False
        loss, _ = get_policy_loss(name)(x, t(old), t(adv), t(mask), rollout_is_weights=weights, **uniforms_for(name, old.shape))
        loss.backward()
        results.append((loss.numpy().tobytes(), x.grad.numpy().tobytes()))
    assert results[0] == results[1]


def test_weights_multiply_each_token_loss_and_gradient():
    """ppo_clip, token TIS: the corrected loss is sum_t w_t l_t / N and each token's gradient is
    w_t times its uncorrected gradient (the weights carry no gradient)."""
    old, rollout, mask = batch(7)
    rng = np.random.default_rng(7)
    lp, adv = old + rng.normal(scale=0.2, size=old.shape), rng.normal(size=old.shape)
    w, _ = rollout_is_weights(t(old), t(rollout), t(mask), "token", 1.5)
    grads, losses = [], []
    for weights in (None, w):
        x = t(lp)
        x.stop_gradient = False
        loss, _ = get_policy_loss("ppo_clip")(x, t(old), t(adv), t(mask), rollout_is_weights=weights,
                                              loss_agg_mode="seq-mean-token-sum")
        loss.backward()
        grads.append(x.grad.numpy())
        losses.append(float(loss))
    np.testing.assert_allclose(grads[1], grads[0] * w.numpy(), rtol=1e-12, atol=1e-15)
    assert w.numpy()[mask == 1].min() < 1 < w.numpy().max() and losses[0] != losses[1]


def test_float32():
    old, rollout, mask = batch(8)
    w, stats = rollout_correction(t(old, "float32"), t(rollout, "float32"), t(mask, "float32"), rollout_is="token",
                                  rollout_is_lower=0.2, rollout_is_upper=5.0)
    assert w.dtype == paddle.float32 and all(v.dtype == paddle.float32 for v in stats.values())
    assert np.isfinite(w.numpy()).all() and all(np.isfinite(float(v)) for v in stats.values())


def test_bounds_are_inclusive_and_read_the_raw_weight():
    """MIS keeps `lower <= w <= upper`, on the weight before the [-20, 20] clamp of exp:
    token level, old = rollout = -1 (w = 1) with bounds [0.5, 1.0] keeps weight 1.0 (the upper
    bound itself is inside); old 25, rollout 0 (w = e^25 = 7.2e10, clamped e^20 = 4.9e8) with
    upper 1e10 is masked: weight 0, masked fraction 1."""
    w, stats = rollout_is_weights(t([[-1.0]]), t([[-1.0]]), t([[1]]), "token", None, 0.5, 1.0)
    assert w.numpy().tolist() == [[1.0]] and float(stats["rollout/is_masked_frac"]) == 0.0
    w, stats = rollout_is_weights(t([[-1.0]]), t([[-1.0]]), t([[1]]), "token", None, 1.0, 2.0)
    assert w.numpy().tolist() == [[1.0]]  # the lower bound is inside too
    w, stats = rollout_is_weights(t([[25.0]]), t([[0.0]]), t([[1]]), "token", None, None, 1e10)
    assert w.numpy().tolist() == [[0.0]] and float(stats["rollout/is_masked_frac"]) == 1.0


def test_sequence_level_fractions_count_rows_not_tokens():
    """Sequence level, rows of 3 and 1 real tokens, rollout 0: row 0's weight e^0.8 = 2.23 is
    truncated at 2, row 1's e^0.1 is not: 1 row of 2 (0.5; over tokens it would be 3 / 4).
    With upper 2 instead, row 0 is masked: masked fraction 0.5 too."""
    old, rollout, mask = [[0.8, 0.0, 0.0], [0.1, 0.0, 0.0]], [[0.0] * 3] * 2, [[1, 1, 1], [1, 0, 0]]
    _, stats = rollout_is_weights(t(old), t(rollout), t(mask), "sequence", 2.0)
    assert float(stats["rollout/is_truncated_frac"]) == 0.5 and float(stats["rollout/is_masked_frac"]) == 0.0
    _, stats = rollout_is_weights(t(old), t(rollout), t(mask), "sequence", None, None, 2.0)
    assert float(stats["rollout/is_masked_frac"]) == 0.5 and float(stats["rollout/is_truncated_frac"]) == 0.0
