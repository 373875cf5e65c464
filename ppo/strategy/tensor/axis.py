"""The tensor axis: models whose layers are split over fleet's model-parallel group
(`tensor_parallel_degree > 1`). It knows the group, saves a split model as one merged
checkpoint, loads a merged state dict cut to this rank's slices, and adds up per-slice numbers
over the group. Every method is the plain one when the axis is off (no group)."""
from ...common.parallel_groups import model_parallel_group


class TensorAxis:
    """Tensor parallelism under fleet (see the module docstring)."""

    def group(self):
        """Fleet's model-parallel group, or None without tensor parallelism."""
        return model_parallel_group()

    def save_model(self, model, path):
        """Tensor-parallel slices merged into one checkpoint: every rank of rank 0's
        model-parallel group calls this, rank 0 writes."""
        from ...models.loading import unwrap_parallel
        from .weights import save_pretrained_merged

        save_pretrained_merged(unwrap_parallel(model), path)

    def load_weights(self, model, state_dict):
        """A merged state dict cut to this rank's tensor-parallel slices, then loaded."""
        from ...models.loading import unwrap_parallel
        from .weights import split_for_this_rank

        inner = unwrap_parallel(model)
        inner.set_state_dict(split_for_this_rank(inner, state_dict))

    def split_weight_sum(self, sums):
        """Tensor-parallel slices' `sums` (this rank's) added up to the whole weight's number over
        the model-parallel group."""
        import paddle
        import paddle.distributed as dist

        group = self.group()
        if not sums or group is None:
            return sum(sums)
        t = paddle.to_tensor([sum(sums)], dtype="float64")
        dist.all_reduce(t, group=group)
        return float(t.numpy()[0])
