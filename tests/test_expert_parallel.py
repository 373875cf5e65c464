"""Expert parallelism's pieces in one process (`ppo.strategy.expert`): the token exchange run by
two threads standing for two ranks (their collectives meet at a barrier) against the one-process
MoE block (`ppo.models.families.moe.dispatch`), forward and backward; the expert ownership; the
gradient sync and the clip's norm. The multi-process runs are in tests/test_expert_parallel_launch.py."""
import threading

import numpy as np
import paddle
import pytest

from ppo.models.families.decoder import MLP
from ppo.models.families.moe import dispatch, route
from ppo.strategy.expert.exchange import exchange_dispatch
from ppo.strategy.expert.layout import ExpertLayout


class ThreadComm:
    """`GroupComm`'s two collectives between threads of one process: rank `rank` of `n`."""

    def __init__(self, shared, rank):
        self.shared, self.rank = shared, rank

    def _meet(self, x):
        slots, barrier = self.shared
        slots[self.rank] = x
        barrier.wait()
        seen = list(slots)
        barrier.wait()
        return seen

    def all_gather(self, x):
        seen = self._meet(x.detach().clone())
        return [x if r == self.rank else t for r, t in enumerate(seen)]

    def all_reduce(self, x):
        return paddle.add_n(self._meet(x.detach().clone()))

    def all_reduce_inplace(self, x):
        x.set_value(self.all_reduce(x))


class Config:
    hidden_size, intermediate_size, hidden_act = 8, 16, "silu"


def _model(num_experts=4, seed=0):
    paddle.seed(seed)
    return paddle.nn.Linear(8, num_experts, bias_attr=False), [MLP(Config, 16) for _ in range(num_experts)]


def _grads(layers):
    out = [None if p.grad is None else p.grad.numpy().copy() for layer in layers for p in layer.parameters()]
    for layer in layers:
        layer.clear_gradients()
    return out


def _one_process(gate, experts, xs, top_k):
    """The block on all rows; the router runs on each rank's rows as in the two-rank run (a
    matmul's last bits may depend on its row count, which is not the exchange's doing)."""
    xs = [x.clone() for x in xs]
    for x in xs:
        x.stop_gradient = False
    routed = [route(gate(x), top_k, True) for x in xs]
    weights, indices = (paddle.concat([r[i] for r in routed]) for i in (0, 1))
    out = dispatch(paddle.concat(xs), weights, indices, experts)
    (out * out).sum().backward()
    return out.numpy(), np.concatenate([x.grad.numpy() for x in xs]), _grads(experts), _grads([gate])


def _two_ranks(gate, experts, xs, top_k):
    """Each thread: its rows `xs[r]`, the experts `r * E/2 ...` only, the same loss."""
    shared, per = ([None, None], threading.Barrier(2, timeout=60)), len(experts) // 2
    outs, x_grads, errors = [None, None], [None, None], []

    def rank(r):
        try:
            x = xs[r].clone()
            x.stop_gradient = False
            weights, indices = route(gate(x), top_k, True)
            own = {e: experts[e] for e in range(r * per, (r + 1) * per)}
            out = exchange_dispatch(x, weights, indices, own, r, ThreadComm(shared, r))
            (out * out).sum().backward()
            outs[r], x_grads[r] = out.numpy(), x.grad.numpy()
        except Exception as error:  # surfaced below
            errors.append(error)
            shared[1].abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return np.concatenate(outs), np.concatenate(x_grads), _grads(experts), _grads([gate])


@pytest.mark.parametrize("rows", [(5, 3), (6, 0)])
def test_exchange_equals_the_one_process_block(rows):
    """Top-2 of 4 experts, 2 per rank, rank 1 with 0 rows in the second case: the outputs, the
    inputs' and the experts' gradients equal the one-process block's bit for bit (each token's
    two terms are added from zero in either layout; each expert sees the same rows in the same
    order); the router's gradient is summed over the two ranks' backward passes (rounding only)."""
    gate, experts = _model()
    paddle.seed(1)
    xs = [paddle.randn([n, 8]) for n in rows]
    ref_out, ref_dx, ref_expert, ref_gate = _one_process(gate, experts, xs, 2)
    out, dx, expert, gate_grad = _two_ranks(gate, experts, xs, 2)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(dx, ref_dx)
    for got, want in zip(expert, ref_expert):
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(gate_grad[0], ref_gate[0], rtol=0, atol=1e-6)
    assert np.abs(ref_gate[0]).max() > 1e-3  # the router does get a gradient through the exchange


def test_top3_differs_from_one_process_by_rounding_only():
    """With 3 experts per token the terms are grouped by rank before the sum: float rounding."""
    gate, experts = _model(num_experts=6, seed=3)
    paddle.seed(4)
    xs = [paddle.randn([7, 8]), paddle.randn([4, 8])]
    ref_out, ref_dx, _, _ = _one_process(gate, experts, xs, 3)
    out, dx, _, _ = _two_ranks(gate, experts, xs, 3)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-6)
    np.testing.assert_allclose(dx, ref_dx, rtol=0, atol=1e-6)


def test_layout_owns_consecutive_experts_inside_groups_carved_from_data_ranks():
    owned = [ExpertLayout(2, rank, 4).owned(8) for rank in range(4)]
    assert owned == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert ExpertLayout(4, 3, 4).owned(8) == [6, 7]
    with pytest.raises(ValueError, match="does not divide num_experts 6"):
        ExpertLayout(4, 0, 4).owned(6)
    with pytest.raises(ValueError, match="does not divide the 3 ranks"):
        ExpertLayout(2, 0, 3)
