"""Fleet's fused data-parallel all-reduce needs the same gradient buffers on every rank; in a
mixture of experts an expert that no token of one rank reached has no gradient there.
`fill_unreached_gradients` gives it a zero gradient on that rank when another rank reached it,
and leaves an expert no rank reached without one (as one process does)."""
import paddle

from ppo.entry.moe_aux_trainer import has_experts
from ppo.strategy import grad_sync


class OtherRank:
    """A stand-in group of two ranks whose other rank reached the parameters at `reached`."""

    nranks = 2

    def __init__(self, reached):
        self.reached = reached


def test_an_expert_another_rank_reached_gets_a_zero_gradient_and_one_no_rank_reached_none(monkeypatch):
    params = [paddle.create_parameter([2, 3], "float32") for _ in range(4)]
    params[0].grad = paddle.ones([2, 3])  # reached here
    group = OtherRank([1, 1, 0, 0])  # the other rank reached experts 0 and 1

    def all_reduce(tensor, group=None):
        tensor.set_value(tensor + paddle.to_tensor(group.reached, dtype=tensor.dtype))

    monkeypatch.setattr(grad_sync.dist, "all_reduce", all_reduce)
    filled = grad_sync.fill_unreached_gradients(params, [group])
    assert filled == [params[1]]
    assert params[1].grad.shape == [2, 3] and float(paddle.abs(params[1].grad).sum()) == 0.0
    assert float(params[0].grad.sum()) == 6.0  # a gradient of its own is left as it is
    assert params[2].grad is None and params[3].grad is None


def test_without_data_parallel_ranks_nothing_is_exchanged(monkeypatch):
    monkeypatch.setattr(grad_sync.dist, "all_reduce", lambda *a, **k: (_ for _ in ()).throw(AssertionError("no collective")))
    params = [paddle.create_parameter([2], "float32")]
    assert grad_sync.fill_unreached_gradients(params, []) == []
    assert params[0].grad is None


def test_the_mixture_of_experts_families_are_the_ones_filled():
    from types import SimpleNamespace

    def model(model_type):
        return SimpleNamespace(config=SimpleNamespace(model_type=model_type))

    assert all(has_experts(model(t)) for t in ("qwen3_moe", "qwen2_moe", "mixtral", "ernie4_5_moe"))
    assert not any(has_experts(model(t)) for t in ("llama", "qwen2", "qwen3", "ernie4_5", "unknown"))
    assert not has_experts(SimpleNamespace())
