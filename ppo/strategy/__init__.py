"""The run's parallel strategy (`ppo.strategy.base.Strategy`): plain (one process or
`paddle.DataParallel`), the tensor layout (`ppo.strategy.tensor`: fleet's tensor parallel,
sharding, data parallel) or the pipeline layout (`ppo.strategy.pipeline`), chosen in one place
(`choose_layout`) from the arguments and built by `build_strategy`; the strategy then loads the
models in its layout (`Strategy.load_models`). The axes over the layouts (`ppo.strategy.axes`:
`register_axis`) wrap the chosen layout's objects in registration order; the expert axis
(`ppo.strategy.expert`, registered when this package imports it) composes with the plain layout
and the tensor layout (tensor parallel, sharding stage 1).
The PaddleNLP-`Trainer` entry points (SFT, reward model, offline DPO family) get the same
layout's `Trainer` side from `trainer_strategy` (`ppo.strategy.trainer_layout`: the models
they load, the `Trainer` hooks of `LayoutTrainerMixin`, the pipeline's evaluation paths).
`tensor_model_problems`, `expert_layout_problems` and `expert_model_problems`: the tensor layout's
and the expert axis's refusals, for the argument checks (callers outside this package import them
from here, never from a layout folder)."""
from .axes import register_axis, with_axes, with_trainer_axes
from .base import PassSettings, Strategy, first_non_finite
from .expert.checks import layout_problems as expert_layout_problems, model_problems as expert_model_problems
from .pipeline import PipelineStrategy
from .pipeline.trainer import PipelineTrainerLayout
from .plain import PlainStrategy
from .ranks import Ranks
from .tensor import FleetStrategy
from .tensor.checks import model_problems as tensor_model_problems
from .trainer_layout import LayoutTrainerMixin, TrainerLayout

LAYOUTS = {"plain": PlainStrategy, "fleet": FleetStrategy, "pipeline": PipelineStrategy}
"""`{layout name: its strategy class}`; `choose_layout` picks one (`register_layout` adds one),
`build_strategy` builds it with `from_args(ranks, args)`."""
TRAINER_LAYOUTS = {"plain": TrainerLayout, "fleet": TrainerLayout, "pipeline": PipelineTrainerLayout}
"""`{layout name: its TrainerLayout class}`: the `Trainer` side of `LAYOUTS` (PaddleNLP's
`Trainer` runs fleet itself: the plain and the tensor layout load and step whole models alike)."""


def _pipelines(args, world_size):
    return args.pipeline_parallel_degree > 1


def _fleet(args, world_size):
    return world_size > 1 and args.use_hybrid_parallel


LAYOUT_RULES = [("pipeline", _pipelines), ("fleet", _fleet)]
"""`(layout name, chooses(args, world_size) -> bool)` in the order `choose_layout` asks them;
"plain" when none chooses."""


def choose_layout(args, world_size):
    """The layout name of PaddleNLP's `TrainingArguments` (`pipeline_parallel_degree`,
    `use_hybrid_parallel`, and what a registered layout reads) on `world_size` training
    processes: the one place a run's layout is decided."""
    return next((name for name, chooses in LAYOUT_RULES if chooses(args, world_size)), "plain")


def register_layout(name, strategy, trainer_layout, chooses):
    """Add a layout: its `Strategy` class (built as `strategy.from_args(ranks, args)`, by default
    `strategy(ranks)`), its `TrainerLayout` class (built as `trainer_layout(args)`) and
    `chooses(args, world_size) -> bool`, asked before the layouts already known. The registered
    axes wrap it as they wrap the plain layout."""
    if name in LAYOUTS:
        raise ValueError(f"parallel layout {name!r} is registered already")
    LAYOUTS[name], TRAINER_LAYOUTS[name] = strategy, trainer_layout
    LAYOUT_RULES.insert(0, (name, chooses))


def build_strategy(args):
    """The strategy of the run's arguments (PaddleNLP's `TrainingArguments` with its parallel
    layout: `pipeline_parallel_degree`, `use_hybrid_parallel`, `dataset_rank`, `dataset_world_size`):
    the chosen layout's (`Strategy.from_args`), wrapped by every registered axis the arguments ask for."""
    import paddle.distributed as dist

    world = getattr(args, "training_world_size", None) or dist.get_world_size()  # a split run's rollout rank: not in it
    ranks = Ranks(dist.get_rank(), world, args.dataset_rank, args.dataset_world_size)
    return with_axes(LAYOUTS[choose_layout(args, ranks.world_size)].from_args(ranks, args), args)


def trainer_strategy(args):
    """The `Trainer` side of the run's layout (a `TrainerLayout`, wrapped by every registered axis
    the arguments ask for: their groups built, collective), for PaddleNLP's `TrainingArguments`."""
    import paddle.distributed as dist

    return with_trainer_axes(TRAINER_LAYOUTS[choose_layout(args, dist.get_world_size())](args), args)


__all__ = ["FleetStrategy", "LAYOUTS", "LayoutTrainerMixin", "PassSettings", "PipelineStrategy", "PlainStrategy", "Ranks",
           "Strategy", "TRAINER_LAYOUTS", "TrainerLayout", "build_strategy", "choose_layout", "expert_layout_problems",
           "expert_model_problems", "first_non_finite", "register_axis", "register_layout", "tensor_model_problems", "trainer_strategy"]
