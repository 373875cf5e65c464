"""Hand-derived tests of the RL recipes in ppo.algos: REINFORCE++-baseline, Dr.GRPO's
``seq-mean-token-sum-norm``, GSPO's sequence-level ratio, the k3 clamp, the entropy
bonus, DAPO's overlong penalty, TRL's truncated-completion mask, the adaptive KL
controller, and the REINFORCE++ return across mask holes."""
import numpy as np
import paddle
import pytest

from ppo.algos import (
    ADV_ESTIMATORS,
    AdaptiveKLController,
    aggregate_loss,
    entropy_bonus_loss,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    log1mexp,
    overlong_penalty,
    ppo_policy_loss,
    reinforce_pp_advantages_and_returns,
    reinforce_pp_baseline_advantages,
    truncated_completion_mask,
)


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


# ---------------------------------------------------------------- REINFORCE++-baseline
def test_reinforce_pp_baseline_hand_computed():
    """Scores [1, 3 | 2, 2], group size 2: centred [-1, 1 | 0, 0]. Masks give 2, 1, 1, 1
    tokens, so the token values are [-1, -1, 1, 0, 0] (5 tokens): mean -0.2,
    unbiased var = (0.64 + 0.64 + 1.44 + 0.04 + 0.04) / 4 = 0.7;
    A = (x + 0.2) / sqrt(0.7 + 1e-8)."""
    mask = t([[1, 1, 0], [0, 1, 0], [1, 0, 0], [0, 0, 1]])
    adv = reinforce_pp_baseline_advantages(t([1.0, 3.0, 2.0, 2.0]), mask, 2).numpy()
    k = 1 / np.sqrt(0.7 + 1e-8)
    expected = np.array([[-0.8 * k, -0.8 * k, 0], [0, 1.2 * k, 0], [0.2 * k, 0, 0], [0, 0, 0.2 * k]])
    np.testing.assert_allclose(adv, expected, rtol=1e-10)


def test_reinforce_pp_baseline_loop_garbage_and_no_mutation():
    rng = np.random.default_rng(3)
    B, T, n = 12, 6, 3
    scores = rng.normal(size=B)
    mask = (rng.random((B, T)) > 0.4).astype("float64")
    mask[:, 0] = 1
    x = np.repeat(scores.reshape(-1, n) - scores.reshape(-1, n).mean(1, keepdims=True), 1).reshape(-1)
    tok = np.repeat(x[:, None], T, 1)
    vals = tok[mask == 1]
    ref = np.where(mask == 1, (tok - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8), 0.0)
    s_t, m_t = t(scores), t(mask)
    out = reinforce_pp_baseline_advantages(s_t, m_t, n).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(s_t.numpy(), scores)
    np.testing.assert_array_equal(m_t.numpy(), mask)
    # through the registry, from token rewards (score at one token, garbage outside the mask)
    rewards = np.where(mask == 1, 0.0, np.nan)
    last = (mask * np.arange(T)).argmax(1)
    rewards[np.arange(B), last] = scores
    adv, ret = ADV_ESTIMATORS["reinforce_pp_baseline"](t(rewards), m_t, group_size=n)
    assert ret is None
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-9, atol=1e-12)


def test_reinforce_pp_baseline_equal_group_float32_is_zero_before_whitening():
    """Group [-1.3] * 6 in float32 has centred score exactly 0, so after whitening every
    token of that group holds -mean/std of the batch: all equal (not rounding noise)."""
    s = t([-1.3] * 6 + [0, 1, 2, 3, 4, 5], "float32")
    adv = reinforce_pp_baseline_advantages(s, paddle.ones([12, 2], dtype="float32"), 6).numpy()
    assert len(set(adv[:6].ravel().tolist())) == 1


# ---------------------------------------------------------------- REINFORCE++ across holes
def test_reinforce_pp_return_carries_across_interior_hole():
    """Rewards [0, 9, 0, 1] with mask [1, 0, 1, 1], gamma 0.5: the hole at t=1 is skipped:
    G3 = 1, G2 = 0 + 0.5 * 1 = 0.5, G0 = 0 + 0.5 * G2 = 0.25 (verl would reset: G0 = 0)."""
    _, ret = reinforce_pp_advantages_and_returns(t([[0.0, 9.0, 0.0, 1.0]]), t([[1, 0, 1, 1]]), gamma=0.5)
    np.testing.assert_allclose(ret.numpy(), [[0.25, 0.0, 0.5, 1.0]])


# ---------------------------------------------------------------- Dr.GRPO aggregation
def test_seq_mean_token_sum_norm_hand_computed_and_errors():
    """losses [[1, 2, 0], [3, 0, 0], [5, 5, 5]], mask [[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    L = 4: (3 + 3) / (2 non-empty rows * 4) = 0.75; with num_seqs = 3: 6 / 12 = 0.5."""
    loss, mask = t([[1, 2, 0], [3, 0, 0], [5, 5, 5]]), t([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_allclose(float(aggregate_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=4)), 0.75)
    np.testing.assert_allclose(
        float(aggregate_loss(loss, mask, "seq-mean-token-sum-norm", num_seqs=3, loss_scale_factor=4)), 0.5)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        aggregate_loss(loss, mask, "seq-mean-token-sum-norm")


def test_seq_mean_token_sum_norm_split_equals_full_batch():
    """Summing the micro-batch losses with the global num_seqs equals the full-batch loss."""
    rng = np.random.default_rng(1)
    loss, mask = rng.normal(size=(8, 5)), (rng.random((8, 5)) > 0.3).astype("float64")
    full = float(aggregate_loss(t(loss), t(mask), "seq-mean-token-sum-norm", loss_scale_factor=7))
    S = float((mask.sum(1) > 0).sum())
    parts = sum(float(aggregate_loss(t(loss[i:i + 3]), t(mask[i:i + 3]), "seq-mean-token-sum-norm", num_seqs=S,
                                     loss_scale_factor=7)) for i in range(0, 8, 3))
    np.testing.assert_allclose(parts, full, rtol=1e-12)
    np.testing.assert_allclose(full, (loss * mask).sum() / (S * 7), rtol=1e-12)


# ---------------------------------------------------------------- GSPO
def test_gspo_sequence_ratio_hand_computed():
    """Log-ratios [0.2, -0.1, (0.5 masked)] -> s = exp(0.05) on both real tokens; A = 1,
    clip 0.2: s = 1.0513 inside [0.8, 1.2] so L_t = -s; token-mean loss = -exp(0.05).
    Gradient: dL/dlogp_t = -s / 2 for each real token (the sequence ratio's gradient
    s * d(logp_t - sg(logp_t)) spread by the token mean), 0 for the masked one."""
    lp = t([[0.2, -0.1, 0.5]])
    lp.stop_gradient = False
    loss, stats = ppo_policy_loss(lp, t([[0.0, 0.0, 0.0]]), t([[1.0, 1.0, 1.0]]), t([[1, 1, 0]]),
                                  importance_sampling_level="sequence")
    s = np.exp(0.05)
    np.testing.assert_allclose(float(loss), -s, rtol=1e-12)
    np.testing.assert_allclose(float(stats["val/ratio"]), s, rtol=1e-12)
    loss.backward()
    np.testing.assert_allclose(lp.grad.numpy(), [[-s / 2, -s / 2, 0.0]], rtol=1e-12)


def test_gspo_clips_whole_sequence_and_loop_reference():
    """Log-ratios [0.4, 0.4] -> s = e^0.4 = 1.49 > 1.2 with A = 1: clipped for both tokens
    (clipfrac 1, no gradient), while token level would also clip; log-ratios [0.6, -0.4]
    (mean 0.1, s = 1.105) are NOT clipped at sequence level though token 0 is at token level."""
    loss, st = ppo_policy_loss(t([[0.4, 0.4]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[1, 1]]),
                               importance_sampling_level="sequence")
    np.testing.assert_allclose(float(loss), -1.2, rtol=1e-12)
    assert float(st["policy/clipfrac_avg"]) == 1.0
    _, st2 = ppo_policy_loss(t([[0.6, -0.4]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[1, 1]]),
                             importance_sampling_level="sequence")
    assert float(st2["policy/clipfrac_avg"]) == 0.0
    _, st3 = ppo_policy_loss(t([[0.6, -0.4]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[1, 1]]))
    assert float(st3["policy/clipfrac_avg"]) == 0.5
    # random batch against a numpy loop, with garbage outside the mask
    rng = np.random.default_rng(5)
    lp, old, adv = rng.normal(size=(6, 4)) * 0.3, rng.normal(size=(6, 4)) * 0.3, rng.normal(size=(6, 4))
    mask = (rng.random((6, 4)) > 0.3).astype("float64")
    mask[:, 0] = 1
    ref = np.zeros((6, 4))
    for b in range(6):
        idx = mask[b] == 1
        s = np.exp(min((lp[b, idx] - old[b, idx]).mean(), 10.0))
        ref[b] = np.maximum(-adv[b] * s, -adv[b] * np.clip(s, 0.8, 1.2))
    expected = (ref * mask).sum() / mask.sum()
    garbage = np.where(mask == 1, lp, np.nan)
    loss, _ = ppo_policy_loss(t(garbage), t(np.where(mask == 1, old, 1e30)), t(adv), t(mask),
                              importance_sampling_level="sequence")
    np.testing.assert_allclose(float(loss), expected, rtol=1e-10)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        ppo_policy_loss(t(lp), t(old), t(adv), t(mask), importance_sampling_level="seq")


# ---------------------------------------------------------------- k3 clamp
def test_k3_clamp_hand_computed():
    """d = logp - ref = -3: k3 = e^3 - 3 - 1 = 16.0855; clamp 10 -> 10. d = 0.5:
    k3 = e^-0.5 + 0.5 - 1 = 0.1065 (inside, unchanged). k1 with a clamp is refused."""
    lp, ref = t([[-3.0, 0.5]]), t([[0.0, 0.0]])
    np.testing.assert_allclose(kl_penalty(lp, ref, "k3").numpy(), [[np.exp(3) - 4, np.exp(-0.5) - 0.5]], rtol=1e-12)
    np.testing.assert_allclose(kl_penalty(lp, ref, "low_var_kl", clamp=10).numpy(), [[10.0, np.exp(-0.5) - 0.5]],
                               rtol=1e-12)
    loss, _ = kl_loss(lp, ref, t([[1, 1]]), kind="k3", clamp=10)
    np.testing.assert_allclose(float(loss), (10 + np.exp(-0.5) - 0.5) / 2, rtol=1e-12)
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(lp, ref, "k1", clamp=10)


def test_k3_clamp_survives_extreme_log_ratio_float32():
    """d = -100 overflows exp in float32 (inf) unclamped; clamped: exp(20) - 21 -> 10."""
    lp, ref = t([[-100.0]], "float32"), t([[0.0]], "float32")
    assert not np.isfinite(kl_penalty(lp, ref, "k3").numpy()).all()
    assert float(kl_penalty(lp, ref, "k3", clamp=10.0)) == 10.0


# ---------------------------------------------------------------- entropy bonus
def test_entropy_bonus_hand_computed_and_gradient():
    """Uniform logits over 4 tokens: H = ln 4 on every token; token-mean = ln 4. A peaked
    row has lower entropy; the bonus gradient is finite and non-zero."""
    logits = t(np.zeros((1, 2, 4)))
    loss, stats = entropy_bonus_loss(logits, t([[1, 1]]))
    np.testing.assert_allclose(float(loss), np.log(4), rtol=1e-12)
    np.testing.assert_allclose(float(stats["actor/entropy"]), np.log(4), rtol=1e-12)
    z = t([[[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    z.stop_gradient = False
    loss, _ = entropy_bonus_loss(z, t([[1, 0]]), temperature=2.0)
    np.testing.assert_allclose(float(loss), float(entropy_from_logits(z[:, :1] / 2.0)), rtol=1e-12)
    loss.backward()
    g = z.grad.numpy()
    assert np.all(g[0, 1] == 0) and np.abs(g[0, 0]).max() > 0


# ---------------------------------------------------------------- DAPO overlong penalty
def test_overlong_penalty_hand_computed():
    """max_len 10, buffer 4, factor 1 (expected length 6): lengths [3, 6, 7, 10] ->
    [0, 0, -1/4, -1]; factor 0.5 halves them."""
    np.testing.assert_allclose(overlong_penalty(t([3, 6, 7, 10], "int64"), 10, 4, 1.0).numpy(), [0, 0, -0.25, -1.0])
    np.testing.assert_allclose(overlong_penalty(t([7.0, 10.0]), 10, 4, 0.5).numpy(), [-0.125, -0.5])
    lengths = np.arange(0, 12)
    loop = [min(-(n - 6) / 4 * 1.0, 0.0) for n in lengths]
    np.testing.assert_allclose(overlong_penalty(t(lengths), 10, 4, 1.0).numpy(), loop)
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(t([1.0]), 10, 0, 1.0)


# ---------------------------------------------------------------- TRL truncated-completion mask
def test_truncated_completion_mask():
    mask = t([[1, 1, 0], [1, 1, 1]], "float32")
    out = truncated_completion_mask(mask, paddle.to_tensor([True, False]))
    np.testing.assert_array_equal(out.numpy(), [[1, 1, 0], [0, 0, 0]])
    np.testing.assert_array_equal(mask.numpy(), [[1, 1, 0], [1, 1, 1]])


# ---------------------------------------------------------------- adaptive KL controller
def test_adaptive_kl_controller_hand_computed_and_state():
    """coef 0.1, target 6, horizon 10000: kl 9, n 100 -> e = clip(0.5) = 0.2,
    coef = 0.1 * 1.002 = 0.1002; then kl 3, n 100 -> e = -0.5 -> -0.2, coef * 0.998."""
    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    np.testing.assert_allclose(ctl.update(9.0, 100), 0.1002, rtol=1e-12)
    np.testing.assert_allclose(ctl.update(3.0, 100), 0.1002 * 0.998, rtol=1e-12)
    np.testing.assert_allclose(ctl.update(6.6, 1000), 0.1002 * 0.998 * 1.01, rtol=1e-12)
    other = AdaptiveKLController(0.5, 6.0, 10000)
    other.set_state_dict(ctl.state_dict())
    assert other.value == ctl.value
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, 0.0, 10)


def test_log1mexp_matches_float64_reference():
    a = np.array([-1e-9, -1e-5, -0.3, -0.6931, -0.7, -5.0, -40.0])
    ref = np.where(a > -np.log(2), np.log(-np.expm1(a)), np.log1p(-np.exp(a)))
    np.testing.assert_allclose(log1mexp(t(a, "float32")).numpy(), ref, rtol=2e-6)
    assert not np.isfinite(log1mexp(t([0.0])).numpy()).any()  # 1 - p = 0: -inf, callers clamp


def test_new_functions_leave_inputs_untouched():
    rng = np.random.default_rng(11)
    lp, old, adv = (t(rng.normal(size=(4, 3))) for _ in range(3))
    mask = t((rng.random((4, 3)) > 0.3).astype("float64"))
    logits, lengths, ends = t(rng.normal(size=(4, 3, 5))), t([1.0, 2.0, 3.0, 3.0]), paddle.to_tensor([True, False] * 2)
    inputs = [lp, old, adv, mask, logits, lengths, ends]
    before = [x.numpy().copy() for x in inputs]
    ppo_policy_loss(lp, old, adv, mask, importance_sampling_level="sequence")
    aggregate_loss(lp, mask, "seq-mean-token-sum-norm", loss_scale_factor=3)
    kl_loss(lp, old, mask, clamp=10.0)
    entropy_bonus_loss(logits, mask, temperature=0.7)
    overlong_penalty(lengths, 3, 2, 1.0)
    truncated_completion_mask(mask, ends)
    reinforce_pp_baseline_advantages(lengths, mask, 2)
    log1mexp(-paddle.abs(lp) - 1e-3)
    for x, b in zip(inputs, before):
        np.testing.assert_array_equal(x.numpy(), b)
