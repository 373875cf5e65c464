"""Tests for ppo.algos.distill and ppo.algos.distill_hidden: GKD's generalised JSD.

Hand-derived cases on a two-token vocabulary (t = teacher, s = student probabilities):

* t = (1/2, 1/2), s = (1/4, 3/4).
  beta = 0 (forward KL(T || S)): 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3).
  beta = 1 (reverse KL(S || T)): 1/4 ln(1/2) + 3/4 ln(3/2) = 3/4 ln 3 - ln 2.
  beta = 1/2: m = (3/8, 5/8); KL(T || M) = 1/2 ln(4/3) + 1/2 ln(4/5) = 1/2 ln(16/15);
  KL(S || M) = 1/4 ln(2/3) + 3/4 ln(6/5); JSD = 1/2 KL(T || M) + 1/2 KL(S || M).
* Gradients with respect to the student logits z (s = softmax z), from dJ/dz = h - s sum h:
  beta = 0: s - t = (-1/4, 1/4);
  beta = 1: s (log(s/t) - KL(S||T)): ( 1/4 (ln(1/2) - K), 3/4 (ln(3/2) - K) ), K = 3/4 ln 3 - ln 2;
  beta = 1/2: (1/2) s (log(s/m) - KL(S||M)).
"""
import math

import numpy as np
import paddle
import pytest

from ppo.algos import (
    TeacherHead,
    TeacherTopK,
    generalized_jsd,
    generalized_jsd_grad,
    generalized_jsd_top_k,
    gjsd_from_hidden,
    teacher_top_k,
    teacher_top_k_from_hidden,
    top_k_grad,
)

LN = math.log


def t64(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def leaf(a):
    x = t64(a)
    x.stop_gradient = False
    return x


TWO_T = [LN(0.5), LN(0.5)]  # teacher logits: (1/2, 1/2)
TWO_S = [LN(0.25), LN(0.75)]  # student logits: (1/4, 3/4)
K_REV = 0.75 * LN(3) - LN(2)
KL_SM = 0.25 * LN(2 / 3) + 0.75 * LN(6 / 5)
HAND = {
    0.0: 0.5 * LN(4 / 3),
    1.0: K_REV,
    0.5: 0.5 * (0.5 * LN(16 / 15)) + 0.5 * KL_SM,
}
HAND_GRAD = {
    0.0: [-0.25, 0.25],
    1.0: [0.25 * (LN(0.5) - K_REV), 0.75 * (LN(1.5) - K_REV)],
    0.5: [0.5 * 0.25 * (LN(0.25 / 0.375) - KL_SM), 0.5 * 0.75 * (LN(0.75 / 0.625) - KL_SM)],
}


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_hand_derived_two_token_values_and_gradients(beta):
    z = leaf([TWO_S])
    value = generalized_jsd(z, t64([TWO_T]), beta)
    np.testing.assert_allclose(value.numpy(), [HAND[beta]], rtol=1e-12)
    value.sum().backward()
    np.testing.assert_allclose(z.grad.numpy()[0], HAND_GRAD[beta], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(generalized_jsd_grad(t64([TWO_S]), t64([TWO_T]), beta).numpy()[0], HAND_GRAD[beta],
                               rtol=1e-10, atol=1e-14)


def test_ends_match_trl_convention_and_middle_vanishes_near_them():
    """beta = 0 is KL(teacher || student) and beta = 1 is KL(student || teacher), as TRL's
    F.kl_div(student_log_probs, teacher_log_probs) and F.kl_div(teacher_log_probs,
    student_log_probs); the middle form is ~ beta KL(T || S) near 0 and ~ (1 - beta) KL(S || T)
    near 1 (it does not reach the ends' values)."""
    s, t = t64([TWO_S]), t64([TWO_T])
    eps = 1e-4
    np.testing.assert_allclose(generalized_jsd(s, t, eps).numpy() / eps, [HAND[0.0]], rtol=1e-3)
    np.testing.assert_allclose(generalized_jsd(s, t, 1 - eps).numpy() / eps, [HAND[1.0]], rtol=1e-3)
    assert float(generalized_jsd(s, t, 0.0)) != pytest.approx(float(generalized_jsd(s, t, 1.0)))


def test_temperature_divides_both_logits_and_the_gradient():
    """J(z / tau) with the gradient chain rule: d/dz = (dJ/dz')(1 / tau)."""
    rng = np.random.default_rng(3)
    zs, zt = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    tau = 2.5
    z = leaf(zs)
    value = generalized_jsd(z, t64(zt), 0.3, temperature=tau)
    np.testing.assert_allclose(value.numpy(), generalized_jsd(t64(zs / tau), t64(zt / tau), 0.3).numpy(), rtol=1e-12)
    value.sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), generalized_jsd_grad(t64(zs), t64(zt), 0.3, tau).numpy(), rtol=1e-9,
                               atol=1e-13)


@pytest.mark.parametrize("beta", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_closed_form_gradient_equals_autograd_and_finite_differences(beta):
    rng = np.random.default_rng(int(beta * 10))
    zs, zt = rng.normal(size=(3, 5)) * 2, rng.normal(size=(3, 5)) * 2
    z = leaf(zs)
    generalized_jsd(z, t64(zt), beta).sum().backward()
    closed = generalized_jsd_grad(t64(zs), t64(zt), beta).numpy()
    np.testing.assert_allclose(z.grad.numpy(), closed, rtol=1e-9, atol=1e-12)
    step, numeric = 1e-6, np.zeros_like(zs)
    for i in np.ndindex(zs.shape):
        up, down = zs.copy(), zs.copy()
        up[i] += step
        down[i] -= step
        numeric[i] = (float(generalized_jsd(t64(up), t64(zt), beta).sum())
                      - float(generalized_jsd(t64(down), t64(zt), beta).sum())) / (2 * step)
    np.testing.assert_allclose(closed, numeric, rtol=1e-5, atol=1e-8)


def test_divergence_properties():
    """Zero iff the distributions agree; non-negative; the middle form is symmetric at 1/2."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(8, 9)), rng.normal(size=(8, 9))
    for beta in (0.0, 0.3, 0.5, 1.0):
        assert (generalized_jsd(t64(a), t64(b), beta).numpy() > 0).all()
        np.testing.assert_allclose(generalized_jsd(t64(a), t64(a + 3.0), beta).numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(generalized_jsd(t64(a), t64(b), 0.5).numpy(), generalized_jsd(t64(b), t64(a), 0.5).numpy(),
                               rtol=1e-12)


def test_beta_outside_unit_interval_is_refused():
    with pytest.raises(ValueError, match="beta must be in"):
        generalized_jsd(t64([TWO_S]), t64([TWO_T]), 1.5)


# ---------------------------------------------------------------- top-k teacher


def test_top_k_hand_case_three_tokens():
    """V = 3, t = (1/2, 1/3, 1/6), s = (1/3, 1/3, 1/3), k = 1: outcomes {0, rest}:
    T = (1/2, 1/2), S = (1/3, 2/3); forward KL = 1/2 ln(3/2) + 1/2 ln(3/4)."""
    zt, zs = t64([[LN(1 / 2), LN(1 / 3), LN(1 / 6)]]), t64([[0.0, 0.0, 0.0]])
    idx, logp, rest = teacher_top_k(zt, 1)
    assert idx.numpy().tolist() == [[0]]
    np.testing.assert_allclose(logp.numpy(), [[LN(0.5)]], rtol=1e-12)
    np.testing.assert_allclose(rest.numpy(), [LN(0.5)], rtol=1e-12)
    value = generalized_jsd_top_k(zs, idx, logp, rest, 0.0)
    np.testing.assert_allclose(value.numpy(), [0.5 * LN(1.5) + 0.5 * LN(0.75)], rtol=1e-12)
    full = generalized_jsd(zs, zt, 0.0)
    assert float(value) < float(full)  # coarse-grained: never above the full divergence


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_top_k_equals_full_when_the_tail_ratio_is_constant(beta):
    """Student tail proportional to the teacher tail (s_v = c t_v outside the top-k): merging the
    tail loses nothing, so the top-k divergence equals the full one; otherwise it is lower."""
    rng = np.random.default_rng(1)
    V, k = 10, 3
    t = rng.dirichlet(np.ones(V), size=4)
    order = np.argsort(-t, axis=-1)
    s = t.copy()
    for row in range(4):
        head = order[row, :k]
        s[row, head] = rng.dirichlet(np.ones(k)) * 0.5  # top-k changed freely
        tail = order[row, k:]
        s[row, tail] = t[row, tail] / t[row, tail].sum() * 0.5  # tail: the teacher's shape, scaled
    idx, logp, rest = teacher_top_k(t64(np.log(t)), k)
    np.testing.assert_allclose(generalized_jsd_top_k(t64(np.log(s)), idx, logp, rest, beta).numpy(),
                               generalized_jsd(t64(np.log(s)), t64(np.log(t)), beta).numpy(), rtol=1e-10)
    other = rng.dirichlet(np.ones(V), size=4)
    assert (generalized_jsd_top_k(t64(np.log(other)), idx, logp, rest, beta).numpy()
            < generalized_jsd(t64(np.log(other)), t64(np.log(t)), beta).numpy()).all()


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_top_k_closed_form_gradient_equals_autograd(beta):
    rng = np.random.default_rng(7)
    zs, zt = rng.normal(size=(5, 8)) * 2, rng.normal(size=(5, 8)) * 2
    idx, logp, rest = teacher_top_k(t64(zt), 3, temperature=1.5)
    z = leaf(zs)
    generalized_jsd_top_k(z, idx, logp, rest, beta, temperature=1.5).sum().backward()
    np.testing.assert_allclose(top_k_grad(t64(zs), idx, logp, rest, beta, 1.5).numpy(), z.grad.numpy(), rtol=1e-9,
                               atol=1e-12)
    assert (np.abs(z.grad.numpy()) > 0).all()  # tokens outside the top-k get gradient too


def test_top_k_bounds():
    with pytest.raises(ValueError, match="0 < k < vocabulary"):
        teacher_top_k(t64([[0.0, 1.0, 2.0]]), 3)


# ---------------------------------------------------------------- chunked, from hidden states

N, T, H, HT, V = 3, 6, 4, 5, 11


def hidden_case(seed=0, transpose_y=False):
    rng = np.random.default_rng(seed)
    h, ht = rng.normal(size=(N, T, H)), rng.normal(size=(N, T, HT))
    w = rng.normal(size=(V, H) if transpose_y else (H, V))
    wt = rng.normal(size=(HT, V))
    labels = rng.integers(0, V, size=(N, T))
    mask = (rng.random((N, T)) > 0.3).astype("int64")
    mask[0] = 1
    return h, w, ht, wt, labels, mask


def full_logits_reference(h, w, ht, wt, mask, beta, temperature, transpose_y, top_k=0):
    """The plain path: full [N, T, V] logits of both models, then the divergence, masked."""
    hs = leaf(h)
    ws = leaf(w)
    zs = paddle.matmul(hs, ws, transpose_y=transpose_y)
    zt = paddle.matmul(t64(ht), t64(wt))
    if top_k:
        idx, logp, rest = teacher_top_k(zt, top_k, temperature)
        value = generalized_jsd_top_k(zs, idx, logp, rest, beta, temperature)
    else:
        value = generalized_jsd(zs, zt, beta, temperature)
    value = value * t64(mask)
    (value * t64(np.arange(N * T).reshape(N, T) % 3 + 1.0)).sum().backward()  # unequal token weights
    return value.numpy(), hs.grad.numpy(), ws.grad.numpy()


@pytest.mark.parametrize("top_k", [0, 4])
@pytest.mark.parametrize("chunk_size", [1, 5, 1000, 0])
@pytest.mark.parametrize("transpose_y", [False, True], ids=["untied", "tied"])
def test_chunked_equals_full_logits(top_k, chunk_size, transpose_y):
    h, w, ht, wt, labels, mask = hidden_case(1, transpose_y)
    beta, temperature = 0.3, 1.7
    ref, ref_gh, ref_gw = full_logits_reference(h, w, ht, wt, mask, beta, temperature, transpose_y, top_k)
    hs, ws = leaf(h), leaf(w)
    if top_k:
        teacher, _ = teacher_top_k_from_hidden(t64(ht), t64(wt), t64(labels, "int64"), t64(mask, "int64"), top_k,
                                               temperature, chunk_size=2)
    else:
        teacher = TeacherHead(t64(ht), t64(wt))
    value = gjsd_from_hidden(hs, ws, t64(labels, "int64"), t64(mask, "int64"), teacher, beta, temperature, chunk_size,
                             transpose_y)
    np.testing.assert_allclose(value.numpy(), ref, rtol=2e-5, atol=1e-6)
    (value * t64(np.arange(N * T).reshape(N, T) % 3 + 1.0, "float32")).sum().backward()
    np.testing.assert_allclose(hs.grad.numpy(), ref_gh, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(ws.grad.numpy(), ref_gw, rtol=2e-4, atol=1e-5)


def test_masked_garbage_changes_nothing_and_inputs_are_not_mutated():
    h, w, ht, wt, labels, mask = hidden_case(2)
    args = dict(beta=0.5, temperature=1.0, chunk_size=3)
    clean = gjsd_from_hidden(t64(h), t64(w), t64(labels, "int64"), t64(mask, "int64"), TeacherHead(t64(ht), t64(wt)),
                             **args).numpy()
    dirty_h, dirty_ht, dirty_labels = h.copy(), ht.copy(), labels.copy()
    dirty_h[mask == 0] = np.nan
    dirty_ht[mask == 0] = np.inf
    dirty_labels[mask == 0] = 10**6  # an id far out of the vocabulary
    inputs = [t64(dirty_h), t64(w), t64(dirty_labels, "int64"), t64(mask, "int64")]
    before = [x.numpy().copy() for x in inputs]
    dirty = gjsd_from_hidden(*inputs, TeacherHead(t64(dirty_ht), t64(wt)), **args).numpy()
    np.testing.assert_array_equal(clean, dirty)
    assert (dirty[mask == 0] == 0).all() and (dirty[mask == 1] > 0).all()
    for x, b in zip(inputs, before):
        np.testing.assert_array_equal(x.numpy(), b)


def test_loop_equals_vectorised():
    """Row by row (one sequence at a time) equals the whole batch."""
    h, w, ht, wt, labels, mask = hidden_case(4)
    whole = gjsd_from_hidden(t64(h), t64(w), t64(labels, "int64"), t64(mask, "int64"), TeacherHead(t64(ht), t64(wt)),
                             0.7, 1.3, 4).numpy()
    rows = [gjsd_from_hidden(t64(h[i:i + 1]), t64(w), t64(labels[i:i + 1], "int64"), t64(mask[i:i + 1], "int64"),
                             TeacherHead(t64(ht[i:i + 1]), t64(wt)), 0.7, 1.3, 4).numpy()[0] for i in range(N)]
    np.testing.assert_allclose(whole, np.stack(rows), rtol=1e-6)


def test_teacher_top_k_from_hidden_label_logprobs_and_order():
    h, w, ht, wt, labels, mask = hidden_case(5)
    top, label_logp = teacher_top_k_from_hidden(t64(ht), t64(wt), t64(labels, "int64"), t64(mask, "int64"), 2, 2.0,
                                                chunk_size=3)
    z = (ht @ wt) / 2.0
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    expect = np.take_along_axis(logp, labels[..., None], -1)[..., 0] * mask
    np.testing.assert_allclose(label_logp.numpy(), expect, rtol=1e-5, atol=1e-6)
    counted = logp[mask == 1]
    np.testing.assert_allclose(top.logprobs.numpy(), -np.sort(-counted, -1)[:, :2], rtol=1e-5)
    assert isinstance(top, TeacherTopK) and top.indices.shape == [int(mask.sum()), 2]


def test_nothing_counted_gives_zeros_in_the_graph():
    h, w, ht, wt, labels, mask = hidden_case(6)
    hs = leaf(h)
    value = gjsd_from_hidden(hs, t64(w), t64(labels, "int64"), t64(np.zeros_like(mask), "int64"),
                             TeacherHead(t64(ht), t64(wt)))
    assert value.shape == [N, T] and float(paddle.abs(value).sum()) == 0.0
    value.sum().backward()
