"""Expert parallelism (`expert_parallel_degree`): the experts of every mixture-of-experts layer
sharded over the ranks of an expert-parallel group, tokens exchanged with their experts' owners
(`exchange`), the layout and the model hook (`layout`), expert gradients (`grads`), the axis
composed with data parallelism and tensor parallelism (`strategy`), its `Trainer` side for SFT
(`trainer`) and its argument refusals (`checks`). Importing the package registers the axis
(`ppo.strategy.axes.register_axis`), after the axes registered before it."""
from ..axes import register_axis
from .checks import expert_degree, layout_problems, model_problems
from .layout import ExpertLayout, expert_layout, expert_parameters, shard_experts, whole_experts
from .strategy import ExpertStrategy


def with_expert_axis(strategy, args):
    """`strategy` with the expert axis when the arguments ask for it (their groups built: collective)."""
    degree = expert_degree(args)
    if degree == 1:
        return strategy
    return ExpertStrategy(strategy, expert_layout(args, strategy.ranks.rank, strategy.ranks.world_size).build_groups())


def with_expert_trainer_axis(layout, args):
    """`layout` (a `TrainerLayout`) with the expert axis when the arguments ask for it
    (`ppo.strategy.expert.trainer`, imported when used)."""
    from .trainer import with_expert_trainer_axis as wrap

    return wrap(layout, args)


register_axis("expert", with_expert_axis, with_expert_trainer_axis, lambda args: expert_degree(args) > 1)

__all__ = ["ExpertLayout", "ExpertStrategy", "expert_degree", "expert_layout", "expert_parameters", "layout_problems", "model_problems",
           "shard_experts", "whole_experts", "with_expert_axis",
           "with_expert_trainer_axis"]
