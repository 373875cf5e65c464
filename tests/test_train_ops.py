"""The fused training ops (csrc/cpu/train_ops.cc through ppo/models/fused_train_ops.py): the C++
kernels give their pure-Paddle twins' outputs and gradients (padding rows, per-row positions,
saturating activations included), the twins agree with float64 finite differences, and bad
inputs are refused with the argument named."""
import numpy as np
import paddle
import pytest

from ppo.models import fused_train_ops as F
from ppo import kernels

kernels.ensure_built()


def value_and_grads(fn, inputs, upstream_seed=0):
    """Outputs of ``fn(*inputs)`` and the gradients of ``sum(out * R)`` (R fixed, random) w.r.t. inputs."""
    for t in inputs:
        t.stop_gradient = False
        t.clear_gradient(False)
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    rng = np.random.default_rng(upstream_seed)
    total = sum(paddle.sum(o * paddle.to_tensor(rng.standard_normal(o.shape)).astype(o.dtype)) for o in outs)
    total.backward()
    return [o.numpy() for o in outs], [t.grad.numpy().copy() for t in inputs]


def check_kernel_vs_twin(kernel, twin, make_inputs, rtol=1e-5, atol=1e-5):
    assert F.kernels_usable(*make_inputs())
    outs, grads = value_and_grads(kernel, make_inputs())
    ref_outs, ref_grads = value_and_grads(twin, make_inputs())
    for o, r in zip(outs, ref_outs):
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=rtol * 10, atol=atol * 10)
    return outs, grads


def finite_difference_check(fn, inputs, eps=1e-6, checks=12, seed=1):
    """Autograd of ``fn`` (float64) against central differences at random coordinates."""
    _, grads = value_and_grads(fn, inputs)
    rng = np.random.default_rng(seed)
    for which, (t, g) in enumerate(zip(inputs, grads)):
        base = t.numpy()
        for _ in range(checks):
            idx = tuple(rng.integers(0, n) for n in base.shape)
            vals = []
            for step in (eps, -eps):
                moved = [x.numpy() for x in inputs]
                moved[which] = base.copy()
                moved[which][idx] += step
                outs = fn(*[paddle.to_tensor(m) for m in moved])
                outs = outs if isinstance(outs, tuple) else (outs,)
                r = np.random.default_rng(0)
                vals.append(sum(float((o.numpy() * r.standard_normal(o.shape)).sum()) for o in outs))
            numeric = (vals[0] - vals[1]) / (2 * eps)
            assert abs(numeric - g[idx]) <= 1e-5 * max(1.0, abs(numeric)), (which, idx, numeric, g[idx])


def rms_inputs(shape=(3, 5, 16), dtype="float32"):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape) * 3
    x[0, :2] = 0.0  # padding rows: all zeros
    x[1, 0] *= 1e3  # a huge row
    w = rng.uniform(0.5, 1.5, shape[-1])
    return [paddle.to_tensor(x.astype(dtype)), paddle.to_tensor(w.astype(dtype))]


@pytest.mark.parametrize("shape", [(3, 5, 16), (2, 1, 7), (4, 9, 256)])
def test_rms_norm_kernel_matches_twin(shape):
    kernel = lambda x, w: F.fused_rms_norm(x, w, 1e-6)  # noqa: E731
    twin = lambda x, w: F.rms_norm_reference(x, w, 1e-6)  # noqa: E731
    outs, grads = check_kernel_vs_twin(kernel, twin, lambda: rms_inputs(shape), rtol=1e-5, atol=1e-5)
    assert np.all(outs[0][0, :2] == 0) and np.all(np.isfinite(grads[0]))


def test_rms_norm_twin_matches_finite_differences():
    finite_difference_check(lambda x, w: F.rms_norm_reference(x, w, 1e-6), rms_inputs((2, 3, 6), "float64"))


def rope_inputs(cos_batch, dtype="float32", B=3, S=6, Hq=4, Hk=2, D=8):
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((B, S, Hq, D)), rng.standard_normal((B, S, Hk, D))
    positions = np.maximum(np.arange(S)[None, :] - np.array([[0], [2], [4]])[:B], 0)  # left padding: repeated 0
    angles = positions[:cos_batch, :, None] * np.linspace(0.1, 1.0, D // 2)[None, None, :]
    angles = np.concatenate([angles, angles], -1)
    return [paddle.to_tensor(a.astype(dtype)) for a in (q, k, np.cos(angles), np.sin(angles))]


@pytest.mark.parametrize("cos_batch", [1, 3])
def test_rope_kernel_matches_twin_per_row_and_shared_positions(cos_batch):
    def kernel(q, k, c, s):
        c.stop_gradient = s.stop_gradient = True
        return F.fused_rope(q, k, c, s)

    def twin(q, k, c, s):
        c.stop_gradient = s.stop_gradient = True
        return F.rope_reference(q, k, c, s)

    make = lambda: rope_inputs(cos_batch)  # noqa: E731
    assert F.kernels_usable(*make())
    outs, grads = value_and_grads(lambda q, k: kernel(q, k, *make()[2:]), make()[:2])
    ref_outs, ref_grads = value_and_grads(lambda q, k: twin(q, k, *make()[2:]), make()[:2])
    for a, b in zip(outs + grads, ref_outs + ref_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert outs[0].shape == (3, 6, 4, 8) and outs[1].shape == (3, 6, 2, 8)


def test_rope_twin_matches_finite_differences():
    q, k, c, s = rope_inputs(3, "float64")
    finite_difference_check(lambda q, k: F.rope_reference(q, k, c, s), [q, k])


def swiglu_inputs(fused, dtype="float32", shape=(4, 5, 24)):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape) * 4
    x[0, 0, :3] = [100.0, -100.0, 0.0]  # saturated sigmoid both ways
    if fused:
        return [paddle.to_tensor(x.astype(dtype))]
    return [paddle.to_tensor(x.astype(dtype)), paddle.to_tensor(rng.standard_normal(shape).astype(dtype))]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("shape", [(4, 5, 24), (1, 1, 6), (2, 3, 1376)])
def test_swiglu_kernel_matches_twin(fused, shape):
    outs, grads = check_kernel_vs_twin(F.fused_swiglu, F.swiglu_reference, lambda: swiglu_inputs(fused, shape=shape))
    assert outs[0].shape[-1] == (shape[-1] // 2 if fused else shape[-1])
    assert all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("fused", [False, True])
def test_swiglu_twin_matches_finite_differences(fused):
    finite_difference_check(F.swiglu_reference, swiglu_inputs(fused, "float64", shape=(2, 3, 6)))


def test_non_float32_takes_the_twin_and_the_kernel_refuses_it_by_name():
    x, w = rms_inputs((2, 3, 6), "float64")
    assert not F.kernels_usable(x, w)
    np.testing.assert_allclose(F.fused_rms_norm(x, w, 1e-6).numpy(), F.rms_norm_reference(x, w, 1e-6).numpy())
    with pytest.raises(Exception, match="train_rms_norm: x must be float32"):
        F._run("train_rms_norm", x, w, 1e-6)
    q, k, c, s = rope_inputs(1)
    with pytest.raises(Exception, match="cos/sin must be"):
        F._run("train_rope", q, k, c[:, :3], s[:, :3])
    with pytest.raises(Exception, match="weight size 5 != hidden size 6"):
        F._run("train_rms_norm", *rms_inputs((2, 3, 6))[:1], paddle.ones([5]), 1e-6)


def sdpa_inputs(S, dtype="float32", B=3, H=2, D=8, mask_batch=None, seed=5, low=np.finfo(np.float32).min):
    """q, k, v and PaddleNLP's additive causal mask with left padding (row 1: 2 pads, row 2: all
    but one key padded) and right padding (row 0: last key), masked = `low` (PaddleNLP: float32's lowest)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, S, H, D)) for _ in range(3))
    keep = np.tril(np.ones((S, S), bool))[None].repeat(B, 0)
    if S > 2:
        keep[1, :, :2] = False
        keep[2, :, : S - 1] = False
        keep[0, :, S - 1] = False
    mask = np.where(keep, 0.0, low)[:, None]
    if mask_batch == 1:
        mask = mask[:1]
    return [paddle.to_tensor(a.astype(dtype)) for a in (q, k, v, mask)]


@pytest.mark.parametrize("S", [1, 7, 33])
@pytest.mark.parametrize("mask_batch", [None, 1])
def test_attention_kernel_matches_twin_with_padding(S, mask_batch):
    scale = 1 / np.sqrt(8)
    make = lambda: sdpa_inputs(S, mask_batch=mask_batch)  # noqa: E731
    mask = make()[3]
    assert F.kernels_usable(*make())
    outs, grads = value_and_grads(lambda q, k, v: F.fused_sdpa(q, k, v, mask, scale), make()[:3])
    ref_outs, ref_grads = value_and_grads(lambda q, k, v: F.sdpa_reference(q, k, v, mask, scale), make()[:3])
    assert outs[0].shape == (3, S, 16)
    np.testing.assert_allclose(outs[0], ref_outs[0], rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
        assert np.all(np.isfinite(g))


def test_attention_twin_matches_finite_differences():
    # -1e4, not float32's lowest: in float64 the scores of a fully masked row then survive the
    # addition, so the finite differences see what autograd differentiates
    q, k, v, mask = sdpa_inputs(5, "float64", low=-1e4)
    finite_difference_check(lambda q, k, v: F.sdpa_reference(q, k, v, mask, 0.35), [q, k, v])


def test_attention_kernel_refuses_a_bad_mask_by_name():
    q, k, v, mask = sdpa_inputs(6)
    with pytest.raises(Exception, match="mask must be"):
        F._run("train_sdpa", q, k, v, mask[:, :, :3], 0.5)


@pytest.mark.parametrize("transpose_y", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_lm_head_kernels_match_the_paddle_chunks(transpose_y, chunk_size, with_entropy):
    """token_logprobs_from_hidden with the fused per-chunk kernels = without (its Paddle code):
    log-probs, entropy and the gradients of hidden states and head, masked rows, temperature."""
    from ppo.algos import token_logprobs_from_hidden

    rng = np.random.default_rng(6)
    V, H = 37, 16
    hidden = rng.standard_normal((3, 9, H)).astype("float32")
    weight = (rng.standard_normal((V, H) if transpose_y else (H, V)) * 0.5).astype("float32")
    labels = rng.integers(0, V, (3, 9))
    labels[0, :3] = -100
    mask = np.ones((3, 9), "float32")
    mask[2] = 0  # a row nothing counts in
    mask[1, 5:] = 0

    def run(kernels):
        h, w = paddle.to_tensor(hidden), paddle.to_tensor(weight)
        h.stop_gradient = w.stop_gradient = False
        logp, ent = token_logprobs_from_hidden(h, w, paddle.to_tensor(labels), paddle.to_tensor(mask), 0.7, chunk_size,
                                               transpose_y, with_entropy, kernels=kernels)
        total = (logp * paddle.to_tensor(rng.standard_normal(logp.shape).astype("float32"))).sum()
        if with_entropy:
            total = total + (ent * 0.3).sum()
        total.backward()
        return [logp.numpy()] + ([ent.numpy()] if with_entropy else []) + [h.grad.numpy(), w.grad.numpy()]

    rng_state = rng.bit_generator.state
    fused = run(F.LOGIT_KERNELS)
    rng.bit_generator.state = rng_state
    plain = run(None)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert np.all(fused[0][2] == 0)


def test_lm_head_kernels_refuse_a_label_outside_the_vocabulary():
    z = paddle.zeros([2, 5])
    with pytest.raises(Exception, match="label 7 of row 1 is outside the vocabulary"):
        F.LOGIT_KERNELS.stats(z, paddle.to_tensor([1, 7]), True)
