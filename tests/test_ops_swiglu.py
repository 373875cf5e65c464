"""rollout_swiglu (csrc/cpu/swiglu.cc) vs its pure-Paddle twin (paddle's swiglu, what PaddleNLP's
Llama/Qwen2 MLP calls): fused [.., 2I] input, fused [2I, B] input of the transposed decode
layout (cols), and separate gate/up inputs, including large |x| where exp under/overflows."""
import numpy as np
import paddle
import pytest

from tests.rollout_ops_helpers import assert_close, custom_and_fallback_ops


@pytest.fixture(scope="module")
def rollout_ops():
    return custom_and_fallback_ops()


@pytest.mark.parametrize("shape", [[16, 2 * 688], [3, 5, 2 * 37], [1, 2]])
def test_swiglu_fused_input(rollout_ops, shape):
    custom, fb = rollout_ops
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype("float32") * 4
    x.reshape(-1)[:4] = [100.0, -100.0, 0.0, -30.0][: x.size]
    x = paddle.to_tensor(x)
    out = custom.swiglu(x)
    assert out.shape == shape[:-1] + [shape[-1] // 2]
    assert_close(out, fb.swiglu(x), atol=1e-5, rtol=1e-5)


def test_swiglu_separate_inputs(rollout_ops):
    custom, fb = rollout_ops
    rng = np.random.default_rng(0)
    g = paddle.to_tensor(rng.standard_normal((16, 1536)).astype("float32") * 3)
    u = paddle.to_tensor(rng.standard_normal((16, 1536)).astype("float32"))
    assert_close(custom.swiglu(g, u), fb.swiglu(g, u), atol=1e-5, rtol=1e-5)
    gn, un = g.numpy().astype("float64"), u.numpy()
    assert_close(custom.swiglu(g, u), gn / (1 + np.exp(-gn)) * un, atol=1e-5, rtol=1e-5)


def test_swiglu_columns_layout(rollout_ops):
    custom, fb = rollout_ops
    rng = np.random.default_rng(1)
    x = paddle.to_tensor(rng.standard_normal((2 * 96, 16)).astype("float32") * 3)  # [2I, B]
    out = custom.swiglu(x, None, cols=True)
    assert out.shape == [96, 16]
    assert_close(out, fb.swiglu(x, None, cols=True), atol=1e-5, rtol=1e-5)
    assert_close(out, fb.swiglu(x[:96], x[96:]), atol=1e-5, rtol=1e-5)
