"""rollout_attention (csrc/cpu/attention.cc: RoPE + in-place KV-cache write + masked attention)
vs its pure-Paddle twin, on random inputs: prefill (Tq > 1) and decode (Tq = 1), MHA and GQA,
both q/k/v layouts, q/k/v biases, the transposed decode layout (cols: qkv [W, B]), left padding
(masked prompt keys), a fully padded row, finished rows (no cache write, zero output), and
out-of-range positions (clipped)."""
import math

import numpy as np
import paddle
import pytest

from tests.rollout_ops_helpers import assert_close, clone, custom_and_fallback_ops


@pytest.fixture(scope="module")
def rollout_ops():
    return custom_and_fallback_ops()


def _rope_tables(P, hd, theta=10000.0):
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype="float32") / hd)
    f = np.outer(np.arange(P, dtype="float32"), inv)
    emb = np.concatenate([f, f], -1)
    return paddle.to_tensor(np.cos(emb).astype("float32")), paddle.to_tensor(np.sin(emb).astype("float32"))


def _case(seed, B, Tq, Tp, t0, nh, nkv, hd, L=2, S=None, finished_rows=(), full_pad_row=None):
    rng = np.random.default_rng(seed)
    S = S or (t0 + Tq + 3)
    W = (nh + 2 * nkv) * hd
    qkv = rng.standard_normal((B, Tq, W) if Tq > 1 else (B, W)).astype("float32")
    k_cache = rng.standard_normal((L, B, nkv, hd, S)).astype("float32")
    v_cache = rng.standard_normal((L, B, nkv, S, hd)).astype("float32")
    mask = np.ones((B, Tp), "int32")
    for b in range(B):
        mask[b, : rng.integers(0, max(Tp // 2, 1))] = 0  # left padding
    if full_pad_row is not None:
        mask[full_pad_row] = 0
    pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    if Tq == 1:
        pos = pos[:, -1] + 1 + (t0 - Tp)
        pos[0] = 10_000  # beyond the table: clipped to the last row by both implementations
    fin = np.zeros(B, "int32")
    fin[list(finished_rows)] = 1
    return [paddle.to_tensor(a) for a in (qkv, k_cache, v_cache, pos.astype("int64"), mask, fin)]


CASES = [
    # (B, Tq, Tp, t0, nh, nkv, hd, layout, finished, full_pad_row, bias, cols)
    (4, 6, 6, 0, 4, 4, 16, 0, (), None, False, False),  # prefill MHA
    (5, 7, 7, 0, 4, 2, 8, 0, (1,), 3, True, False),  # prefill GQA + bias, a finished row, a fully padded row
    (6, 1, 5, 9, 4, 4, 16, 0, (2, 5), None, False, False),  # decode MHA
    (6, 1, 5, 9, 6, 2, 8, 0, (0,), None, True, False),  # decode GQA 3:1 + bias
    (3, 1, 4, 6, 4, 2, 8, 1, (), None, False, False),  # decode, PaddleNLP fused-qkv layout
    (3, 4, 4, 0, 4, 1, 8, 1, (2,), None, False, False),  # prefill, fused layout, MQA
    (7, 1, 5, 40, 4, 4, 64, 0, (3,), None, False, True),  # decode, transposed (cols) layout, hd 64
    (5, 1, 3, 11, 4, 2, 24, 0, (), None, True, True),  # decode, cols, GQA, bias, hd 24
]


@pytest.mark.parametrize("B,Tq,Tp,t0,nh,nkv,hd,layout,finished,full_pad,bias,cols", CASES)
def test_attention_matches_fallback(rollout_ops, B, Tq, Tp, t0, nh, nkv, hd, layout, finished, full_pad, bias,
                                    cols):
    custom, fb = rollout_ops
    cos, sin = _rope_tables(64, hd)
    qkv, k_cache, v_cache, pos, mask, fin = _case(B * 7 + Tq, B, Tq, Tp, t0, nh, nkv, hd, finished_rows=finished,
                                       full_pad_row=full_pad)
    layer = 1
    scale = 1.0 / math.sqrt(hd)
    kc, vc, kf, vf = clone(k_cache), clone(v_cache), clone(k_cache), clone(v_cache)
    b = paddle.to_tensor(np.random.default_rng(B).standard_normal(qkv.shape[-1]).astype("float32")) if bias else None
    if cols:
        qkv = qkv.transpose([1, 0]).contiguous()  # [W, B]
    args = (cos, sin, pos, mask, fin, layer, t0, nh, nkv, hd, layout, scale, b, cols)
    out_c = custom.attention(qkv, kc, vc, *args)
    out_f = fb.attention(qkv, kf, vf, *args)
    assert out_c.shape == out_f.shape
    assert_close(out_c, out_f, atol=2e-5, rtol=1e-4)
    assert_close(kc, kf, atol=1e-6, rtol=1e-6)
    assert_close(vc, vf, atol=0, rtol=0)
    live = fin.numpy() == 0
    # only slots t0..t0+Tq-1 of `layer` for unfinished rows changed
    for before, after, slot_axis in ((k_cache, kc, 4), (v_cache, vc, 3)):
        c0, cc = before.numpy(), after.numpy()
        changed = np.zeros_like(c0, dtype=bool)
        idx = [layer, live, slice(None), slice(None), slice(None)]
        idx[slot_axis] = slice(t0, t0 + Tq)
        changed[tuple(idx)] = True
        np.testing.assert_array_equal(cc[~changed], c0[~changed])
        assert np.all(cc[changed] != c0[changed])
    # finished rows output zeros; a fully padded prompt row (prefill) outputs zeros
    o = out_c.numpy().T if cols else out_c.numpy()
    assert np.all(o[~live] == 0)
    if full_pad is not None and Tq > 1:
        assert np.all(o[full_pad] == 0)


def test_columns_layout_equals_rows_layout(rollout_ops):
    """The transposed decode layout computes exactly what the row layout computes."""
    custom, _ = rollout_ops
    cos, sin = _rope_tables(64, 32)
    qkv, k_cache, v_cache, pos, mask, fin = _case(3, 6, 1, 5, 20, 4, 2, 32, finished_rows=(4,))
    k1, v1, k2, v2 = clone(k_cache), clone(v_cache), clone(k_cache), clone(v_cache)
    args = (cos, sin, pos, mask, fin, 0, 20, 4, 2, 32, 0, 0.17)
    rows = custom.attention(qkv, k1, v1, *args)
    cols = custom.attention(qkv.transpose([1, 0]).contiguous(), k2, v2, *args, None, True)
    assert_close(cols.transpose([1, 0]), rows, atol=0, rtol=0)
    assert_close(k1, k2, atol=0, rtol=0)
