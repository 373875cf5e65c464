"""The PaddleNLP-`Trainer` side of a run's layout (SFT, the reward model, the offline DPO family).
PaddleNLP's `Trainer` runs fleet's data, sharding, tensor and pipeline parallelism itself; what
differs per layout is how the entry point loads its model (whole, or this rank's pipeline stages
with the loss and input preparation the schedule runs), the `Trainer` hooks an axis needs (the
expert axis shards the experts, syncs their gradients in the optimiser's clip, gathers them to
save and to generate, keeps their optimiser states per rank) and the evaluation paths (the
trainer's own loss on whole models, the pipeline's through its stages): the trainers never ask
which layout they run on.

`ppo.strategy.trainer_strategy(args)` builds one from the layout `choose_layout` names.
`TrainerLayout` is the whole-model layout (one process, data parallel, tensor parallel and
sharding under fleet); another layout subclasses `TrainerLayout` alone
(`ppo.strategy.pipeline.trainer.PipelineTrainerLayout`), and an axis wraps another layout's
object (`ppo.strategy.expert.trainer.ExpertTrainerAxis`). `LayoutTrainerMixin` puts the hooks
into a `Trainer` subclass."""
import contextlib


class TrainerLayout:
    """The whole-model layout of a `Trainer` run; `args`: the run's `TrainingArguments`."""

    name = "whole"

    def __init__(self, args):
        self.args = args

    def log_settings(self):
        """Log what the layout makes of the arguments (nothing here)."""

    # ---- the entry points' models ---------------------------------------------------------
    def load_causal_lm(self, path, **overrides):
        """SFT's model from `path` (`overrides`: config overrides, dtype)."""
        from ..models.loading import load_causal_lm

        return load_causal_lm(path, **overrides)

    def load_score_model(self, path, **score_settings):
        """The reward (or cost, process reward) model to train from `path` (a LoRA adapter merged in memory)."""
        from ..models.adapters import load_merged_score_model

        return load_merged_score_model(path, **score_settings)

    def load_preference_policy(self, path, merge_adapter=False, **overrides):
        """The DPO family's policy from `path`; `merge_adapter` (`use_lora`): an adapter in `path`
        merged first (a fresh one is then trained on it)."""
        from ..models.adapters import load_merged_causal_lm
        from ..models.loading import load_causal_lm

        return (load_merged_causal_lm if merge_adapter else load_causal_lm)(path, **overrides)

    def load_preference_reference(self, policy, path, ref_path=None, **overrides):
        """The DPO family's frozen reference (`ref_path`, default `path`), or None when `policy` is a
        LoRA model whose disabled adapter serves as the reference."""
        from ..models.loading import load_reference, training_dtype

        return load_reference(policy, path, ref_path, training_dtype(self.args), **overrides)

    def place(self, model):
        """`model` (loaded, LoRA applied) put into the layout before the `Trainer` wraps it."""
        return model

    # ---- hooks of `LayoutTrainerMixin` ----------------------------------------------------
    def optimizer_created(self, trainer, optimizer):
        """The optimiser the `Trainer` created, as the layout steps it."""
        return optimizer

    def wrapping(self, trainer):
        """Context around the `Trainer`'s `_wrap_model` (fleet's wrappers replace the optimiser's clip)."""
        return contextlib.nullcontext()

    def whole_model(self, model):
        """Context in which `model` is whole on every rank, for saving it."""
        return contextlib.nullcontext()

    def generation_weights(self, model, inner):
        """Context giving the model to generate with, around the trainer's own (`inner`)."""
        return inner

    def checkpoint_saved(self, trainer):
        """After the `Trainer` wrote `checkpoint-<global_step>`: what the layout keeps per rank."""

    def checkpoint_loaded(self, trainer, checkpoint):
        """After the `Trainer` loaded the model of `checkpoint` (a resume)."""

    def optimizer_loaded(self, trainer, checkpoint):
        """After the `Trainer` loaded the optimiser and scheduler of `checkpoint` (None: none)."""

    # ---- evaluation paths -------------------------------------------------------------------
    def prediction_step(self, own_step, trainer_step):
        """The evaluation step a trainer runs: `own_step` (its loss on the whole model) here; a
        layout whose model parts compute the loss themselves (the pipeline's last stage) picks
        `trainer_step` (PaddleNLP's `Trainer.prediction_step`). Both take the `Trainer`'s
        `prediction_step` arguments."""
        return own_step

    def pair_end_scores(self, trainer, inputs):
        """`(end_scores [2B], B)` of a preference batch scored through the layout's model parts
        (better rows first), or None when the trainer's model scores it whole."""
        return None

    def preference_run(self, trainer, objective, record_stats, kl_mean, use_reference, kl_point):
        """The offline DPO family's path through the layout's models, with `preference_loss(inputs,
        model=None) -> (loss, stats)`: here the trainer's own `preference_loss` on the whole
        model (`model`, default `trainer.model`); a pipeline's `PreferencePipelineRun`."""
        return WholeModelPreferenceRun(trainer)

    def last_stage_means(self, means):
        """`(names, vector)` of the statistics as every rank of a model-parallel group sees them
        (the ranks that computed them send them); `means` unchanged here."""
        return means


class WholeModelPreferenceRun:
    """The offline DPO family's path when its models run whole: the trainer's `preference_loss`."""

    def __init__(self, trainer):
        self.trainer = trainer

    def preference_loss(self, inputs, model=None):
        """`(loss, stats)` of a batch through `model` (default: the trainer's)."""
        return self.trainer.preference_loss(self.trainer.model if model is None else model, inputs)


class LayoutTrainerMixin:
    """PaddleNLP `Trainer` methods that ask the run's `trainer_layout` (placed before `Trainer`
    among the bases; the subclass sets `trainer_layout` before `Trainer.__init__`)."""

    trainer_layout = None

    def create_optimizer(self, lr_scheduler=None):
        return self.trainer_layout.optimizer_created(self, super().create_optimizer(lr_scheduler))

    def _wrap_model(self, model, training=True):
        with self.trainer_layout.wrapping(self):
            return super()._wrap_model(model, training)

    def save_model(self, output_dir=None, merge_tensor_parallel=False):
        with self.trainer_layout.whole_model(self.model):
            return super().save_model(output_dir, merge_tensor_parallel)

    def _save_checkpoint(self, model, metrics=None):
        super()._save_checkpoint(model, metrics)
        self.trainer_layout.checkpoint_saved(self)

    def _load_from_checkpoint(self, resume_from_checkpoint=None):
        super()._load_from_checkpoint(resume_from_checkpoint)
        self.trainer_layout.checkpoint_loaded(self, resume_from_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        self.trainer_layout.optimizer_loaded(self, checkpoint)

    def generation_weights(self):
        return self.trainer_layout.generation_weights(self.model, super().generation_weights())
