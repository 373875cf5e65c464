"""The expert axis composed with a data-parallel strategy (`ppo.strategy.plain.PlainStrategy`) or
the tensor layout (`ppo.strategy.tensor.FleetStrategy`: tensor x data parallel):
`ExpertStrategy(inner, layout)` answers every strategy call by `inner`, with the experts of the
trained models sharded (`ppo.strategy.expert.layout`):

* `wrap`: the model's experts sharded to this rank's before `inner` wraps it (so
  `paddle.DataParallel` and fleet's broadcasts never see the other ranks' experts: they are
  ``no_sync``), the optimiser's parameter list cut to the kept parameters and its clip made
  `ExpertClipGrad` (set again after fleet's optimiser wrapper replaced it with its own);
* `prepare_step`: the expert gradients synced (`sync_expert_gradients`) before `inner`'s sync
  (which leaves ``no_sync`` parameters alone); the gradient norm sums the experts over the
  expert-parallel group (`expert_group`), then over `inner`'s model-parallel group;
* `save_model`: the experts gathered (`whole_experts`), the ranks `inner` names write the
  one-process checkpoint; `load_weights`: a one-process state dict, each rank keeps its experts;
* `build_passes`: `inner`'s passes whose `generation_weights` gathers the experts: the rollout
  engine generates from the whole model on every rank (each rank its own prompts);
* `fingerprint`: the experts' sums added over the group, then over `inner`'s slices.

Models that are not trained (reference, reward) keep all their experts and never exchange."""
import contextlib

from .grads import ExpertClipGrad, sync_expert_gradients
from .layout import expert_parameters, shard_experts, whole_experts


class ExpertStrategy:
    """Expert parallelism over `inner`'s data parallelism (see the module docstring)."""

    def __init__(self, inner, layout):
        self.inner, self.layout = inner, layout
        self.ranks, self.name = inner.ranks, f"expert+{inner.name}"
        self.sharded = False  # stage-1 sharding over the expert group (`ppo.strategy.expert.sharding`)

    def __getattr__(self, name):  # everything the expert axis does not change
        return getattr(self.inner, name)

    def wrap(self, model, optimizer):
        clip = None
        if model is not None and shard_experts(model, self.layout, model.config):
            kept = {id(p) for p in model.parameters()}
            optimizer._parameter_list[:] = [p for p in optimizer._parameter_list if id(p) in kept]
            limit = optimizer._grad_clip.clip_norm if optimizer._grad_clip is not None else float("inf")
            clip = ExpertClipGrad(limit, self.layout, expert_parameters(model), self.ranks.data_world,
                                  model_parallel_group=self.inner.gradient_groups()[0])
            optimizer._grad_clip = clip
        model, optimizer = self.inner.wrap(model, optimizer)
        if clip is not None:
            self.sharded = install_clip(optimizer, clip) is not None
        return model, optimizer

    def build_passes(self, models, actor, critics, optimizers, settings):
        passes = self.inner.build_passes(models, actor, critics, optimizers, settings)
        plain_weights = passes.generation_weights

        @contextlib.contextmanager
        def generation_weights():
            with whole_experts(models.actor), plain_weights() as model:
                yield model

        passes.generation_weights = generation_weights
        return passes

    def prepare_step(self, model, optimizer):
        sync_expert_gradients(expert_parameters(model), self.layout, self.ranks.data_world)
        return self.inner.prepare_step(model, optimizer)

    def optimizer_step(self, model, optimizer, loss_value, name, release_gradients=False):
        from ..base import Strategy

        return Strategy.optimizer_step(self, model, optimizer, loss_value, name, release_gradients)

    def gradient_groups(self):
        return self.inner.gradient_groups()

    def expert_group(self):  # under sharding, the sharding group (the expert group) sums the experts
        return None if self.sharded else self.layout.comm.group or _default_group()

    def saves_models(self):
        return True  # the gather is collective; rank 0 writes

    def save_model(self, model, path, tokenizer=None):
        with whole_experts(model):
            if self.inner.saves_models():
                self.inner.save_model(model, path, tokenizer)

    def load_weights(self, model, state_dict):
        self.inner.load_weights(model, state_dict)  # the experts this rank holds take their rows

    def fingerprint(self, model, passes):
        from ..base import Strategy

        return Strategy.fingerprint(self, model, passes)

    def split_weight_sum(self, sums):
        import paddle

        t = paddle.to_tensor([sum(sums)], dtype="float64")
        self.layout.comm.all_reduce_inplace(t)
        return self.inner.split_weight_sum([float(t.numpy()[0])])


def _default_group():
    from paddle.distributed import collective

    return collective._get_default_group()


def install_clip(optimizer, clip):
    """`clip` on the optimiser inside fleet's wrappers (`HybridParallelOptimizer`, ...), which put
    their own clip around it, and this rank's experts in its own part of a stage-1 sharding
    optimizer (`adopt_sharding_optimizer`). Returns the sharding group, or None."""
    from .exchange import GroupComm
    from .sharding import adopt_sharding_optimizer

    inner = optimizer
    while "_inner_opt" in vars(inner):
        inner = inner._inner_opt
    inner._grad_clip = clip
    group = adopt_sharding_optimizer(optimizer, clip.expert_params)
    clip.sharding = None if group is None else GroupComm(group)
    return group
