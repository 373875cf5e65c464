"""PaddleNLP's `use_fp32_compute: false`: the log-prob passes compute the softmax in the training
dtype instead of upcasting the logits to float32. Paddle's CPU build has no bf16/fp16 kernels
for log_softmax, matmul or take_along_axis, so the dtype's path is checked numerically in
float64 (a dtype other than float32 that the CPU computes: results in that dtype and equal to
the float64 reference, gradients included), and pinned in bfloat16 by the dtype of the logits
that reach the softmax."""
import numpy as np
import paddle
import pytest

import ppo.algos.lm_head as lm_head
import ppo.models.causal_lm as causal_lm
from ppo.algos import token_logprobs_from_hidden
from ppo.models.loading import load_causal_lm
from ppo.passes.plain import PlainPasses
from ppo.strategy.base import PassSettings
from ppo.strategy.plain import PlainStrategy


def _case(seed=0, N=2, T=5, H=6, V=9):
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal([N, T, H])
    weight = rng.standard_normal([H, V])
    labels = rng.integers(0, V, [N, T])
    labels[0, 0] = -100
    return hidden, weight, labels


def _reference(hidden, weight, labels, temperature):
    z = hidden @ weight / temperature
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    picked = np.take_along_axis(z, np.maximum(labels, 0)[..., None], -1)[..., 0]
    return np.where(labels >= 0, picked - lse, 0.0)


@pytest.mark.parametrize("chunk_size", [0, 3])
def test_hidden_state_logprobs_in_another_dtype_are_computed_in_it(chunk_size):
    """float64 in, float64 out, equal to the float64 formula to 1e-12 (float32 logits would be off
    by ~1e-7), and the gradients of the chunked PyLayer equal plain autograd's in float64 (the head's
    gradient to float32 precision: it is summed over the chunks in float32)."""
    hidden, weight, labels = _case()
    h = paddle.to_tensor(hidden, stop_gradient=False)
    w = paddle.to_tensor(weight, stop_gradient=False)
    logp, _ = token_logprobs_from_hidden(h, w, paddle.to_tensor(labels), temperature=0.7, chunk_size=chunk_size,
                                         dtype="float64")
    assert logp.dtype == paddle.float64
    np.testing.assert_allclose(logp.numpy(), _reference(hidden, weight, labels, 0.7), rtol=0, atol=1e-12)
    logp.sum().backward()
    h2 = paddle.to_tensor(hidden, stop_gradient=False)
    w2 = paddle.to_tensor(weight, stop_gradient=False)
    z = paddle.matmul(h2, w2) / 0.7
    counted = paddle.to_tensor(labels >= 0)
    picked = paddle.take_along_axis(z, paddle.to_tensor(np.maximum(labels, 0))[..., None], -1)[..., 0]
    paddle.where(counted, picked - paddle.logsumexp(z, -1), paddle.zeros_like(picked)).sum().backward()
    np.testing.assert_allclose(h.grad.numpy(), h2.grad.numpy(), atol=1e-10)
    np.testing.assert_allclose(w.grad.numpy(), w2.grad.numpy(), atol=1e-10 if chunk_size == 0 else 2e-6)  # chunks: float32 sum


@pytest.mark.parametrize("chunk_size", [0, 4])
def test_model_logprobs_follow_the_compute_dtype(tiny_model_dir, chunk_size):
    """The tiny model's log-probs with dtype float64 are float64 and agree with the float32 ones."""
    model = load_causal_lm(tiny_model_dir)
    ids = paddle.to_tensor(np.random.default_rng(1).integers(3, 60, [2, 7]))
    mask = paddle.ones([2, 7], "int64")
    with paddle.no_grad():
        f32, _ = causal_lm.causal_lm_token_logprobs(model, ids, mask, ids, chunk_size=chunk_size)
        f64, _ = causal_lm.causal_lm_token_logprobs(model, ids, mask, ids, chunk_size=chunk_size, dtype="float64")
    assert f32.dtype == paddle.float32 and f64.dtype == paddle.float64
    np.testing.assert_allclose(f64.numpy(), f32.numpy(), atol=2e-5)


class Reached(Exception):
    """Raised by the spies below with the dtype of the logits that reached the softmax."""


def test_bfloat16_logits_reach_the_softmax_without_an_upcast(tiny_model_dir, monkeypatch):
    """With dtype bfloat16 the full-logits path hands bfloat16 logits to the softmax and the chunked
    path makes bfloat16 chunk logits; with the default, float32 (the spies stop there: the CPU has
    no bf16 kernels for what follows)."""

    def spy_full(logits, targets, temperature=1.0):
        raise Reached(logits.dtype)

    def spy_chunk(z, y, with_entropy, kernels=None):
        raise Reached(z.dtype)

    monkeypatch.setattr(causal_lm, "token_logprobs", spy_full)
    monkeypatch.setattr(lm_head, "_chunk_stats", spy_chunk)
    model = load_causal_lm(tiny_model_dir)
    ids = paddle.to_tensor(np.random.default_rng(2).integers(3, 60, [2, 6]))
    mask = paddle.ones([2, 6], "int64")
    for chunk_size in (0, 4):
        for dtype, want in (("bfloat16", paddle.bfloat16), ("float32", paddle.float32)):
            with paddle.no_grad(), pytest.raises(Reached) as reached:
                causal_lm.causal_lm_token_logprobs(model, ids, mask, ids, chunk_size=chunk_size, dtype=dtype)
            assert reached.value.args[0] == want, (chunk_size, dtype)


def test_the_plain_passes_take_the_runs_logprob_dtype():
    settings = PassSettings(temperature=1.0, logprob_chunk_size=0, chunk_rows=4, pad_token_id=0, logprob_dtype="bfloat16")
    models = type("Models", (), {"actor": None})()
    passes = PlainStrategy().build_passes(models, None, {}, {}, settings)
    assert isinstance(passes, PlainPasses) and passes.logprob_dtype == "bfloat16"
