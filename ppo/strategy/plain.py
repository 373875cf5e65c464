"""One process, or data parallel alone (`paddle.DataParallel` all-reduces the gradients in
the backward pass): the models run whole in every process (`ppo.passes.plain.PlainPasses`).
A split run's trainer ranks are data parallel over their own process group (`training_group`)."""
import functools

from ..common.training_world import training_group
from .base import Strategy, whole_model_passes


def data_parallel(model, find_unused_parameters, group):
    """`paddle.DataParallel(model)` over `group` (None: the default group). Paddle 3.3's constructor
    broadcasts the parameters over the default group whatever `group` is (`sync_params_buffers`
    in paddle/distributed/parallel.py), which ranks outside `group` never join; for a sub-group
    that broadcast is pointed at it."""
    import paddle
    import paddle.distributed.parallel as parallel

    if group is None:
        return paddle.DataParallel(model, find_unused_parameters=find_unused_parameters)
    original = parallel.sync_params_buffers
    parallel.sync_params_buffers = functools.partial(original, comm_group=group, src_rank=group.ranks[0])
    try:
        return paddle.DataParallel(model, find_unused_parameters=find_unused_parameters, group=group)
    finally:
        parallel.sync_params_buffers = original


class PlainStrategy(Strategy):
    """One process or `paddle.DataParallel` (see the module docstring)."""

    name = "plain"

    def wrap(self, model, optimizer):
        if model is None or self.ranks.world_size == 1:
            return model, optimizer
        from ..models.families.moe import SparseMoeBlock

        # a mixture of experts: an expert no token of this rank reached has no gradient here, which
        # the all-reduce must be told (else the ranks' reductions part ways and gloo times out)
        routed = any(isinstance(layer, SparseMoeBlock) for layer in model.sublayers())
        return data_parallel(model, routed, training_group()), optimizer

    def build_passes(self, models, actor, critics, optimizers, settings):
        return whole_model_passes(models, actor, critics, settings)
