"""The run's parallel strategy (`ppo.strategy.base.Strategy`): plain (one process or
`paddle.DataParallel`), fleet (tensor parallel, sharding, data parallel) or pipeline, picked
once from the arguments by `build_strategy`; the expert axis (`ppo.strategy.expert`) composes
with the plain one."""
from .base import PassSettings, Strategy, first_non_finite
from .fleet import FleetStrategy
from .pipeline import PipelineStrategy
from .plain import PlainStrategy
from .ranks import Ranks


def build_strategy(args):
    """The strategy of the run's arguments (PaddleNLP's `TrainingArguments` with its parallel
    layout: `pipeline_parallel_degree`, `use_hybrid_parallel`, `dataset_rank`, `dataset_world_size`)."""
    import paddle.distributed as dist

    world = getattr(args, "training_world_size", None) or dist.get_world_size()  # a split run's rollout rank: not in it
    ranks = Ranks(dist.get_rank(), world, args.dataset_rank, args.dataset_world_size)
    if args.pipeline_parallel_degree > 1:
        return PipelineStrategy(ranks, tensor_parallel=args.tensor_parallel_degree > 1)
    if ranks.world_size > 1 and args.use_hybrid_parallel:
        return FleetStrategy(ranks)
    from .expert import with_expert_axis

    return with_expert_axis(PlainStrategy(ranks), args)


__all__ = ["FleetStrategy", "PassSettings", "PipelineStrategy", "PlainStrategy", "Ranks", "Strategy", "build_strategy",
           "first_non_finite"]
