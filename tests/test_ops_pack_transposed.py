"""rollout_pack_transposed (csrc/cpu/pack_transposed.cc: concat of transposed weights written in
place into a kept buffer, the "cols" decode layout) vs its pure-Paddle twin, on random matrices
of awkward sizes (not multiples of the 8x8 / 64x64 blocks), strided inputs, and a reused dirty
destination."""
import numpy as np
import paddle
import pytest

from tests.rollout_ops_helpers import assert_close, custom_and_fallback_ops


@pytest.fixture(scope="module")
def rollout_ops():
    return custom_and_fallback_ops()


@pytest.mark.parametrize("K,Ns", [(64, [64, 16, 16]), (33, [70]), (256, [688, 688]), (5, [1, 2, 3]), (130, [9, 200])])
def test_pack_transposed_matches_fallback(rollout_ops, K, Ns):
    custom, fb = rollout_ops
    rng = np.random.default_rng(K)
    xs = [paddle.to_tensor(rng.standard_normal((K, n)).astype("float32")) for n in Ns]
    expect = np.concatenate([x.numpy().T for x in xs], 0)
    d_c = paddle.full([sum(Ns), K], float("nan"))  # a dirty reused buffer: every element is rewritten
    d_f = paddle.full([sum(Ns), K], float("nan"))
    out = custom.pack_transposed(d_c, xs)
    fb.pack_transposed(d_f, xs)
    assert out is d_c
    assert_close(d_c, expect, atol=0, rtol=0)
    assert_close(d_f, expect, atol=0, rtol=0)


def test_pack_transposed_strided_input(rollout_ops):
    custom, _ = rollout_ops
    base = paddle.to_tensor(np.arange(48 * 20, dtype="float32").reshape(48, 20))
    view = base.transpose([1, 0])  # [20, 48] strided view
    dst = paddle.empty([48, 20])
    custom.pack_transposed(dst, [view])
    assert_close(dst, base.numpy(), atol=0, rtol=0)
