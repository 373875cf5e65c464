"""An expert that no token reaches in a step is stepped the same way in an uninterrupted run, a
resumed one and one that releases its gradients (`ppo.optimization.stepped`): once the optimiser
holds its moments, AdamW moves it from a zero gradient.

The model: two "experts" (linear layers); step 1 routes the batch through both, steps 2 and 3
through expert 0 only, as a router that stops choosing an expert does."""
import numpy as np
import paddle

from ppo.optimization.optim import build_optimizer
from ppo.optimization.stepped import stepped_without_gradient, zero_missing_gradients
from ppo.strategy.plain import PlainStrategy

ROUTES = ((0, 1), (0,), (0,))  # the experts each step's tokens reach


class TwoExperts(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.experts = paddle.nn.LayerList([paddle.nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x, route):
        return sum(self.experts[e](x) for e in route)


def fresh(seed=3):
    paddle.seed(seed)
    model = TwoExperts()
    optimizer = build_optimizer(model, 1e-2, weight_decay=0.01, max_grad_norm=1.0, beta1=0.9, beta2=0.999, epsilon=1e-8)
    return model, optimizer


def train(model, optimizer, steps, release=False):
    strategy = PlainStrategy()
    for step in steps:
        x = paddle.to_tensor(np.linspace(-1, 1, 8, dtype="float32").reshape([2, 4]) * (step + 1))
        loss = model(x, ROUTES[step]).square().mean()
        loss.backward()
        bad, _ = strategy.optimizer_step(model, optimizer, float(loss), "actor", release_gradients=release)
        assert bad is None


def weights(model):
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def test_resumed_run_steps_an_unreached_expert_as_the_uninterrupted_one(tmp_path):
    with paddle.utils.unique_name.guard():
        straight, straight_opt = fresh()
        train(straight, straight_opt, range(3))
    with paddle.utils.unique_name.guard():
        first, first_opt = fresh()
        train(first, first_opt, range(1))
        paddle.save(first.state_dict(), str(tmp_path / "model.pdparams"))
        paddle.save(first_opt.state_dict(), str(tmp_path / "opt.pdopt"))
        after_one = weights(first)
    with paddle.utils.unique_name.guard():  # a new process: weights and moments from disk, no gradients
        resumed, resumed_opt = fresh(seed=11)
        resumed.set_state_dict(paddle.load(str(tmp_path / "model.pdparams")))
        resumed_opt.set_state_dict(paddle.load(str(tmp_path / "opt.pdopt")))
        train(resumed, resumed_opt, range(1, 3))
    a, b = weights(straight), weights(resumed)
    assert not np.array_equal(a["experts.1.weight"], after_one["experts.1.weight"])  # momentum moved it
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)


def test_released_gradients_step_like_kept_ones():
    runs = []
    for release in (False, True):
        with paddle.utils.unique_name.guard():
            model, optimizer = fresh()
            train(model, optimizer, range(3), release=release)
            runs.append(weights(model))
    for key in runs[0]:
        np.testing.assert_array_equal(runs[1][key], runs[0][key], err_msg=key)


def test_only_parameters_with_moments_get_a_zero_gradient():
    with paddle.utils.unique_name.guard():
        model, optimizer = fresh()
        assert stepped_without_gradient(optimizer) == []  # nothing stepped yet: nothing to keep
        model(paddle.ones([1, 4]), (0,)).sum().backward()
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)
        names = sorted(p.name for p in stepped_without_gradient(optimizer))
        assert names == sorted(p.name for p in model.experts[0].parameters())  # expert 1: never stepped
        assert zero_missing_gradients(optimizer) == 2
        assert all(float(p.grad.abs().sum()) == 0.0 for p in model.experts[0].parameters())
        assert all(p.grad is None for p in model.experts[1].parameters())


class ShardingWrapper:
    """The chain of a stage-1 sharding optimiser (`_inner_opt`: the optimiser of this rank's part);
    `expert_ids`: the parameters it neither reduces nor broadcasts (`ppo.strategy.expert.sharding`)."""

    def __init__(self, inner, expert_ids=None):
        self._inner_opt = inner
        if expert_ids is not None:
            self.expert_ids = frozenset(expert_ids)


def test_under_sharding_only_the_local_experts_get_a_zero_gradient():
    """Under sharding the rule holds for the parameters only this rank steps (its experts under
    expert parallelism); the others' gradients are reduced over the group, so none is made up."""
    with paddle.utils.unique_name.guard():
        model, optimizer = fresh()
        model(paddle.ones([1, 4]), (0, 1)).sum().backward()
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)  # every parameter stepped once, none has a gradient now
        assert stepped_without_gradient(ShardingWrapper(optimizer)) == []
        local = model.experts[0].parameters()
        found = stepped_without_gradient(ShardingWrapper(optimizer, [id(p) for p in local]))
        assert sorted(p.name for p in found) == sorted(p.name for p in local)
        assert len(stepped_without_gradient(optimizer)) == 4  # without sharding: both experts' weights and biases
