"""Expert parallelism in PaddleNLP's `Trainer` (SFT): `ExpertTrainerMixin`, placed before
`Trainer` among the bases, with the model sharded by `shard_for_trainer` before the trainer is
built. The trainer's `paddle.DataParallel` (or, with tensor parallelism, its fleet all-reduce,
which skips ``no_sync`` parameters) averages the other gradients; the optimiser's clip
(`ExpertClipGrad` with ``sync``, put back after fleet's optimiser wrapper replaced it) syncs the
expert gradients first, then clips with the experts counted once. Saving gathers the experts (every rank joins; the trainer's main rank writes the
one-process checkpoint); generation for evaluation runs on the gathered experts. The Trainer
writes rank 0's optimiser states only: each rank also writes its experts' AdamW states to
``checkpoint-N/expert_optimizer.rank{r}.pdopt`` and takes them back on resume."""
import contextlib
import os

import paddle

from ...common.parallel_groups import model_parallel_group
from .checks import expert_degree
from .grads import ExpertClipGrad
from .layout import expert_parameters, shard_experts, whole_experts
from .strategy import install_clip


def shard_for_trainer(model, args):
    """`model` with its experts sharded for `args`' expert-parallel degree (unchanged at 1);
    builds the groups (collective). Returns the layout or None."""
    if expert_degree(args) == 1:
        return None
    import paddle.distributed as dist

    from . import expert_layout

    layout = expert_layout(args, dist.get_rank(), dist.get_world_size()).build_groups()
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
                                                  self.args.dataset_world_size, sync=True,
                                                  model_parallel_group=model_parallel_group())
        return optimizer

    def _wrap_model(self, model, training=True):
        clip = getattr(self.optimizer, "_grad_clip", None)
        wrapped = super()._wrap_model(model, training)
        if isinstance(clip, ExpertClipGrad):  # fleet's optimiser wrapper put its own clip around it
            install_clip(self.optimizer, clip)
        return wrapped

    def save_model(self, output_dir=None, merge_tensor_parallel=False):
        if self.expert_layout is None:
            return super().save_model(output_dir, merge_tensor_parallel)
        with whole_experts(self.model):
            return super().save_model(output_dir, merge_tensor_parallel)

    def _save_checkpoint(self, model, metrics=None):
        super()._save_checkpoint(model, metrics)
        if self.expert_layout is not None and not self.args.ignore_save_lr_and_optim:
            folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            paddle.save(expert_optimizer_states(self.optimizer, expert_parameters(self.model)),
                        expert_optimizer_file(folder, self.expert_layout.rank))

    def _load_from_checkpoint(self, resume_from_checkpoint=None):
        """The Trainer loads a resumed model on data rank 0 and broadcasts it; experts are not
        broadcast: every rank takes its own from the checkpoint's one-process weights."""
        super()._load_from_checkpoint(resume_from_checkpoint)
        if self.expert_layout is not None and resume_from_checkpoint is not None:
            from paddlenlp.utils.env import PADDLE_WEIGHTS_NAME

            saved = paddle.load(os.path.join(resume_from_checkpoint, PADDLE_WEIGHTS_NAME))
            mine = {name for name, p in self.model.named_parameters() if getattr(p, "expert_parallel", False)}
            self.model.set_state_dict({name: value for name, value in saved.items() if name in mine})

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = None if checkpoint is None or self.expert_layout is None else \
            expert_optimizer_file(checkpoint, self.expert_layout.rank)
        if path is not None and os.path.isfile(path):  # loaded when the optimiser creates the moments
            self.optimizer._accumulators_holder.update(paddle.load(path))

    def generation_weights(self):
        if self.expert_layout is None:
            return super().generation_weights()
        return _gathered(self.model, super().generation_weights())


@contextlib.contextmanager
def _gathered(model, inner):
    with whole_experts(model), inner as generation_model:
        yield generation_model


def expert_optimizer_file(checkpoint, rank):
    return os.path.join(checkpoint, f"expert_optimizer.rank{rank}.pdopt")


def expert_optimizer_states(optimizer, params):
    """The optimiser's state entries (moments, beta powers) of `params`: ``{name: tensor}``."""
    prefixes = tuple(f"{p.name}_" for p in params)
    return {k: v for k, v in optimizer.state_dict().items() if isinstance(k, str) and k.startswith(prefixes)}
