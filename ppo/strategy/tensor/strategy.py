"""Fleet's hybrid parallelism without pipelines: tensor parallel x sharding x data parallel,
composed of `FleetAxes` (fleet's model and optimiser wrappers) and a `TensorAxis`. The models
still run whole layers in every process (`PlainPasses`); fleet's optimiser syncs the gradients
inside its step, so `prepare_step` runs that sync first (`ppo.strategy.grad_sync`); a
tensor-parallel model is saved with its slices merged and loaded back cut to this rank's slices."""
from ...common.parallel_groups import pipeline_group
from ..base import Strategy, whole_model_passes
from ..hybrid import FleetAxes
from .axis import TensorAxis


class FleetStrategy(Strategy):
    """Tensor parallel, sharding and data parallel under fleet (see the module docstring)."""

    name = "fleet"

    def __init__(self, ranks=None):
        super().__init__(ranks)
        self.fleet, self.tensor = FleetAxes(self.ranks), TensorAxis()

    def wrap(self, model, optimizer):
        return self.fleet.wrap(model, optimizer)

    def build_passes(self, models, actor, critics, optimizers, settings):
        return whole_model_passes(models, actor, critics, settings)

    def gradient_groups(self):
        return self.tensor.group(), pipeline_group()

    def saves_models(self):
        return self.fleet.saves_models(self.gradient_groups())

    def save_model(self, model, path, tokenizer=None):
        self.tensor.save_model(model, path)
        if tokenizer is not None and self.ranks.is_main:
            tokenizer.save_pretrained(path)

    def load_weights(self, model, state_dict):
        self.tensor.load_weights(model, state_dict)

    def generation_group(self):
        return self.tensor.group()

    def split_weight_sum(self, sums):
        return self.tensor.split_weight_sum(sums)
