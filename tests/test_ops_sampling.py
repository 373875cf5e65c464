"""rollout_sample (csrc/cpu/sampling.cc) vs its pure-Paddle twin on random logits: greedy and
sampling, temperature, top-k, top-p, both together, repetition penalty over a presence table,
min-length suppression, finished rows (pad, log-prob 0), and compacted batches (rows index a
larger original batch), and transposed logits ([V, B], the decode layout). Tokens must be
identical for the same uniforms; log-probs within 1e-5."""
import numpy as np
import paddle
import pytest

from tests.rollout_ops_helpers import assert_close, custom_and_fallback_ops


@pytest.fixture(scope="module")
def rollout_ops():
    return custom_and_fallback_ops()


def _inputs(seed, B, V, B0=None, N=4, finished=(), scale=3.0):
    rng = np.random.default_rng(seed)
    B0 = B0 or B
    logits = paddle.to_tensor((rng.standard_normal((B, V)) * scale).astype("float32"))
    rows = paddle.to_tensor(rng.permutation(B0)[:B].astype("int64"))
    uniforms = paddle.to_tensor(np.minimum(rng.random((N, B0), dtype=np.float32), 1 - 2 ** -20))
    presence = paddle.to_tensor((rng.random((B0, V)) < 0.3).astype("uint8"))
    fin = np.zeros(B, "int32")
    fin[list(finished)] = 1
    return logits, presence, rows, uniforms, paddle.to_tensor(fin)


SETTINGS = [
    # temperature, top_k, top_p, penalty, do_sample, suppress
    (1.0, 0, 1.0, 1.0, False, []),
    (0.7, 0, 1.0, 1.3, False, [2]),
    (1.0, 0, 1.0, 1.0, True, []),
    (0.6, 0, 1.0, 1.0, True, [2, 5]),
    (1.3, 5, 1.0, 1.0, True, []),
    (1.0, 0, 0.8, 1.0, True, []),
    (0.8, 10, 0.9, 1.0, True, [2]),
    (1.0, 3, 0.5, 1.5, True, [0]),
    (1.0, 1000, 0.95, 0.8, True, []),  # top_k >= V: no top-k filtering
]


@pytest.mark.parametrize("temperature,top_k,top_p,penalty,do_sample,suppress", SETTINGS)
def test_sample_matches_fallback(rollout_ops, temperature, top_k, top_p, penalty, do_sample, suppress):
    custom, fb = rollout_ops
    logits, presence, rows, uniforms, fin = _inputs(int(temperature * 10 + top_k + top_p * 7), B=24, V=37, B0=30,
                                                    finished=(1, 7, 20))
    step = 2
    args = (logits, presence, rows, uniforms, fin, step, temperature, top_k, top_p, penalty, do_sample, 3, suppress)
    tok_c, lp_c = custom.sample(*args)
    tok_f, lp_f = fb.sample(*args)
    np.testing.assert_array_equal(tok_c.numpy(), tok_f.numpy())
    assert_close(lp_c, lp_f, atol=1e-5, rtol=1e-5)
    t, f = tok_c.numpy(), fin.numpy().astype(bool)
    assert np.all(t[f] == 3) and np.all(lp_c.numpy()[f] == 0)
    assert not np.isin(t[~f], suppress).any()
    # the log-prob is that of the RAW logits at this temperature
    x = logits.numpy().astype("float64") / temperature
    ref = x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)
    expect = ref[np.arange(len(t)), t]
    np.testing.assert_allclose(lp_c.numpy()[~f], expect[~f], atol=1e-5)
    if top_k and top_k < 37:  # every sampled token is among the top-k of the (penalised) logits
        work = logits.numpy().copy()
        if penalty != 1.0:
            seen = presence.numpy()[rows.numpy()].astype(bool)
            work = np.where(seen, np.where(work > 0, work / penalty, work * penalty), work)
        work[:, suppress] = -np.inf
        kth = -np.sort(-work, axis=1)[:, top_k - 1]
        assert np.all(work[np.arange(len(t)), t][~f] >= kth[~f])


def test_greedy_is_first_argmax(rollout_ops):
    custom, fb = rollout_ops
    logits = paddle.to_tensor(np.array([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]], "float32"))
    args = (logits, paddle.zeros([1, 1], "uint8"), paddle.to_tensor([0, 1], dtype="int64"),
            paddle.zeros([1, 2]), paddle.zeros([2], "int32"), 0, 1.0, 0, 1.0, 1.0, False, 3, [])
    for ops in (custom, fb):
        np.testing.assert_array_equal(ops.sample(*args)[0].numpy(), [1, 0])


@pytest.mark.parametrize("do_sample", [False, True])
def test_sample_columns_layout(rollout_ops, do_sample):
    custom, fb = rollout_ops
    logits, presence, rows, uniforms, fin = _inputs(9, B=11, V=50, B0=14, finished=(2,))
    args = (presence, rows, uniforms, fin, 1, 0.9, 7, 0.9, 1.2, do_sample, 3, [2])
    t_rows, lp_rows = custom.sample(logits, *args)
    lt = logits.transpose([1, 0]).contiguous()
    for ops in (custom, fb):
        t, lp = ops.sample(lt, *args, True)
        np.testing.assert_array_equal(t.numpy(), t_rows.numpy())
        assert_close(lp, lp_rows, atol=1e-6, rtol=1e-6)
