"""Expert parallelism in PaddleNLP's `Trainer` (SFT): `ExpertTrainerMixin`, placed before
`Trainer` among the bases, with the model sharded by `shard_for_trainer` before the trainer is
built. The trainer's `paddle.DataParallel` averages the other gradients; the optimiser's clip
(`ExpertClipGrad` with ``sync``) syncs the expert gradients first, then clips with the experts
counted once. Saving gathers the experts (every rank joins; the trainer's main rank writes the
one-process checkpoint); generation for evaluation runs on the gathered experts."""
import contextlib

from .checks import expert_degree
from .grads import ExpertClipGrad
from .layout import ExpertLayout, expert_parameters, shard_experts, whole_experts


def shard_for_trainer(model, args):
    """`model` with its experts sharded for `args`' expert-parallel degree (unchanged at 1);
    builds the groups (collective). Returns the layout or None."""
    degree = expert_degree(args)
    if degree == 1:
        return None
    import paddle.distributed as dist

    layout = ExpertLayout(degree, dist.get_rank(), dist.get_world_size()).build_groups()
    shard_experts(model, layout, model.config)
    return layout


class ExpertTrainerMixin:
    """`Trainer` methods under expert parallelism (see the module docstring); `expert_layout`:
    the `ExpertLayout` (None: off)."""

    expert_layout = None

    def create_optimizer(self, lr_scheduler=None):
        optimizer = super().create_optimizer(lr_scheduler)
        if self.expert_layout is not None:
            clip = optimizer._grad_clip.clip_norm if optimizer._grad_clip is not None else float("inf")
            optimizer._grad_clip = ExpertClipGrad(clip, self.expert_layout, expert_parameters(self.model),
                                                  self.args.dataset_world_size, sync=True)
        return optimizer

    def save_model(self, output_dir=None, merge_tensor_parallel=False):
        if self.expert_layout is None:
            return super().save_model(output_dir, merge_tensor_parallel)
        with whole_experts(self.model):
            return super().save_model(output_dir, merge_tensor_parallel)

    def generation_weights(self):
        if self.expert_layout is None:
            return super().generation_weights()
        return _gathered(self.model, super().generation_weights())


@contextlib.contextmanager
def _gathered(model, inner):
    with whole_experts(model), inner as generation_model:
        yield generation_model
