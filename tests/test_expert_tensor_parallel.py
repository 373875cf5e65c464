"""Expert parallelism composed with tensor parallelism, in one process: the groups of a layout
(expert groups of data ranks, one set per tensor-parallel slice, in fleet's rank order), the
clip's global norm over both axes with four ranks as threads, and the refusals that remain. The
cold launches are in tests/test_expert_tensor_parallel_launch.py."""
import threading

import numpy as np
import paddle
import pytest

from ppo.strategy.expert.layout import ExpertLayout
from tests.test_expert_parallel import Args, ThreadComm, _in_threads


def test_tensor_parallel_layout_forms_expert_groups_per_slice_across_data_ranks():
    """Four processes, tensor parallel 2 (fleet: rank = data rank * 2 + slice), expert parallel 2:
    the data ranks are [0, 1] and [2, 3]; ranks 0 and 2 (slice 0) exchange tokens, as ranks 1
    and 3 (slice 1) do; each expert has one holder per slice (no gradient group)."""
    layouts = [ExpertLayout(2, rank, 4, model_parallel=2) for rank in range(4)]
    assert [(l.data_rank, l.mp_rank, l.group_rank) for l in layouts] == [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    assert [l.owned(4) for l in layouts] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert layouts[0].exchange_groups() == [[0, 2], [1, 3]] and layouts[0].gradient_groups() == []


def test_eight_processes_tensor_parallel_2_expert_parallel_2_data_parallel_2():
    """Eight processes (4 data ranks x 2 slices), expert parallel 2: expert groups of data ranks
    [0, 1] and [2, 3] for each slice, gradient groups of the data ranks holding the same experts
    ([0, 2], [1, 3]) for each slice; every rank in exactly one group of each kind."""
    layout = ExpertLayout(2, 5, 8, model_parallel=2)
    assert (layout.data_rank, layout.mp_rank, layout.owned(8)) == (2, 1, [0, 1, 2, 3])
    assert layout.exchange_groups() == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert layout.gradient_groups() == [[0, 4], [2, 6], [1, 5], [3, 7]]
    for groups in (layout.exchange_groups(), layout.gradient_groups()):
        assert sorted(r for g in groups for r in g) == list(range(8))
    plain = ExpertLayout(2, 3, 4)  # without tensor parallelism: as before
    assert plain.exchange_groups() == [[0, 1], [2, 3]] and plain.gradient_groups() == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="does not divide the 1 data-parallel ranks"):
        ExpertLayout(2, 0, 2, model_parallel=2)


def test_the_clip_sums_experts_over_both_axes_and_tensor_slices_over_the_slices():
    """Ranks 0..3 as threads (tensor parallel 2 x expert parallel 2): each holds a replicated
    gradient r (equal on all: 1), a tensor slice s (2 on slice 0, 4 on slice 1) and an expert
    slice e (its own on each rank: 1, 2, 3, 5). Global norm^2 = 1 + (4 + 16) + (1 + 4 + 9 + 25)
    = 60 on every rank, every gradient scaled by clip / sqrt(60)."""
    from ppo.strategy.expert.grads import ExpertClipGrad

    pairs = {name: ([None, None], threading.Barrier(2)) for name in ("ep0", "ep1", "mp0", "mp1")}
    experts = [1.0, 2.0, 3.0, 5.0]

    def rank(r, _):
        layout = ExpertLayout(2, r, 4, model_parallel=2)
        layout.comm = ThreadComm(pairs[f"ep{layout.mp_rank}"], layout.data_rank)
        shared, split, expert = (paddle.create_parameter([1], "float32") for _ in range(3))
        split.is_distributed = True
        clip = ExpertClipGrad(1.0, layout, [expert], data_world=2)
        clip.model_parallel = ThreadComm(pairs[f"mp{layout.data_rank}"], layout.mp_rank)
        out = clip._dygraph_clip([(shared, paddle.to_tensor([1.0])), (split, paddle.to_tensor([2.0 * (1 + r % 2)])),
                                  (expert, paddle.to_tensor([experts[r]]))])
        return [float(g.numpy()[0]) for _, g in out]

    scale = 1.0 / np.sqrt(60.0)
    for r, got in enumerate(_in_threads(rank, n=4)):
        np.testing.assert_allclose(got, [scale, 2.0 * (1 + r % 2) * scale, experts[r] * scale], rtol=1e-6)


def test_tensor_parallel_and_stage1_sharding_over_the_expert_group_are_accepted_others_not(monkeypatch):
    from ppo.strategy.expert.checks import layout_problems

    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    assert layout_problems(Args(expert_parallel_degree=2, tensor_parallel_degree=2)) == []
    assert layout_problems(Args(expert_parallel_degree=2, tensor_parallel_degree=4)) == [
        "expert_parallel_degree 2 does not divide the data-parallel ranks 1 (world size 4 / tensor_parallel_degree 4): "
        "the experts are split over data ranks"]
    stage1 = dict(expert_parallel_degree=2, sharding=["stage1"], sharding_parallel_degree=2)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    assert layout_problems(Args(**stage1)) == []
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    assert layout_problems(Args(**stage1, tensor_parallel_degree=2)) == []  # sharding group per tensor slice
    refused = ["expert_parallel_degree 2 with sharding other than stage1 over every data rank at sharding_parallel_degree = "
               "expert_parallel_degree: not supported yet (expert parallelism composes with data, tensor and stage-1 "
               "sharding parallelism only)"]
    assert layout_problems(Args(**stage1)) == refused  # data parallel 2 beside it
    assert layout_problems(Args(expert_parallel_degree=2, sharding=["stage2"], sharding_parallel_degree=2)) == refused
    assert layout_problems(Args(expert_parallel_degree=2, sharding=["stage1"], sharding_parallel_degree=4)) == refused
    assert layout_problems(Args(**stage1, tensor_parallel_degree=2, sharding_parallel_config="split_param")) == refused
    assert "pipeline_parallel_degree > 1: not supported yet" in layout_problems(
        Args(expert_parallel_degree=2, pipeline_parallel_degree=2))[0]


def test_stage1_sharding_leaves_each_ranks_experts_out_of_fleets_partition(monkeypatch):
    """Fleet's stage-1 partition puts the parameter at each position with one owner; the experts
    (other experts on each rank at the same positions) leave every part, join this rank's own
    part (the inner optimiser's parameter list, the same list object), and are neither reduced
    nor broadcast; the other parameters keep their owners."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import \
        DygraphShardingOptimizer

    from ppo.strategy.expert.sharding import ExpertShardingOptimizer, adopt_sharding_optimizer

    dense = [paddle.create_parameter([4], "float32") for _ in range(3)]
    experts = [paddle.create_parameter([4], "float32") for _ in range(2)]
    sharding = object.__new__(DygraphShardingOptimizer)
    own = [dense[1], experts[0]]
    sharding.__dict__.update(_rank2params={0: [dense[0], experts[1], dense[2]], 1: own}, _sharding_rank=1,
                             _param2rank={}, tensor_fusion=False, comm_overlap=False,
                             _hcg=type("Hcg", (), {"get_sharding_parallel_group": lambda self: "sharding group"})())
    wrapper = type("Hybrid", (), {})()
    wrapper._inner_opt = sharding
    assert adopt_sharding_optimizer(wrapper, experts) == "sharding group"
    assert type(sharding) is ExpertShardingOptimizer
    assert sharding._rank2params[0] == [dense[0], dense[2]] and sharding._rank2params[1] is own
    assert own == [dense[1], *experts] and {sharding._param2rank[p.name] for p in experts} == {1}
    seen = {}
    monkeypatch.setattr(DygraphShardingOptimizer, "reduce_gradients", lambda self, params, hcg: seen.update(reduce=params))
    monkeypatch.setattr(DygraphShardingOptimizer, "_sharding_sync_parameters",
                        lambda self: seen.update(broadcast={r: list(ps) for r, ps in self._rank2params.items()}))
    sharding.reduce_gradients([*dense, *experts], None)
    sharding._sharding_sync_parameters()
    assert seen["reduce"] == dense and seen["broadcast"] == {0: [dense[0], dense[2]], 1: [dense[1]]}
    assert sharding._rank2params[1] is own  # the experts stay in this rank's part for its step
