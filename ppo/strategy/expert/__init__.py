"""Expert parallelism (`expert_parallel_degree`): the experts of every mixture-of-experts layer
sharded over the ranks of an expert-parallel group, tokens exchanged with their experts' owners
(`exchange`), the layout and the model hook (`layout`), expert gradients (`grads`), the axis
composed with data parallelism and tensor parallelism (`strategy`), its `Trainer` side for SFT
(`trainer`) and its argument refusals (`checks`)."""
from .checks import expert_degree, layout_problems, model_problems
from .layout import ExpertLayout, expert_parameters, shard_experts, whole_experts
from .strategy import ExpertStrategy


def with_expert_axis(strategy, args):
    """`strategy` with the expert axis when the arguments ask for it (their groups built: collective)."""
    degree = expert_degree(args)
    if degree == 1:
        return strategy
    return ExpertStrategy(strategy, expert_layout(args, strategy.ranks.rank, strategy.ranks.world_size).build_groups())


def expert_layout(args, rank, world):
    """The `ExpertLayout` of `args` for `rank` of `world` (groups not built yet): expert groups of
    data ranks, one set per tensor-parallel slice; its data rank must be the run's."""
    model_parallel = max(int(getattr(args, "tensor_parallel_degree", 1) or 1), 1)
    layout = ExpertLayout(expert_degree(args), rank, world, model_parallel)
    data_rank = getattr(args, "dataset_rank", layout.data_rank)
    if data_rank != layout.data_rank:
        raise RuntimeError(f"expert parallelism: rank {rank} reads data rank {data_rank}, the layout expects "
                           f"{layout.data_rank} (tensor_parallel_degree {model_parallel}); fleet's rank order differs")
    return layout


__all__ = ["ExpertLayout", "ExpertStrategy", "expert_degree", "expert_layout", "expert_parameters", "layout_problems", "model_problems",
           "shard_experts", "whole_experts", "with_expert_axis"]
