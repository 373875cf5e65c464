"""Fleet pipelines (`pipeline_parallel_degree > 1`, optionally with tensor parallel): every
model is split into stages over the pipeline group; the passes run fleet's schedules
(`ppo.passes.pipeline.PipelinePasses`), the gradient norm adds every stage's part, and a saved
model gathers every stage into one plain checkpoint."""
from .fleet import FleetStrategy


class PipelineStrategy(FleetStrategy):
    """Fleet pipelines (see the module docstring); `tensor_parallel`: whether each stage is also
    split over tensor-parallel ranks (the generation copy can then keep each rank's slices)."""

    name = "pipeline"

    def __init__(self, ranks=None, tensor_parallel=False):
        super().__init__(ranks)
        self.tensor_parallel = tensor_parallel

    def build_passes(self, models, actor, critics, optimizers, settings):
        from ..passes.pipeline import PipelinePasses

        return PipelinePasses(models, actor, critics, optimizers, temperature=settings.temperature,
                              micro_batches=settings.micro_batches, micro_rows=settings.micro_rows,
                              pad_token_id=settings.pad_token_id,
                              keep_tensor_parallel=settings.keep_tensor_parallel and self.tensor_parallel)

    def save_model(self, model, path, tokenizer=None):
        """Every stage gathered into one plain checkpoint (all ranks of the pipeline and
        model-parallel groups call this; the first writes)."""
        from ..models.loading import unwrap_parallel
        from ..models.pipeline import save_pipeline_merged

        save_pipeline_merged(unwrap_parallel(model), path)
        if tokenizer is not None and self.ranks.is_main:
            tokenizer.save_pretrained(path)
