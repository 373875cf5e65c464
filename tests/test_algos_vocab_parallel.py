"""Tests for ppo.algos.vocab_parallel: log-probs / entropy from vocabulary slices.

The model-parallel group is emulated in one process: each "rank" runs in its own thread
with its slice of the logits, and `all_reduce` meets the other thread at a barrier and
returns the reduction of both ranks' tensors."""
import math
import threading

import numpy as np
import paddle
import pytest

from ppo.algos import (
    entropy_from_logits,
    token_logprobs,
    token_logprobs_from_hidden,
    vocab_parallel_logprobs_from_hidden,
    vocab_parallel_token_logprobs,
)


class EmulatedGroup:
    """`all_reduce(t, op)` for `n` threads: every thread gets the max / sum of all inputs."""

    def __init__(self, n):
        self.n = n
        self.barrier = threading.Barrier(n)
        self.slots = [None] * n
        self.calls = 0

    def for_rank(self, rank):
        def all_reduce(t, op):
            before = t.numpy().copy()
            self.slots[rank] = before
            self.barrier.wait()
            stacked = np.stack(self.slots)
            self.barrier.wait()
            if rank == 0:
                self.calls += 1
            out = stacked.max(0) if op == "max" else stacked.sum(0)
            np.testing.assert_array_equal(t.numpy(), before)  # the input is not written into
            return paddle.to_tensor(out.astype(before.dtype))

        return all_reduce


def run_ranks(fn, n):
    """Run `fn(rank)` in `n` threads; returns their results in rank order (re-raises errors)."""
    results, errors = [None] * n, []

    def target(r):
        try:
            results[r] = fn(r)
        except BaseException as err:  # noqa: BLE001 - surfaced below
            errors.append(err)

    threads = [threading.Thread(target=target, args=(r,)) for r in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


def split_bounds(V, n):
    width = V // n
    return [(r * width, (r + 1) * width) for r in range(n)]


def sharded(logits, labels, n, with_entropy=True):
    """Per-rank (logp, entropy) numpy results from `n` vocabulary slices of `logits [M, V]`."""
    group = EmulatedGroup(n)
    bounds = split_bounds(logits.shape[1], n)

    def one(r):
        s, e = bounds[r]
        lp, ent = vocab_parallel_token_logprobs(
            paddle.to_tensor(logits[:, s:e]), paddle.to_tensor(labels), s, group.for_rank(r), with_entropy
        )
        return lp.numpy(), (ent.numpy() if ent is not None else None)

    return run_ranks(one, n), group


def test_hand_computed_four_token_vocab():
    """V = 4 in slices [0, 1 | 2, 3], z = [0, ln 3 | 0, ln 3]: sum exp z = 8, so
    p = [1/8, 3/8, 1/8, 3/8]; logp(y=3) = ln 3 - ln 8, logp(y=0) = -ln 8;
    H = ln 8 - (3/8 ln 3 + 3/8 ln 3) = ln 8 - 3/4 ln 3 on every row."""
    z = np.array([[0.0, math.log(3), 0.0, math.log(3)]] * 2)
    labels = np.array([3, 0])
    (r0, r1), group = sharded(z, labels, 2)
    expected_lp = [math.log(3) - math.log(8), -math.log(8)]
    expected_h = math.log(8) - 0.75 * math.log(3)
    for lp, ent in (r0, r1):  # both ranks hold the full answer
        np.testing.assert_allclose(lp, expected_lp, rtol=1e-12)
        np.testing.assert_allclose(ent, [expected_h, expected_h], rtol=1e-12)
    assert group.calls == 4  # max, sum-exp, label logit, expectation


@pytest.mark.parametrize("n", [1, 2, 4])
def test_matches_full_vocabulary(n):
    """Any split gives token_logprobs / entropy_from_logits of the full logits, even
    with a huge logit on one slice (the global max protects exp from overflow)."""
    rng = np.random.default_rng(n)
    z = rng.normal(size=(9, 12)) * 3
    z[0, 11] = 800.0  # exp(800) overflows float64 without the shared max
    labels = rng.integers(0, 12, size=9)
    labels[1] = 11  # the last slice owns it
    results, _ = sharded(z, labels, n)
    full_lp = token_logprobs(paddle.to_tensor(z), paddle.to_tensor(labels)).numpy()
    full_h = entropy_from_logits(paddle.to_tensor(z)).numpy()
    for lp, ent in results:
        np.testing.assert_allclose(lp, full_lp, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(ent, full_h, rtol=1e-10, atol=1e-10)
        assert np.isfinite(lp).all() and np.isfinite(ent).all()


def test_without_entropy_returns_none_and_same_logprobs():
    rng = np.random.default_rng(5)
    z, labels = rng.normal(size=(4, 6)), rng.integers(0, 6, size=4)
    with_h, _ = sharded(z, labels, 2, with_entropy=True)
    without, group = sharded(z, labels, 2, with_entropy=False)
    assert without[0][1] is None and group.calls == 3
    np.testing.assert_array_equal(with_h[0][0], without[0][0])


def test_gradients_match_full_vocabulary():
    """d(sum a*logp + b*H)/dz on each slice equals that slice of the full-vocabulary gradient."""
    rng = np.random.default_rng(7)
    M, V, n = 5, 8, 2
    z = rng.normal(size=(M, V))
    labels = rng.integers(0, V, size=M)
    a, b = rng.normal(size=M), rng.normal(size=M)
    full = paddle.to_tensor(z, stop_gradient=False)
    lp = token_logprobs(full, paddle.to_tensor(labels))
    loss = (paddle.to_tensor(a) * lp + paddle.to_tensor(b) * entropy_from_logits(full)).sum()
    loss.backward()
    expected = full.grad.numpy()
    group = EmulatedGroup(n)
    bounds = split_bounds(V, n)

    def one(r):
        s, e = bounds[r]
        part = paddle.to_tensor(z[:, s:e], stop_gradient=False)
        lp_r, h_r = vocab_parallel_token_logprobs(part, paddle.to_tensor(labels), s, group.for_rank(r), True)
        (paddle.to_tensor(a) * lp_r + paddle.to_tensor(b) * h_r).sum().backward()
        return part.grad.numpy()

    grads = run_ranks(one, n)
    np.testing.assert_allclose(np.concatenate(grads, axis=1), expected, rtol=1e-10, atol=1e-12)


def test_loop_matches_vectorised():
    """Row by row equals the batch (each row's reductions are independent)."""
    rng = np.random.default_rng(11)
    z, labels = rng.normal(size=(6, 10)), rng.integers(0, 10, size=6)
    results, _ = sharded(z, labels, 2)
    rows = [sharded(z[i : i + 1], labels[i : i + 1], 2)[0][0] for i in range(6)]
    np.testing.assert_allclose([r[0][0] for r in rows], results[0][0], rtol=1e-12)
    np.testing.assert_allclose([r[1][0] for r in rows], results[0][1], rtol=1e-12)


def test_inputs_not_mutated_and_float32_kept():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(3, 4)).astype("float32")
    labels = rng.integers(0, 4, size=3)
    zt, yt = paddle.to_tensor(z), paddle.to_tensor(labels)
    lp, ent = vocab_parallel_token_logprobs(zt, yt, 0, lambda t, op: t.clone(), True)
    np.testing.assert_array_equal(zt.numpy(), z)
    np.testing.assert_array_equal(yt.numpy(), labels)
    assert lp.dtype == paddle.float32 and ent.dtype == paddle.float32 and lp.shape == [3]


def test_label_outside_every_slice_is_not_silently_counted():
    """A label no slice owns contributes logit 0: logp = -lse (documented behaviour for the
    callers, which only pass real token ids); check it is that and finite."""
    z = np.zeros((1, 4))
    (r0, _), _ = sharded(z, np.array([2]), 2)
    np.testing.assert_allclose(r0[0], [-math.log(4)], rtol=1e-12)


def test_garbage_row_leaves_other_rows_alone():
    """Callers gather only counted positions, but a NaN row (an uncounted position passed by
    mistake) must not leak into the others: every reduction is per row."""
    rng = np.random.default_rng(13)
    z, labels = rng.normal(size=(4, 6)), rng.integers(0, 6, size=4)
    clean, _ = sharded(z, labels, 2)
    z_bad = z.copy()
    z_bad[2] = np.nan
    dirty, _ = sharded(z_bad, labels, 2)
    keep = [0, 1, 3]
    np.testing.assert_array_equal(dirty[0][0][keep], clean[0][0][keep])
    np.testing.assert_array_equal(dirty[0][1][keep], clean[0][1][keep])


def hidden_case(seed, transpose_y):
    rng = np.random.default_rng(seed)
    N, T, H, V = 3, 5, 4, 8
    hidden = rng.normal(size=(N, T, H))
    weight = rng.normal(size=(V, H) if transpose_y else (H, V))
    labels = rng.integers(0, V, size=(N, T))
    labels[1, 2] = -100
    mask = (rng.random((N, T)) > 0.3).astype("int64")
    hidden[mask == 0] = np.nan  # garbage where nothing counts
    return hidden, weight, labels, mask


@pytest.mark.parametrize("transpose_y", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk_size", [1, 3, 1000, 0])
def test_from_hidden_matches_single_rank_head_with_gradients(chunk_size, transpose_y):
    """Two vocabulary slices of the head, chunked, equal token_logprobs_from_hidden on the whole
    head at temperature 0.7 (both evaluate float32 logits): values, the weight gradient slice
    by slice, and the hidden-state gradient summed over ranks (the model-parallel identity's
    backward)."""
    hidden, weight, labels, mask = hidden_case(chunk_size + 7 * transpose_y, transpose_y)
    a = np.random.default_rng(1).normal(size=labels.shape)
    h = paddle.to_tensor(hidden, stop_gradient=False)
    w = paddle.to_tensor(weight, stop_gradient=False)
    lp, ent = token_logprobs_from_hidden(h, w, paddle.to_tensor(labels), paddle.to_tensor(mask), 0.7, 1000, transpose_y, True)
    (paddle.to_tensor(a) * (lp + 0.5 * ent)).sum().backward()
    group, n, axis = EmulatedGroup(2), 2, 0 if transpose_y else 1
    V = weight.shape[axis]

    def one(r):
        s, e = split_bounds(V, n)[r]
        h_r = paddle.to_tensor(hidden, stop_gradient=False)
        w_r = paddle.to_tensor(weight[s:e] if transpose_y else weight[:, s:e], stop_gradient=False)
        lp_r, ent_r = vocab_parallel_logprobs_from_hidden(
            h_r, w_r, paddle.to_tensor(labels), paddle.to_tensor(mask), s, group.for_rank(r), 0.7, chunk_size, transpose_y, True
        )
        (paddle.to_tensor(a) * (lp_r + 0.5 * ent_r)).sum().backward()
        return lp_r.numpy(), ent_r.numpy(), h_r.grad.numpy(), w_r.grad.numpy()

    results = run_ranks(one, n)
    counted = (labels >= 0) & (mask != 0)
    for lp_r, ent_r, _, _ in results:
        np.testing.assert_allclose(lp_r, lp.numpy(), rtol=2e-6, atol=1e-6)  # both float32 logits
        np.testing.assert_allclose(ent_r, ent.numpy(), rtol=2e-6, atol=1e-5)  # lse - E cancels
        assert (lp_r[~counted] == 0).all() and np.isfinite(lp_r).all()
    grad_h = sum(np.nan_to_num(r[2]) for r in results)
    np.testing.assert_allclose(grad_h[counted], h.grad.numpy()[counted], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([r[3] for r in results], axis=axis), w.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_from_hidden_nothing_counted_gives_zeros_without_collectives():
    group = EmulatedGroup(1)
    h = paddle.to_tensor(np.ones((2, 3, 4)))
    lp, ent = vocab_parallel_logprobs_from_hidden(
        h, paddle.to_tensor(np.ones((4, 5))), paddle.to_tensor(np.full((2, 3), -100)), None, 0, group.for_rank(0),
        with_entropy=True,
    )
    assert lp.shape == [2, 3] and (lp.numpy() == 0).all() and (ent.numpy() == 0).all() and group.calls == 0
