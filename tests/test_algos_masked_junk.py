"""Non-finite junk (NaN, +inf, -inf) at masked-out positions changes neither a loss nor its
gradient: every registered policy loss, `ppo_policy_loss`, the value, KL and entropy losses,
VAPO's positive-example NLL, the PRM loss and the token-wise reward / cost losses.

Each case runs once on clean inputs (0 at masked positions) and again with junk in one input,
and in every input at once, asserting the loss, the gradient (w.r.t. log-probs, values or scores)
and the stats are bit-equal to the clean run's, and the gradient is finite and 0 where masked.
Computing `-A * r` and masking afterwards gives the right loss but the gradient `0 * NaN`."""
import itertools

import numpy as np
import paddle
import pytest

from ppo.algos import (KL_ESTIMATOR_NAMES, POLICY_LOSSES, entropy_bonus_from_token_entropy, get_policy_loss, kl_loss,
                       positive_example_nll, ppo_policy_loss, process_reward_loss, tokenwise_pairwise_cost_loss,
                       tokenwise_pairwise_reward_loss, value_loss, zero_masked_inputs)

JUNK = (np.nan, np.inf, -np.inf)
MASK = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], dtype="float64")


def t(a):
    return paddle.to_tensor(np.asarray(a, dtype="float64"))


def leaf(a):
    x = t(a)
    x.stop_gradient = False
    return x


def clean_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    lp = rng.normal(scale=0.3, size=MASK.shape) - 1.0
    xs = [lp, lp + rng.normal(scale=0.2, size=MASK.shape), rng.normal(size=MASK.shape), rng.random(MASK.shape) * 2,
          rng.random(MASK.shape) + 0.5][:n]
    return [np.where(MASK == 1, x, 0.0) for x in xs]


def junk_versions(xs):
    """(label, inputs) with one junk value in one input, then in all of them at once: each junk
    value everywhere, and each rotation of the junk values over the inputs (mixed junk)."""
    for i, j in itertools.product(range(len(xs)), JUNK):
        yield f"input{i}={j}", [np.where(MASK == 1, x, j) if k == i else x for k, x in enumerate(xs)]
    combos = [(j,) * len(xs) for j in JUNK] + [tuple(JUNK[(k + s) % len(JUNK)] for k in range(len(xs)))
                                                for s in range(len(JUNK))]
    for combo in combos:
        yield f"all={combo}", [np.where(MASK == 1, x, j) for x, j in zip(xs, combo)]


def assert_same(clean, dirty, label):
    (loss, grad, stats), (loss_d, grad_d, stats_d) = clean, dirty
    assert np.isfinite(loss_d) and np.isfinite(grad_d).all(), label
    assert loss_d.tobytes() == loss.tobytes(), label
    np.testing.assert_array_equal(grad_d, grad, err_msg=label)
    assert not grad_d[MASK == 0].any(), label
    for k in stats:
        assert stats_d[k].tobytes() == stats[k].tobytes(), (label, k)


def check_all_junk(fn, n_inputs):
    """`fn(*numpy inputs) -> (loss, grad, stats)` gives the clean result for every junk version."""
    xs = clean_inputs(n_inputs)
    clean = fn(*xs)
    assert np.isfinite(clean[1]).all() and clean[1][MASK == 1].any()
    for label, dirty in junk_versions(xs):
        assert_same(clean, fn(*dirty), label)


def numpy_stats(stats):
    return {k: v.numpy() for k, v in stats.items()}


def test_zero_masked_inputs_gradient_is_zero_where_masked():
    """mask [1, 0], x [2, nan] -> [2, 0]; d sum / dx = [1, 0]; None passes through."""
    x = leaf([[2.0, np.nan]])
    out, none = zero_masked_inputs(t([[1, 0]]), x, None)
    paddle.sum(out * 3.0).backward()
    assert out.numpy().tolist() == [[2.0, 0.0]] and none is None
    assert x.grad.numpy().tolist() == [[3.0, 0.0]]


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_policy_loss_ignores_non_finite_junk(name):
    """log-probs, old log-probs, advantages, entropies and IS weights with NaN / +-inf where
    masked; token selection and a rollout correction on; seq-mean-token-mean and token-mean."""
    entry = get_policy_loss(name)
    uniforms = {"uniforms": t(np.random.default_rng(3).random(MASK.shape))} if entry.random else {}
    for mode in ("token-mean", "seq-mean-token-mean"):
        def fn(lp, old, adv, ent, w):
            x = leaf(lp)
            loss, stats = entry(x, t(old), t(adv), t(MASK), loss_agg_mode=mode, entropy=t(ent), top_entropy_frac=0.7,
                                rollout_is_weights=t(w), **uniforms)
            loss.backward()
            return loss.numpy(), x.grad.numpy(), numpy_stats(stats)

        check_all_junk(fn, 5)


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_token_losses_are_the_clean_ones_at_every_position(name):
    """The token-loss functions (`PolicyLoss.fn`, public: a caller may reduce them its own way,
    e.g. `sum(token_loss * mask)`) give the clean inputs' token losses everywhere, masked
    positions included, so no NaN or inf is left for a caller's `0 * x` to turn into NaN."""
    entry = get_policy_loss(name)
    extra = {"uniforms": t(np.random.default_rng(3).random(MASK.shape))} if entry.random else {}

    def fn(lp, old, adv):
        x = leaf(lp)
        token_loss, stats = entry.fn(x, t(old), t(adv), t(MASK), **entry.settings, **extra)
        paddle.sum(token_loss * t(MASK)).backward()
        return token_loss.numpy(), x.grad.numpy(), numpy_stats(stats)

    xs = clean_inputs(3)
    clean = fn(*xs)
    for label, dirty in junk_versions(xs):
        token_loss, grad, stats = fn(*dirty)
        assert np.isfinite(token_loss).all() and token_loss.tobytes() == clean[0].tobytes(), label
        np.testing.assert_array_equal(grad, clean[1], err_msg=label)
        assert all(stats[k].tobytes() == clean[2][k].tobytes() for k in stats), label


@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_ppo_policy_loss_ignores_non_finite_junk(dual_clip, level):
    def fn(lp, old, adv):
        x = leaf(lp)
        loss, stats = ppo_policy_loss(x, t(old), t(adv), t(MASK), dual_clip=dual_clip, importance_sampling_level=level)
        loss.backward()
        return loss.numpy(), x.grad.numpy(), numpy_stats(stats)

    check_all_junk(fn, 3)


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_ignores_non_finite_junk(clip):
    """values, old values and returns with junk where masked: the gradient w.r.t. the values."""
    def fn(v, old, ret):
        x = leaf(v)
        loss, stats = value_loss(x, t(old), t(ret), t(MASK), clip_range_value=clip)
        loss.backward()
        return loss.numpy(), x.grad.numpy(), numpy_stats(stats)

    check_all_junk(fn, 3)


@pytest.mark.parametrize("kind", KL_ESTIMATOR_NAMES)
def test_kl_loss_ignores_non_finite_junk(kind):
    def fn(lp, ref):
        x = leaf(lp)
        loss, stats = kl_loss(x, t(ref), t(MASK), kind=kind, clamp=10.0 if kind in ("k3", "low_var_kl") else None)
        loss.backward()
        return loss.numpy(), x.grad.numpy(), numpy_stats(stats)

    check_all_junk(fn, 2)


def test_entropy_bonus_and_positive_example_nll_ignore_non_finite_junk():
    def bonus(ent):
        x = leaf(ent)
        loss, stats = entropy_bonus_from_token_entropy(x, t(MASK), "seq-mean-token-mean")
        loss.backward()
        return loss.numpy(), x.grad.numpy(), numpy_stats(stats)

    def nll(lp):
        x = leaf(lp)
        loss = positive_example_nll(x, t(MASK), t([1, 1, 0, 1]))
        loss.backward()
        return loss.numpy(), x.grad.numpy(), {}

    check_all_junk(bonus, 1)
    check_all_junk(nll, 1)


def test_process_reward_loss_ignores_non_finite_junk():
    """Step logits and step labels with junk at the steps the mask leaves out."""
    def fn(logits, labels):
        x = leaf(logits)
        loss, stats = process_reward_loss(x, t(labels), t(MASK))
        loss.backward()
        return loss.numpy(), x.grad.numpy(), numpy_stats(stats)

    logits, adv = clean_inputs(3)[0], clean_inputs(3)[2]
    xs = [logits, np.where(MASK == 1, (adv > 0).astype("float64"), 0.0)]
    clean = fn(*xs)
    for label, dirty in junk_versions(xs):
        assert_same(clean, fn(*dirty), label)


def pair_batch():
    """Two pairs: rows differ from index 2 (pair 0) and 1 (pair 1); the span [d, e] is
    [2, 4] and [1, 3]; everything else is outside it."""
    better = np.array([[5, 6, 7, 8, 9], [5, 1, 2, 3, 0]])
    worse = np.array([[5, 6, 1, 2, 0], [5, 4, 4, 0, 0]])
    bm = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    wm = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    span = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0]], dtype="float64")
    ids = [paddle.to_tensor(a) for a in (better, worse, bm, wm)]
    return ids, span


@pytest.mark.parametrize("which", ["reward", "cost"])
def test_tokenwise_pair_losses_ignore_non_finite_junk_outside_the_span(which):
    """safe-rlhf's token-wise losses read the scores of the span [d, e] only: junk elsewhere
    (the shared prompt, past the longer answer) leaves the loss and the scores' gradients."""
    ids, span = pair_batch()
    rng = np.random.default_rng(5)
    clean = [np.where(span == 1, rng.normal(size=span.shape), 0.0) for _ in range(2)]

    def fn(a, b):
        x, y = leaf(a), leaf(b)
        if which == "reward":
            loss, _ = tokenwise_pairwise_reward_loss(x, y, *ids, regularization=0.01)
        else:
            loss, _ = tokenwise_pairwise_cost_loss(x, y, *ids, t([1, -1]), t([-1, -1]), regularization=0.01)
        loss.backward()
        return loss.numpy(), np.concatenate([x.grad.numpy(), y.grad.numpy()])

    loss, grad = fn(*clean)
    for j in JUNK:
        for k in range(3):
            dirty = [np.where(span == 1, c, j) if k in (i, 2) else c for i, c in enumerate(clean)]
            loss_d, grad_d = fn(*dirty)
            assert loss_d.tobytes() == loss.tobytes() and np.array_equal(grad_d, grad), (j, k)
            assert np.isfinite(grad_d).all() and not grad_d[np.concatenate([span, span]) == 0].any()
