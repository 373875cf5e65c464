"""Fleet pipelines (`pipeline_parallel_degree > 1`, optionally with tensor parallel): every
model is split into stages over the pipeline group; the passes run fleet's schedules
(`ppo.strategy.pipeline.passes.PipelinePasses`), the gradient norm adds every stage's part, and
a saved model gathers every stage into one plain checkpoint. Composed of `FleetAxes` (data x
sharding), a `TensorAxis` and the pipeline axis; it loads the models as pipes
(`ppo.strategy.pipeline.models`)."""
from ...common.parallel_groups import pipeline_group
from ..base import Strategy
from ..hybrid import FleetAxes
from ..tensor.axis import TensorAxis


class PipelineStrategy(Strategy):
    """Fleet pipelines (see the module docstring); `tensor_parallel`: whether each stage is also
    split over tensor-parallel ranks (the generation copy can then keep each rank's slices)."""

    name = "pipeline"

    def __init__(self, ranks=None, tensor_parallel=False):
        super().__init__(ranks)
        self.fleet, self.tensor = FleetAxes(self.ranks), TensorAxis()
        self.tensor_parallel = tensor_parallel

    @classmethod
    def from_args(cls, ranks, args):
        return cls(ranks, tensor_parallel=args.tensor_parallel_degree > 1)

    def wrap(self, model, optimizer):
        return self.fleet.wrap(model, optimizer)

    def build_passes(self, models, actor, critics, optimizers, settings):
        from .passes import PipelinePasses

        return PipelinePasses(models, actor, critics, optimizers, temperature=settings.temperature,
                              micro_batches=settings.micro_batches, micro_rows=settings.micro_rows,
                              pad_token_id=settings.pad_token_id,
                              keep_tensor_parallel=settings.keep_tensor_parallel and self.tensor_parallel)

    def gradient_groups(self):
        return self.tensor.group(), pipeline_group()

    def saves_models(self):
        return self.fleet.saves_models(self.gradient_groups())

    def save_model(self, model, path, tokenizer=None):
        """Every stage gathered into one plain checkpoint (all ranks of the pipeline and
        model-parallel groups call this; the first writes)."""
        from ...models.loading import unwrap_parallel
        from .pipe import save_pipeline_merged

        save_pipeline_merged(unwrap_parallel(model), path)
        if tokenizer is not None and self.ranks.is_main:
            tokenizer.save_pretrained(path)

    def save_trainer_model(self, trainer, path, merge_tensor_parallel=None):
        """Every stage (tensor-parallel slices merged) gathered into one plain checkpoint."""
        from .pipe import save_pipeline_merged

        save_pipeline_merged(trainer.model, path)

    def load_weights(self, model, state_dict):
        self.tensor.load_weights(model, state_dict)

    def generation_group(self):
        return self.tensor.group()

    def split_weight_sum(self, sums):
        return self.tensor.split_weight_sum(sums)

    def generation_copy(self, model):
        """A plain copy of the pipe `model` (built once, kept), filled with all its stages for the
        block and released after it."""
        from .policy_pipe import gathered_into, plain_copy_of

        if getattr(self, "_generation_copy", None) is None:
            self._generation_copy = plain_copy_of(model)
        return gathered_into(self._generation_copy, model)

    def load_models(self, model_args, use_critic, dtype="float32", **extra):
        """The run's `PPOModels` as pipes (`ppo.strategy.pipeline.models.build_ppo_pipes`)."""
        from .models import build_ppo_pipes

        return build_ppo_pipes(model_args, use_critic, dtype, **extra)

    def log_settings(self, args):
        from .pipe import log_pipeline_settings

        log_pipeline_settings(args)
