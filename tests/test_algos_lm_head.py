"""Tests for ppo.algos.lm_head.token_logprobs_from_hidden (chunked LM-head log-probs/entropy)."""
import math

import numpy as np
import paddle
import pytest

from ppo.algos import entropy_from_logits, token_logprobs, token_logprobs_from_hidden

N, T, H, V = 3, 7, 5, 11


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def leaf(a, dtype="float64"):
    x = t(a, dtype)
    x.stop_gradient = False
    return x


def make(seed=0, dtype="float64", transpose_y=False):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(N, T, H))
    weight = rng.normal(size=(V, H) if transpose_y else (H, V))
    labels = rng.integers(0, V, size=(N, T))
    mask = (rng.random((N, T)) > 0.35).astype("int64")
    mask[0, :] = 1  # one full row
    return hidden, weight, labels, mask


def full_reference(hidden, weight, labels, mask, temperature, transpose_y):
    """The old path: full [N, T, V] logits, then token_logprobs / entropy_from_logits."""
    logits = paddle.matmul(hidden, weight, transpose_y=transpose_y)
    lp = token_logprobs(logits, labels, temperature=temperature) * mask.astype(logits.dtype)
    ent = entropy_from_logits(logits / temperature) * mask.astype(logits.dtype)
    return lp, ent


def test_hand_computed_two_token_vocab():
    """H = 1, W = [[0, ln 3]] (V = 2): z = [0, ln 3] for h = 1, so p = [1/4, 3/4].
    logp(y=1) = ln(3/4); H = -(1/4 ln 1/4 + 3/4 ln 3/4) = ln 4 - 3/4 ln 3.
    At temperature 2, z = [0, ln 3 / 2]: p = [1/(1+sqrt 3), sqrt 3/(1+sqrt 3)] and
    logp(y=0) = -ln(1 + sqrt 3). Masked position (h = NaN) gives 0."""
    hidden = t([[[1.0], [1.0], [float("nan")]]])
    weight = t([[0.0, math.log(3.0)]])
    labels = t([[1, 0, 1]], "int64")
    mask = t([[1, 1, 0]], "int64")
    lp, ent = token_logprobs_from_hidden(hidden, weight, labels, mask, with_entropy=True, chunk_size=1)
    np.testing.assert_allclose(lp.numpy(), [[math.log(0.75), math.log(0.25), 0.0]], rtol=1e-6)
    h_expected = math.log(4.0) - 0.75 * math.log(3.0)
    np.testing.assert_allclose(ent.numpy(), [[h_expected, h_expected, 0.0]], rtol=1e-6)
    lp2, _ = token_logprobs_from_hidden(hidden, weight, labels, mask, temperature=2.0, chunk_size=2)
    np.testing.assert_allclose(lp2.numpy()[0, 1], -math.log(1.0 + math.sqrt(3.0)), rtol=1e-6)
    assert lp.dtype == paddle.float32 and lp.shape == [1, 3]


@pytest.mark.parametrize("transpose_y", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 1000, 0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_full_logits_values_and_grads(transpose_y, chunk_size, temperature):
    """Values and gradients (w.r.t. hidden and head weight) of loss = sum(a * logp + b * H)
    (float32 logits inside, so float32 tolerances against the float64 reference)
    match the full-logits path for chunk sizes dividing the token count or not."""
    hidden, weight, labels, mask = make(1, transpose_y=transpose_y)
    rng = np.random.default_rng(7)
    a, b = t(rng.normal(size=(N, T)), "float32"), t(rng.normal(size=(N, T)), "float32")

    h1, w1 = leaf(hidden), leaf(weight)
    lp, ent = token_logprobs_from_hidden(
        h1, w1, t(labels, "int64"), t(mask, "int64"), temperature, chunk_size, transpose_y, with_entropy=True
    )
    ((lp * a).sum() + (ent * b).sum()).backward()

    h2, w2 = leaf(hidden), leaf(weight)
    ref_lp, ref_ent = full_reference(h2, w2, t(labels, "int64"), t(mask, "int64"), temperature, transpose_y)
    ((ref_lp * a.astype("float64")).sum() + (ref_ent * b.astype("float64")).sum()).backward()

    np.testing.assert_allclose(lp.numpy(), ref_lp.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent.numpy(), ref_ent.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h1.grad.numpy(), h2.grad.numpy(), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(w1.grad.numpy(), w2.grad.numpy(), rtol=1e-4, atol=2e-5)


def test_logprobs_only_and_frozen_head():
    """Without entropy the first output alone carries the gradient; a frozen head gets none
    while hidden still gets the full-logits gradient."""
    hidden, weight, labels, mask = make(2)
    h1 = leaf(hidden)
    w1 = t(weight)  # stop_gradient=True
    lp, ent = token_logprobs_from_hidden(h1, w1, t(labels, "int64"), t(mask, "int64"), chunk_size=3)
    assert ent is None
    lp.sum().backward()
    h2 = leaf(hidden)
    ref_lp, _ = full_reference(h2, t(weight), t(labels, "int64"), t(mask, "int64"), 1.0, False)
    ref_lp.sum().backward()
    np.testing.assert_allclose(h1.grad.numpy(), h2.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert w1.grad is None


def test_loop_matches_vectorised():
    """Row by row (one sequence at a time) equals the batched call."""
    hidden, weight, labels, mask = make(3)
    lp, ent = token_logprobs_from_hidden(t(hidden), t(weight), t(labels, "int64"), t(mask, "int64"), chunk_size=4, with_entropy=True)
    for i in range(N):
        lp_i, ent_i = token_logprobs_from_hidden(
            t(hidden[i : i + 1]), t(weight), t(labels[i : i + 1], "int64"), t(mask[i : i + 1], "int64"), chunk_size=2, with_entropy=True
        )
        np.testing.assert_allclose(lp_i.numpy()[0], lp.numpy()[i], rtol=1e-6)
        np.testing.assert_allclose(ent_i.numpy()[0], ent.numpy()[i], rtol=1e-6)


def test_masked_garbage_invariance_and_no_mutation():
    """NaN / huge hidden states and out-of-range labels at masked positions change nothing;
    negative labels count as masked; inputs are left untouched."""
    hidden, weight, labels, mask = make(4)
    base_lp, base_ent = token_logprobs_from_hidden(
        t(hidden), t(weight), t(labels, "int64"), t(mask, "int64"), chunk_size=3, with_entropy=True
    )
    dirty_h, dirty_y = hidden.copy(), labels.copy()
    dirty_h[mask == 0] = np.nan
    dirty_y[mask == 0] = 10**6
    dirty_y[0, 2] = -100  # a negative label inside the mask is ignored too
    ht, wt, yt, mt = t(dirty_h), t(weight), t(dirty_y, "int64"), t(mask, "int64")
    copies = [x.numpy().copy() for x in (ht, wt, yt, mt)]
    h_leaf = leaf(dirty_h)
    lp, ent = token_logprobs_from_hidden(h_leaf, wt, yt, mt, chunk_size=3, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
    expected_lp, expected_ent = base_lp.numpy().copy(), base_ent.numpy().copy()
    expected_lp[0, 2] = expected_ent[0, 2] = 0.0
    np.testing.assert_allclose(lp.numpy(), expected_lp, rtol=1e-6)
    np.testing.assert_allclose(ent.numpy(), expected_ent, rtol=1e-6)
    assert np.isfinite(h_leaf.grad.numpy()).all()
    assert (h_leaf.grad.numpy()[mask == 0] == 0).all()
    for x, c in zip((ht, wt, yt, mt), copies):
        np.testing.assert_array_equal(x.numpy(), c)


def test_empty_mask_gives_zeros_with_graph():
    """No position counts: zeros, and backward still runs (gradient 0)."""
    hidden, weight, labels, _ = make(5)
    h = leaf(hidden)
    lp, ent = token_logprobs_from_hidden(h, t(weight), t(labels, "int64"), paddle.zeros([N, T], "int64"), with_entropy=True)
    assert float(paddle.abs(lp).sum()) == 0.0 and float(paddle.abs(ent).sum()) == 0.0
    lp.sum().backward()
    assert float(paddle.abs(h.grad).sum()) == 0.0


def test_no_grad_chunked_matches_full_logits():
    """Under no_grad (old / reference log-probs) the chunked loop gives the same values."""
    hidden, weight, labels, mask = make(6)
    with paddle.no_grad():
        lp, ent = token_logprobs_from_hidden(
            leaf(hidden, "float32"), leaf(weight, "float32"), t(labels, "int64"), t(mask, "int64"), chunk_size=2, with_entropy=True
        )
    ref_lp, ref_ent = full_reference(t(hidden), t(weight), t(labels, "int64"), t(mask, "int64"), 1.0, False)
    np.testing.assert_allclose(lp.numpy(), ref_lp.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ent.numpy(), ref_ent.numpy(), rtol=1e-4, atol=1e-5)
    assert lp.dtype == paddle.float32 and ent.dtype == paddle.float32
