"""Expert parallelism in PaddleNLP's `Trainer` (SFT): `ExpertTrainerAxis`, the expert axis over
a `ppo.strategy.trainer_layout.TrainerLayout`, whose hooks `LayoutTrainerMixin` calls; the entry
point shards the model's experts with its `place` before the trainer is built. The trainer's
`paddle.DataParallel` (or, with tensor parallelism, its fleet all-reduce, which skips ``no_sync``
parameters) averages the other gradients; the optimiser's clip (`ExpertClipGrad` with ``sync``,
put back after fleet's optimiser wrapper replaced it) syncs the expert gradients first, then
clips with the experts counted once. Saving gathers the experts (every rank joins; the trainer's
main rank writes the one-process checkpoint); generation for evaluation runs on the gathered
experts. The Trainer writes rank 0's optimiser states only: each rank also writes its experts'
AdamW states to ``checkpoint-N/expert_optimizer.rank{r}.pdopt`` and takes them back on resume."""
import contextlib
import os

import paddle

from ...common.parallel_groups import model_parallel_group
from .checks import expert_degree
from .grads import ExpertClipGrad
from .layout import expert_layout, expert_parameters, shard_experts, whole_experts
from .strategy import install_clip


def with_expert_trainer_axis(inner, args):
    """`inner` (a `TrainerLayout`) with the expert axis when `args` ask for it (their groups built:
    collective)."""
    if expert_degree(args) == 1:
        return inner
    import paddle.distributed as dist

    return ExpertTrainerAxis(inner, expert_layout(args, dist.get_rank(), dist.get_world_size()).build_groups())


class ExpertTrainerAxis:
    """The expert axis of a `Trainer` run over `inner`'s layout (see the module docstring);
    `layout`: the `ExpertLayout`. Everything else is `inner`'s."""

    def __init__(self, inner, layout):
        self.inner, self.layout = inner, layout
        self.args, self.name = inner.args, f"expert+{inner.name}"

    def __getattr__(self, name):  # everything the expert axis does not change
        return getattr(self.inner, name)

    def place(self, model):
        """`model` with this rank's experts only (the others dropped)."""
        model = self.inner.place(model)
        shard_experts(model, self.layout, model.config)
        return model

    def optimizer_created(self, trainer, optimizer):
        optimizer = self.inner.optimizer_created(trainer, optimizer)
        clip = optimizer._grad_clip.clip_norm if optimizer._grad_clip is not None else float("inf")
        optimizer._grad_clip = ExpertClipGrad(clip, self.layout, expert_parameters(trainer.model),
                                              trainer.args.dataset_world_size, sync=True,
                                              model_parallel_group=model_parallel_group())
        return optimizer

    @contextlib.contextmanager
    def wrapping(self, trainer):
        clip = getattr(trainer.optimizer, "_grad_clip", None)
        with self.inner.wrapping(trainer):
            yield
        if isinstance(clip, ExpertClipGrad):  # fleet's optimiser wrapper put its own clip around it
            install_clip(trainer.optimizer, clip)

    @contextlib.contextmanager
    def whole_model(self, model):
        with self.inner.whole_model(model), whole_experts(model):
            yield

    def generation_weights(self, model, inner):
        return _gathered(model, self.inner.generation_weights(model, inner))

    def checkpoint_saved(self, trainer):
        self.inner.checkpoint_saved(trainer)
        if not trainer.args.ignore_save_lr_and_optim:
            folder = os.path.join(trainer.args.output_dir, f"checkpoint-{trainer.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            paddle.save(expert_optimizer_states(trainer.optimizer, expert_parameters(trainer.model)),
                        expert_optimizer_file(folder, self.layout.rank))

    def checkpoint_loaded(self, trainer, checkpoint):
        """The Trainer loads a resumed model on data rank 0 and broadcasts it; experts are not
        broadcast: every rank takes its own from the checkpoint's weights, which hold every
        expert (gathered for the save): the one-process file, or with tensor parallelism the
        file of this rank's slice (``model_state.tp0{m}.pdparams``, the Trainer's
        ``weight_name_suffix``; before, the resume looked for ``model_state.pdparams`` there
        and stopped)."""
        self.inner.checkpoint_loaded(trainer, checkpoint)
        if checkpoint is not None:
            from paddlenlp.transformers.model_utils import _add_variant
            from paddlenlp.utils.env import PADDLE_WEIGHTS_NAME

            weights_file = _add_variant(PADDLE_WEIGHTS_NAME, trainer.args.weight_name_suffix)
            saved = paddle.load(os.path.join(checkpoint, weights_file))
            mine = {name for name, p in trainer.model.named_parameters() if getattr(p, "expert_parallel", False)}
            trainer.model.set_state_dict({name: value for name, value in saved.items() if name in mine})

    def optimizer_loaded(self, trainer, checkpoint):
        self.inner.optimizer_loaded(trainer, checkpoint)
        path = None if checkpoint is None else expert_optimizer_file(checkpoint, self.layout.rank)
        if path is not None and os.path.isfile(path):  # loaded when the optimiser creates the moments
            trainer.optimizer._accumulators_holder.update(paddle.load(path))


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
