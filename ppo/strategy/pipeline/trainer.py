"""The pipeline layout in PaddleNLP's `Trainer` (SFT, the reward model, the offline DPO family):
this rank's stages of the model with the loss the schedule's last stage computes and the input
preparation of the `Trainer`'s pipeline steps (`pipe`, `score_pipe`, `preference_pipe`), the
reward model's evaluation through the pipe, the offline DPO family's path
(`preference_run.PreferencePipelineRun`) and the last stage's statistics sent to every stage.
The pieces are imported when used: `ppo.strategy` imports this module with the package."""
from ..trainer_layout import TrainerLayout


class PipelineTrainerLayout(TrainerLayout):
    """Fleet pipelines under PaddleNLP's `Trainer` (see the module docstring); LoRA is refused
    with the arguments (`ppo.common.validation.pipeline_problems`)."""

    name = "pipeline"

    def log_settings(self):
        from .pipe import log_pipeline_settings

        log_pipeline_settings(self.args)

    def load_causal_lm(self, path, **overrides):
        """SFT's pipe: the answer-token NLL on the last stage (`AnswerNLLCriterion`)."""
        from .pipe import AnswerNLLCriterion, CausalLMPipelineInputs, load_pipe

        inputs = CausalLMPipelineInputs(self.args.gradient_accumulation_steps, self.args.dataset_world_size)
        return load_pipe(path, AnswerNLLCriterion(), inputs, **overrides)

    def load_score_model(self, path, **score_settings):
        """The score-model pipe with the pairwise loss of `loss_type` / `regularization` on its last stage."""
        from .score_pipe import load_score_pipe

        args = self.args
        return load_score_pipe(path, args.loss_type, args.regularization, args.gradient_accumulation_steps, **score_settings)

    def load_preference_policy(self, path, merge_adapter=False, **overrides):
        """The policy pipe; its loss is set by the run's `PreferencePipelineRun` (`preference_run`)."""
        from .pipe import load_pipe
        from .preference_pipe import PreferencePolicyInputs

        return load_pipe(path, None, PreferencePolicyInputs(self.args.gradient_accumulation_steps), **overrides)

    def load_preference_reference(self, policy, path, ref_path=None, **overrides):
        from ...models.loading import freeze, set_dropout_off
        from .pipe import AnswerNLLCriterion, CausalLMPipelineInputs, load_pipe

        steps = self.args.gradient_accumulation_steps
        reference = load_pipe(ref_path or path, AnswerNLLCriterion(), CausalLMPipelineInputs(steps), **overrides)
        return freeze(set_dropout_off(reference))

    def prediction_step(self, own_step, trainer_step):
        """The `Trainer`'s pipeline evaluation: the last stage's loss (`AnswerNLLCriterion`, ...)."""
        return trainer_step

    def pair_end_scores(self, trainer, inputs):
        from .pipe import wrapped_pipeline
        from .score_pipe import pipeline_end_scores

        return pipeline_end_scores(wrapped_pipeline(trainer), inputs), inputs["better_input_ids"].shape[0]

    def preference_run(self, trainer, objective, record_stats, kl_mean, use_reference, kl_point):
        from .preference_run import PreferencePipelineRun

        return PreferencePipelineRun(trainer, objective, record_stats, kl_mean, use_reference, kl_point)

    def last_stage_means(self, means):
        from .preference_run import from_last_stage

        return from_last_stage(means)
