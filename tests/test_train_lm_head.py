"""LM-head log-prob/entropy kernels (csrc/cpu/train_lm_head.cc) against their Paddle twin
(ppo.algos.lm_head) and finite differences; padding, fully masked batches and bad inputs.

The twin-vs-kernel sweep over layouts / chunk sizes / temperature is in tests/test_train_ops.py;
this file adds the per-chunk kernels alone, M = 0, finite differences and input checks."""
import numpy as np
import paddle
import pytest

from ppo.algos import token_logprobs_from_hidden
from ppo.models import fused_train_ops as F
from ppo import kernels

kernels.ensure_built()  # builds the ops when missing: these tests never skip


def np_stats(z, y):
    """float64 reference: (logp [c], entropy [c]) of logits z [c, V] at labels y [c]."""
    z = z.astype("float64")
    m = z.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[:, 0]
    p = np.exp(z - lse[:, None])
    return z[np.arange(len(y)), y] - lse, lse - (p * z).sum(-1)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_stats_kernel_matches_float64_reference(scale):
    """Large logits (scale 30) must not overflow: the kernel shifts by the row maximum."""
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((5, 100)) * scale).astype("float32")
    y = rng.integers(0, 100, 5)
    logp, ent, lse = F.LOGIT_KERNELS.stats(paddle.to_tensor(z), paddle.to_tensor(y), True)
    ref_lp, ref_ent = np_stats(z, y)
    np.testing.assert_allclose(logp.numpy(), ref_lp, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ent.numpy(), ref_ent, rtol=1e-5, atol=1e-4)
    assert F.LOGIT_KERNELS.stats(paddle.to_tensor(z), paddle.to_tensor(y), False)[1] is None


def test_grad_kernel_matches_finite_differences_of_float64_reference():
    rng = np.random.default_rng(1)
    c, V = 3, 11
    z = rng.standard_normal((c, V))
    y = rng.integers(0, V, c)
    g_lp, g_ent = rng.standard_normal(c), rng.standard_normal(c)

    def f(zz):
        lp, ent = np_stats(zz, y)
        return (g_lp * lp).sum() + (g_ent * ent).sum()

    fd = np.zeros_like(z)
    eps = 1e-6
    for idx in np.ndindex(*z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += eps
        zm[idx] -= eps
        fd[idx] = (f(zp) - f(zm)) / (2 * eps)
    dz = F.LOGIT_KERNELS.grad_z(paddle.to_tensor(z.astype("float32")), paddle.to_tensor(y),
                                paddle.to_tensor(g_lp.astype("float32")), paddle.to_tensor(g_ent.astype("float32")))
    np.testing.assert_allclose(dz.numpy(), fd, rtol=1e-4, atol=1e-5)
    dz_lp = F.LOGIT_KERNELS.grad_z(paddle.to_tensor(z.astype("float32")), paddle.to_tensor(y),
                                   paddle.to_tensor(g_lp.astype("float32")))
    p = np.exp(z - np.log(np.exp(z).sum(-1, keepdims=True)))
    onehot = np.eye(V)[y]
    np.testing.assert_allclose(dz_lp.numpy(), g_lp[:, None] * (onehot - p), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transpose_y", [False, True])
def test_twin_matches_finite_differences(transpose_y):
    """The Paddle twin's hand-written backward against central differences (float64 inputs,
    float32 logits inside, so a loose tolerance), temperature 0.7, chunk size 2, a padded row."""
    rng = np.random.default_rng(2)
    V, H = 6, 4
    hidden = rng.standard_normal((1, 5, H))
    weight = rng.standard_normal((V, H) if transpose_y else (H, V)) * 0.5
    labels = rng.integers(0, V, (1, 5))
    labels[0, 1] = -100
    mask = np.array([[1, 1, 1, 0, 1]], "float32")
    g_lp, g_ent = rng.standard_normal((1, 5)), rng.standard_normal((1, 5))

    def f(hh, ww, grad=False):
        h, w = paddle.to_tensor(hh), paddle.to_tensor(ww)
        h.stop_gradient = w.stop_gradient = not grad
        lp, ent = token_logprobs_from_hidden(h, w, paddle.to_tensor(labels), paddle.to_tensor(mask), 0.7, 2,
                                             transpose_y, True)
        total = (lp.astype("float64") * paddle.to_tensor(g_lp)).sum() + (ent.astype("float64") * paddle.to_tensor(g_ent)).sum()
        if grad:
            total.backward()
            return h.grad.numpy(), w.grad.numpy()
        return float(total)

    gh, gw = f(hidden, weight, grad=True)
    eps = 1e-3
    for arr, got in ((hidden, gh), (weight, gw)):
        fd = np.zeros_like(arr)
        for idx in np.ndindex(*arr.shape):
            ap, am = arr.copy(), arr.copy()
            ap[idx] += eps
            am[idx] -= eps
            args_p = (ap, weight) if arr is hidden else (hidden, ap)
            args_m = (am, weight) if arr is hidden else (hidden, am)
            fd[idx] = (f(*args_p) - f(*args_m)) / (2 * eps)
        np.testing.assert_allclose(got, fd, rtol=2e-3, atol=2e-3)
    assert np.all(gh[0, 1] == 0) and np.all(gh[0, 3] == 0)  # padded / masked rows get no gradient


@pytest.mark.parametrize("with_entropy", [False, True])
def test_fully_masked_batch_with_kernels(with_entropy):
    """M = 0: zeros, still in the graph, and zero gradients for hidden states and head."""
    rng = np.random.default_rng(3)
    h = paddle.to_tensor(rng.standard_normal((2, 3, 4)).astype("float32"))
    w = paddle.to_tensor(rng.standard_normal((4, 9)).astype("float32"))
    h.stop_gradient = w.stop_gradient = False
    labels = paddle.to_tensor(rng.integers(0, 9, (2, 3)))
    lp, ent = token_logprobs_from_hidden(h, w, labels, paddle.zeros([2, 3]), 1.0, 7, False, with_entropy,
                                         kernels=F.LOGIT_KERNELS)
    assert lp.shape == [2, 3] and np.all(lp.numpy() == 0)
    assert (ent is not None) == with_entropy
    (lp.sum() + (ent.sum() if with_entropy else 0)).backward()
    assert h.grad is None or np.all(h.grad.numpy() == 0)


def test_no_grad_path_with_kernels_matches_twin():
    rng = np.random.default_rng(4)
    h = paddle.to_tensor(rng.standard_normal((2, 6, 8)).astype("float32"))
    w = paddle.to_tensor(rng.standard_normal((8, 50)).astype("float32"))
    labels = paddle.to_tensor(rng.integers(0, 50, (2, 6)))
    mask = paddle.to_tensor(rng.integers(0, 2, (2, 6)).astype("float32"))
    with paddle.no_grad():
        a = token_logprobs_from_hidden(h, w, labels, mask, 1.3, 1, False, True, kernels=F.LOGIT_KERNELS)
        b = token_logprobs_from_hidden(h, w, labels, mask, 1.3, 1, False, True)
    for x, r in zip(a, b):
        np.testing.assert_allclose(x.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)


def test_kernels_decline_float64_logits():
    assert not F.LOGIT_KERNELS.accepts(paddle.zeros([2, 3], "float64"))
    assert F.LOGIT_KERNELS.accepts(paddle.zeros([2, 3], "float32"))


def test_bad_inputs_are_refused_by_name():
    z = paddle.zeros([2, 5])
    y = paddle.to_tensor([1, 2])
    lse = paddle.zeros([2])
    g = paddle.ones([2])
    with pytest.raises(Exception, match="logits must be float32"):
        F._run("train_logit_stats", paddle.zeros([2, 5], "float64"), y, True)
    with pytest.raises(Exception, match="labels must be int64"):
        F._run("train_logit_stats", z, y.astype("int32"), True)
    with pytest.raises(Exception, match="logits \\[c, V\\] and labels \\[c\\]"):
        F._run("train_logit_stats", z, paddle.to_tensor([1, 2, 3]), True)
    with pytest.raises(Exception, match="labels must be int64"):
        F._run("train_logit_dz", paddle.zeros([2, 5]), y.astype("int32"), lse, g, None, False)
    with pytest.raises(Exception, match="lse must be \\[c\\]"):
        F._run("train_logit_dz", paddle.zeros([2, 5]), y, paddle.zeros([3]), g, None, False)
    with pytest.raises(Exception, match="logp gradient must be \\[c\\]"):
        F._run("train_logit_dz", paddle.zeros([2, 5]), y, lse, paddle.ones([1]), None, False)
    with pytest.raises(Exception, match="entropy gradient must be \\[c\\]"):
        F._run("train_logit_dz", paddle.zeros([2, 5]), y, lse, g, paddle.ones([4]), True)
    with pytest.raises(Exception, match="label -1 of row 0 is outside the vocabulary"):
        F._run("train_logit_dz", paddle.zeros([2, 5]), paddle.to_tensor([-1, 0]), lse, g, None, False)
