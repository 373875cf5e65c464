"""Expert parallelism (`expert_parallel_degree`): the experts of every mixture-of-experts layer
sharded over the ranks of an expert-parallel group, tokens exchanged with their experts' owners
(`exchange`), the layout and the model hook (`layout`), expert gradients (`grads`), the axis
composed with data parallelism (`strategy`) and its argument refusals (`checks`)."""
from .checks import expert_degree, layout_problems, model_problems
from .layout import ExpertLayout, expert_parameters, shard_experts, whole_experts
from .strategy import ExpertStrategy


def with_expert_axis(strategy, args):
    """`strategy` with the expert axis when the arguments ask for it (their groups built: collective)."""
    degree = expert_degree(args)
    if degree == 1:
        return strategy
    ranks = strategy.ranks
    return ExpertStrategy(strategy, ExpertLayout(degree, ranks.rank, ranks.world_size).build_groups())


__all__ = ["ExpertLayout", "ExpertStrategy", "expert_degree", "expert_parameters", "layout_problems", "model_problems",
           "shard_experts", "whole_experts", "with_expert_axis"]
