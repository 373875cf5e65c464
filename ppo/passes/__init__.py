"""The model passes of a PPO step behind one interface (`ModelPasses`): plain models
(`PlainPasses`), or fleet pipelines under `pipeline_parallel_degree > 1`
(`ppo.strategy.pipeline.passes.PipelinePasses`). The run's strategy (`ppo.strategy`) builds them."""
from .base import ModelPasses, UpdateLosses
from .plain import PlainPasses

__all__ = ["ModelPasses", "PlainPasses", "UpdateLosses"]
