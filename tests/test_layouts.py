"""The parallel layouts (`ppo.strategy`): chosen in one place (`choose_layout`), one folder each,
strategies composed of axis objects (none inherits another), old import paths still answering
with the same objects."""
from types import SimpleNamespace

import pytest

from ppo.strategy import LAYOUTS, FleetStrategy, PipelineStrategy, PlainStrategy, Ranks, Strategy, choose_layout
from ppo.strategy.hybrid import FleetAxes
from ppo.strategy.tensor import TensorAxis


def layout_args(pp=1, tp=1, hybrid=False):
    return SimpleNamespace(pipeline_parallel_degree=pp, tensor_parallel_degree=tp, use_hybrid_parallel=hybrid)


@pytest.mark.parametrize("args, world, layout", [
    (layout_args(), 1, "plain"),
    (layout_args(), 2, "plain"),  # data parallel alone: paddle.DataParallel
    (layout_args(hybrid=True), 1, "plain"),  # one process: nothing to wrap
    (layout_args(tp=2, hybrid=True), 2, "fleet"),
    (layout_args(hybrid=True), 4, "fleet"),  # sharding or data parallel under fleet
    (layout_args(pp=2, hybrid=True), 2, "pipeline"),
    (layout_args(pp=2, tp=2, hybrid=True), 4, "pipeline"),
])
def test_the_layout_is_chosen_from_the_arguments(args, world, layout):
    assert choose_layout(args, world) == layout and LAYOUTS[layout].name == layout


def test_no_strategy_inherits_another_and_each_composes_its_axes():
    for cls in (PlainStrategy, FleetStrategy, PipelineStrategy):
        assert cls.__bases__ == (Strategy,), cls
    fleet, pipe = FleetStrategy(Ranks()), PipelineStrategy(Ranks(), tensor_parallel=True)
    assert isinstance(fleet.fleet, FleetAxes) and isinstance(fleet.tensor, TensorAxis)
    assert isinstance(pipe.fleet, FleetAxes) and isinstance(pipe.tensor, TensorAxis) and pipe.tensor_parallel
    # one process, no fleet: every axis is off and the strategies act as the plain one
    for strategy in (fleet, pipe):
        assert strategy.gradient_groups() == (None, None) and strategy.generation_group() is None
        assert strategy.saves_models() and strategy.split_weight_sum([1.5, 2.0]) == 3.5
        model, optimizer = object(), object()
        assert strategy.wrap(model, optimizer) == (model, optimizer)


def test_old_import_paths_answer_with_the_moved_objects():
    from ppo.models import pipeline, reshard, tensor_parallel
    from ppo.strategy.data_order import DatasetOrderMixin
    from ppo.strategy.pipeline import pipe
    from ppo.strategy.tensor import reshard as moved_reshard
    from ppo.strategy.tensor.weights import save_pretrained_merged

    assert pipeline.load_pipe is pipe.load_pipe and reshard.merge is moved_reshard.merge
    assert tensor_parallel.DatasetOrderMixin is DatasetOrderMixin
    assert tensor_parallel.save_pretrained_merged is save_pretrained_merged
    from ppo import ppo_arguments, reward_client
    from ppo.entry.ppo_arguments import PPOTrainingArguments
    from ppo.serving.reward_client import RewardServerClient

    assert reward_client.RewardServerClient is RewardServerClient and ppo_arguments.PPOTrainingArguments is PPOTrainingArguments


@pytest.mark.parametrize("old,new", [("ppo.reward_client", "ppo.serving.reward_client"),
                                     ("ppo.ppo_arguments", "ppo.entry.ppo_arguments"),
                                     ("ppo.models.reshard", "ppo.strategy.tensor.reshard")])
def test_old_import_paths_warn_with_the_new_path(old, new):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        importlib.import_module(old)
