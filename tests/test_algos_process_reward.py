"""Tests for ppo.algos.process_reward (the PRM step loss and step rewards), each against a hand
computation, plus loop-versus-vectorised, masked-garbage and no-mutation checks."""
import math

import numpy as np
import paddle
import pytest

from ppo.algos import (
    PRM_REDUCTIONS,
    process_group_advantages,
    process_reward_loss,
    reduce_step_scores,
    step_token_rewards,
)


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def softplus(x):
    return math.log1p(math.exp(x))


def test_process_reward_loss_hand_computed():
    """Valid steps (logit, label): (0, 1), (2, 0), (-1, 0); the 4th step is padding (NaN logit).
    Per step softplus(s) - y*s: ln 2 = 0.693147, softplus(2) = 2.126928, softplus(-1) = 0.313262;
    mean 1.044446. Predictions s > 0: [F, T, F] against labels [T, F, F]: 1 of 3 right."""
    logits = t([[0.0, 2.0], [-1.0, np.nan]])
    labels = t([[1, 0], [0, 1]])
    mask = t([[1, 1], [1, 0]])
    loss, stats = process_reward_loss(logits, labels, mask)
    want = (softplus(0) + softplus(2) + softplus(-1)) / 3
    assert float(loss) == pytest.approx(want, abs=1e-12) == pytest.approx(1.044446, abs=1e-6)
    assert float(stats["prm/step_accuracy"]) == pytest.approx(1 / 3)
    assert float(stats["prm/positive_frac"]) == pytest.approx(1 / 3)
    # the same as -[y log sigmoid(s) + (1-y) log(1 - sigmoid(s))]
    sig = lambda s: 1 / (1 + math.exp(-s))  # noqa: E731
    bce = -(math.log(sig(0.0)) + math.log(1 - sig(2.0)) + math.log(1 - sig(-1.0))) / 3
    assert float(loss) == pytest.approx(bce, abs=1e-12)


def test_process_reward_loss_is_stable_and_has_the_sigmoid_gradient():
    logits = paddle.to_tensor(np.array([[80.0, -80.0, 0.5]], dtype="float32"), stop_gradient=False)
    labels = t([[0, 1, 1]], "float32")
    loss, _ = process_reward_loss(logits, labels, t([[1, 1, 1]], "float32"))
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx((80 + 80 + softplus(-0.5)) / 3, rel=1e-6)
    loss.backward()
    sig = 1 / (1 + np.exp(-logits.numpy()))
    np.testing.assert_allclose(logits.grad.numpy(), (sig - labels.numpy()) / 3, rtol=1e-5)


def test_process_reward_loss_empty_mask_is_zero():
    loss, stats = process_reward_loss(t([[1.0]]), t([[1]]), t([[0]]))
    assert float(loss) == 0.0 and float(stats["prm/step_accuracy"]) == 0.0


def test_reduce_step_scores_hand_computed():
    """Row 0: steps 0.9, 0.2, 0.7 -> last 0.7, min 0.2. Row 1: one step 0.4 then garbage -> 0.4 both.
    Row 2: a hole at step 1 (mask 1, 0, 1) with 5.0 there: last = step 2 (0.3), min 0.3 over 0.6, 0.3."""
    scores = t([[0.9, 0.2, 0.7], [0.4, np.nan, -7.0], [0.6, 5.0, 0.3]])
    mask = t([[1, 1, 1], [1, 0, 0], [1, 0, 1]])
    np.testing.assert_allclose(reduce_step_scores(scores, mask, "last").numpy(), [0.7, 0.4, 0.3])
    np.testing.assert_allclose(reduce_step_scores(scores, mask, "min").numpy(), [0.2, 0.4, 0.3])
    with pytest.raises(ValueError, match="step_token_rewards"):
        reduce_step_scores(scores, mask, "step")
    assert PRM_REDUCTIONS == ("last", "min", "step")


def test_step_token_rewards_hand_computed():
    """Scores 0.5 and -1 ending at tokens 2 and 4 of 6; the masked third step (garbage index 99) adds nothing."""
    out = step_token_rewards(t([[0.5, -1.0, 3.0]]), t([[1, 1, 0]]), paddle.to_tensor([[2, 4, 99]]), 6)
    np.testing.assert_allclose(out.numpy(), [[0, 0, 0.5, 0, -1.0, 0]])


def process_case():
    """Group of 2 rows, at most 2 steps, 4 tokens. Row 0: steps 1.0 (ends at token 1) and 0.0
    (token 3); row 1: one step 0.0 ending at token 2, a masked second step (garbage), 3 response
    tokens then a pad."""
    scores = t([[1.0, 0.0], [0.0, np.nan]])
    mask = t([[1, 1], [1, 0]])
    ends = paddle.to_tensor([[1, 3], [2, 77]])
    response = t([[1, 1, 1, 1], [1, 1, 1, 0]])
    return scores, mask, ends, response


def test_process_group_advantages_hand_computed():
    """Steps of the group {1, 0, 0}: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3);
    normalised 1 -> (2/3)/sqrt(1/3) = 1.154701, 0 -> -0.577350.
    Row 0 rewards at tokens 1 and 3: suffix sums t0 = t1 = 1.154701 - 0.577350 = 0.577350, t2 = t3 = -0.577350.
    Row 1 reward -0.577350 at token 2: t0..t2 = -0.577350, the pad 0."""
    a = process_group_advantages(*process_case(), group_size=2, eps=0.0).numpy()
    r = math.sqrt(1 / 3)
    hi, lo = (2 / 3) / r, (-1 / 3) / r
    np.testing.assert_allclose(a, [[hi + lo, hi + lo, lo, lo], [lo, lo, lo, 0.0]], atol=1e-12)


def test_process_group_advantages_equal_steps_give_zero_and_inputs_stay():
    scores, mask, ends, response = process_case()
    before = scores.numpy().copy()
    same = t([[0.3, 0.3], [0.3, -9.0]])
    np.testing.assert_array_equal(process_group_advantages(same, mask, ends, response, 2).numpy(), np.zeros((2, 4)))
    np.testing.assert_array_equal(scores.numpy(), before)


def process_loop(scores, mask, ends, response, group_size):
    """Plain python of DeepSeekMath's process supervision, group by group."""
    B, S = scores.shape
    out = np.zeros(response.shape)
    for g in range(0, B, group_size):
        vals = [scores[b, k] for b in range(g, g + group_size) for k in range(S) if mask[b, k]]
        mean, std = np.mean(vals), (np.std(vals, ddof=1) if len(vals) > 1 else 0.0)
        for b in range(g, g + group_size):
            for tok in range(response.shape[1]):
                if not response[b, tok]:
                    continue
                total = 0.0
                for k in range(S):
                    if mask[b, k] and ends[b, k] >= tok and std > 0:
                        total += (scores[b, k] - mean) / std
                out[b, tok] = total
    return out


def test_process_group_advantages_loop_versus_vectorised():
    rng = np.random.default_rng(5)
    B, S, T, G = 6, 3, 8, 3
    scores = rng.normal(size=(B, S))
    mask = (rng.random((B, S)) > 0.3).astype("int64")
    mask[:, 0] = 1
    ends = np.sort(rng.integers(0, T, size=(B, S)), axis=1)
    response = np.ones((B, T))
    response[:, -2:] = 0
    ends = np.minimum(ends, T - 3)
    got = process_group_advantages(t(scores), t(mask), paddle.to_tensor(ends), t(response), G, eps=0.0).numpy()
    np.testing.assert_allclose(got, process_loop(scores, mask, ends, response, G), atol=1e-10)
