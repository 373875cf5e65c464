"""One process, or data parallel alone (`paddle.DataParallel` all-reduces the gradients in
the backward pass): the models run whole in every process (`ppo.passes.plain.PlainPasses`)."""
from .base import Strategy, whole_model_passes


class PlainStrategy(Strategy):
    """One process or `paddle.DataParallel` (see the module docstring)."""

    name = "plain"

    def wrap(self, model, optimizer):
        if model is None or self.ranks.world_size == 1:
            return model, optimizer
        import paddle

        from ..models.families.moe import SparseMoeBlock

        # a mixture of experts: an expert no token of this rank reached has no gradient here, which
        # the all-reduce must be told (else the ranks' reductions part ways and gloo times out)
        routed = any(isinstance(layer, SparseMoeBlock) for layer in model.sublayers())
        return paddle.DataParallel(model, find_unused_parameters=routed), optimizer

    def build_passes(self, models, actor, critics, optimizers, settings):
        return whole_model_passes(models, actor, critics, settings)
