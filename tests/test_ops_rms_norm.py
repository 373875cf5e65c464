"""rollout_rms_norm / rollout_add_rms_norm (csrc/cpu/rms_norm.cc) vs the pure-Paddle twin and
PaddleNLP's LlamaRMSNorm formula, on random rows (including tiny-variance rows where eps matters),
in the row layout ([..., H]) and the transposed decode layout (cols: [H, B])."""
import numpy as np
import paddle
import pytest

from tests.rollout_ops_helpers import assert_close, clone, custom_and_fallback_ops


@pytest.fixture(scope="module")
def rollout_ops():
    return custom_and_fallback_ops()


def _inputs(seed, shape, scale=1.0):
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal(shape).astype("float32") * scale)
    w = paddle.to_tensor(rng.standard_normal(shape[-1]).astype("float32"))
    return x, w


def test_rms_norm_matches_fallback_and_formula(rollout_ops):
    custom, fb = rollout_ops
    for seed, shape, scale in [(0, [16, 256], 1.0), (1, [3, 7, 96], 0.02), (2, [5, 13], 1e-3)]:
        x, w = _inputs(seed, shape, scale)
        out_c = custom.rms_norm(x, w, 1e-6)
        out_f = fb.rms_norm(x, w, 1e-6)
        xn = x.numpy().astype("float64")
        ref = xn / np.sqrt((xn ** 2).mean(-1, keepdims=True) + 1e-6) * w.numpy()
        assert out_c.shape == x.shape
        assert_close(out_c, out_f, atol=1e-5, rtol=1e-5)
        assert_close(out_c, ref, atol=1e-5, rtol=1e-4)


def test_add_rms_norm_updates_residual_in_place(rollout_ops):
    custom, fb = rollout_ops
    for seed, shape in [(3, [16, 256]), (4, [2, 9, 64])]:
        x, w = _inputs(seed, shape)
        res0, _ = _inputs(seed + 100, shape)
        res_c, res_f = clone(res0), clone(res0)
        out_c, r_c = custom.add_rms_norm(x, res_c, w, 1e-6)
        out_f, r_f = fb.add_rms_norm(x, res_f, w, 1e-6)
        expect_res = res0.numpy() + x.numpy()
        assert_close(res_c, expect_res, atol=0, rtol=0, msg="residual must be updated in place")
        assert_close(r_c, expect_res, atol=0, rtol=0)
        assert_close(res_f, expect_res, atol=0, rtol=0)
        assert_close(out_c, out_f, atol=1e-5, rtol=1e-5)


def test_rms_norm_columns_layout(rollout_ops):
    custom, fb = rollout_ops
    x, _ = _inputs(5, [256, 13], 0.05)  # [H, B]
    _, w = _inputs(5, [13, 256])
    out = custom.rms_norm(x, w, 1e-6, cols=True)
    ref = custom.rms_norm(x.transpose([1, 0]).contiguous(), w, 1e-6).transpose([1, 0])
    assert_close(out, ref, atol=1e-6, rtol=1e-5)
    assert_close(out, fb.rms_norm(x, w, 1e-6, cols=True), atol=1e-5, rtol=1e-5)
    res0, _ = _inputs(6, [256, 13])
    rc, rf = clone(res0), clone(res0)
    oc, _ = custom.add_rms_norm(x, rc, w, 1e-6, cols=True)
    of, _ = fb.add_rms_norm(x, rf, w, 1e-6, cols=True)
    assert_close(rc, res0.numpy() + x.numpy(), atol=0, rtol=0)
    assert_close(rf, rc, atol=0, rtol=0)
    assert_close(oc, of, atol=1e-5, rtol=1e-5)


def test_rms_norm_accepts_strided_views(rollout_ops):
    custom, fb = rollout_ops
    x, _ = _inputs(7, [64, 9])
    _, w = _inputs(7, [9, 64])
    view = x.transpose([1, 0])  # a strided view: the op must read it as [9, 64] rows
    assert_close(custom.rms_norm(view, w, 1e-6), fb.rms_norm(view.contiguous(), w, 1e-6), atol=1e-5, rtol=1e-5)
