"""Tests for ppo.algos.masked (masked reductions over response tokens)."""
import numpy as np
import paddle
import pytest

from ppo.algos import masked_mean, masked_sum, masked_var, masked_whiten

X = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
M = [[1, 1, 0, 0], [0, 1, 1, 0]]


def t(a, dtype="float64"):
    return paddle.to_tensor(np.asarray(a, dtype=dtype))


def test_masked_sum_and_mean_hand_computed():
    """Selected entries are 1, 2 (row 0) and 6, 7 (row 1).

    sum = 1 + 2 + 6 + 7 = 16; mean = 16 / 4 = 4;
    per row (axis=-1): sums [3, 13], means [1.5, 6.5].
    """
    x, m = t(X), t(M)
    np.testing.assert_allclose(masked_sum(x, m).numpy(), 16.0)
    np.testing.assert_allclose(masked_mean(x, m).numpy(), 4.0)
    np.testing.assert_allclose(masked_sum(x, m, axis=-1).numpy(), [3.0, 13.0])
    np.testing.assert_allclose(masked_mean(x, m, axis=-1).numpy(), [1.5, 6.5])


def test_masked_var_hand_computed():
    """Deviations of 1, 2, 6, 7 from the mean 4 are -3, -2, 2, 3; squares sum to 26.

    biased var = 26 / 4 = 6.5; unbiased var = 26 / 3.
    """
    x, m = t(X), t(M)
    np.testing.assert_allclose(masked_var(x, m, unbiased=False).numpy(), 6.5)
    np.testing.assert_allclose(masked_var(x, m).numpy(), 26.0 / 3.0)


def test_masked_whiten_hand_computed():
    """whiten = (x - 4) / sqrt(26/3 + eps) on masked tokens, 0 elsewhere.

    With shift_mean=False the mean 4 is added back on masked tokens (still 0 elsewhere).
    """
    x, m = t(X), t(M)
    s = np.sqrt(26.0 / 3.0 + 1e-8)
    expected = np.array([[-3 / s, -2 / s, 0, 0], [0, 2 / s, 3 / s, 0]])
    np.testing.assert_allclose(masked_whiten(x, m).numpy(), expected, rtol=1e-10)
    expected_noshift = np.where(np.asarray(M) == 1, expected + 4.0, 0.0)
    np.testing.assert_allclose(masked_whiten(x, m, shift_mean=False).numpy(), expected_noshift, rtol=1e-10)


def test_whitened_stats_are_zero_mean_unit_var():
    """Loop-versus-vectorised flavour: numpy statistics over the selected entries."""
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(4, 7))
    m = (rng.random((4, 7)) > 0.4).astype("float64")
    w = masked_whiten(t(x), t(m)).numpy()
    sel = w[m == 1]
    np.testing.assert_allclose(sel.mean(), 0.0, atol=1e-10)
    np.testing.assert_allclose(sel.var(ddof=1), 1.0, rtol=1e-6)
    ref = (x[m == 1] - x[m == 1].mean()) / np.sqrt(x[m == 1].var(ddof=1) + 1e-8)
    np.testing.assert_allclose(sel, ref, rtol=1e-10)


@pytest.mark.parametrize("mask_dtype", ["float32", "int64", "bool"])
def test_mask_dtypes_accepted(mask_dtype):
    """float, int and bool masks give the same answer (mean 4 from the hand example)."""
    x = t(X, "float32")
    m = paddle.to_tensor(np.asarray(M).astype(mask_dtype))
    np.testing.assert_allclose(masked_mean(x, m).numpy(), 4.0, rtol=1e-6)
    np.testing.assert_allclose(masked_var(x, m).numpy(), 26.0 / 3.0, rtol=1e-6)


@pytest.mark.parametrize("garbage", [1e6, np.nan, np.inf])
def test_garbage_at_masked_positions_is_ignored(garbage):
    """Replacing unselected entries by huge values, NaN or inf changes nothing."""
    x = np.asarray(X)
    m = np.asarray(M)
    g = np.where(m == 1, x, garbage)
    for fn in (masked_sum, masked_mean):
        np.testing.assert_allclose(fn(t(g), t(m)).numpy(), fn(t(x), t(m)).numpy())
        np.testing.assert_allclose(fn(t(g), t(m), axis=-1).numpy(), fn(t(x), t(m), axis=-1).numpy())
    np.testing.assert_allclose(masked_var(t(g), t(m)).numpy(), masked_var(t(x), t(m)).numpy())
    np.testing.assert_allclose(masked_whiten(t(g), t(m)).numpy(), masked_whiten(t(x), t(m)).numpy())


def test_empty_mask_gives_zero_not_nan():
    """An all-zero mask: mean 0, var 0, whiten all 0 (no division by zero)."""
    x, m = t(X), t(np.zeros((2, 4)))
    assert masked_mean(x, m).numpy() == 0.0
    assert masked_var(x, m).numpy() == 0.0
    assert np.all(masked_whiten(x, m).numpy() == 0.0)
    assert np.all(masked_mean(x, m, axis=-1).numpy() == 0.0)


def test_inputs_not_mutated():
    x, m = t(X), t(M)
    x0, m0 = x.numpy().copy(), m.numpy().copy()
    masked_sum(x, m)
    masked_mean(x, m, axis=-1)
    masked_var(x, m)
    masked_whiten(x, m, shift_mean=False)
    np.testing.assert_array_equal(x.numpy(), x0)
    np.testing.assert_array_equal(m.numpy(), m0)


def test_gradient_zero_at_masked_positions():
    """d masked_mean / d x = mask / sum(mask): 0.25 on the 4 selected tokens, 0 elsewhere."""
    x = t(X)
    x.stop_gradient = False
    masked_mean(x, t(M)).backward()
    np.testing.assert_allclose(x.grad.numpy(), np.asarray(M) * 0.25)


def test_pooled_statistics_over_two_halves_whiten_like_the_whole_batch():
    """The data-parallel reduction: each rank contributes (count, sum), then its centered square
    sum around the pooled mean; whitening each half with the pooled mean and the unbiased
    variance gives the whole batch's `masked_whiten`. Hand case: x = [1, 2, 3, 10] (mask drops
    10) split [1, 2] | [3, 10]: n = 3, mean = 2, squares 1 + 0 + 1 = 2, var = 2 / 2 = 1."""
    from ppo.algos import masked_centered_square_sum, whiten_with_statistics

    x = np.array([[1.0, 2.0], [3.0, 10.0]])
    m = np.array([[1.0, 1.0], [1.0, 0.0]])
    halves = [(t(x[i : i + 1]), t(m[i : i + 1])) for i in range(2)]
    count = sum(float(hm.sum()) for _, hm in halves)
    mean = sum(float(masked_sum(hx, hm)) for hx, hm in halves) / count
    squares = sum(float(masked_centered_square_sum(hx, hm, mean)) for hx, hm in halves)
    assert (count, mean, squares) == (3.0, 2.0, 2.0)
    var = squares / (count - 1)
    pooled = np.concatenate([whiten_with_statistics(hx, hm, mean, var).numpy() for hx, hm in halves])
    np.testing.assert_allclose(pooled, masked_whiten(t(x), t(m)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(pooled, [[-1 / np.sqrt(1 + 1e-8), 0.0], [1 / np.sqrt(1 + 1e-8), 0.0]], rtol=1e-12)
