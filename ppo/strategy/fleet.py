"""Fleet's hybrid parallelism without pipelines: tensor parallel, sharding and data parallel
through `fleet.distributed_model` / `fleet.distributed_optimizer`. The models still run whole
layers in every process (`PlainPasses`); fleet's optimiser syncs the gradients inside its step,
so `prepare_step` runs that sync first (`ppo.strategy.grad_sync`); a tensor-parallel model is
saved with its slices merged and loaded back cut to this rank's slices."""
from .plain import PlainStrategy


class FleetStrategy(PlainStrategy):
    """Tensor parallel, sharding and data parallel under fleet (see the module docstring)."""

    name = "fleet"

    def wrap(self, model, optimizer):
        if model is None or self.ranks.world_size == 1:
            return model, optimizer
        from paddle.distributed import fleet

        return fleet.distributed_model(model), fleet.distributed_optimizer(optimizer)

    def gradient_groups(self):
        from ..models.pipeline import pipeline_group
        from ..models.tensor_parallel import model_parallel_group

        return model_parallel_group(), pipeline_group()

    def saves_models(self):
        """Rank 0, and with tensor or pipeline parallelism every rank holding a part of rank 0's
        copy of the model (the merge gathers from them): data-parallel and sharding rank 0."""
        if self.gradient_groups() == (None, None):
            return self.ranks.is_main
        from paddle.distributed import fleet

        hcg = fleet.get_hybrid_communicate_group()
        return hcg.get_data_parallel_rank() == 0 and hcg.get_sharding_parallel_rank() == 0

    def save_model(self, model, path, tokenizer=None):
        """Tensor-parallel slices merged into one checkpoint: every rank of rank 0's
        model-parallel group calls this, rank 0 writes."""
        from ..models.loading import unwrap_parallel
        from ..models.tensor_parallel import save_pretrained_merged

        save_pretrained_merged(unwrap_parallel(model), path)
        if tokenizer is not None and self.ranks.is_main:
            tokenizer.save_pretrained(path)

    def load_weights(self, model, state_dict):
        """A merged state dict cut to this rank's tensor-parallel slices, then loaded."""
        from ..models.loading import unwrap_parallel
        from ..models.tensor_parallel import split_for_this_rank

        inner = unwrap_parallel(model)
        inner.set_state_dict(split_for_this_rank(inner, state_dict))

    def generation_group(self):
        from ..models.tensor_parallel import model_parallel_group

        return model_parallel_group()

    def split_weight_sum(self, sums):
        """Tensor-parallel slices add up to the whole weight's number over the model-parallel group."""
        import paddle
        import paddle.distributed as dist

        group = self.gradient_groups()[0]
        if not sums or group is None:
            return sum(sums)
        t = paddle.to_tensor([sum(sums)], dtype="float64")
        dist.all_reduce(t, group=group)
        return float(t.numpy()[0])
