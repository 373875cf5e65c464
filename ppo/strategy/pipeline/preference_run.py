"""The offline DPO family's pipeline path (`pipeline_parallel_degree > 1`), for a PaddleNLP
`Trainer` (`dpo.dpo_trainer.DPOTrainer`): the policy pipe's last stage computes the preference
objective (`PreferenceCriterion`), the reference log-probs and KTO's KL point of each step are
computed before the schedule runs (`PreferencePolicyInputs`) through the reference pipe and the
policy, evaluation runs whole batches through both pipes, and the statistics the last stage
recorded reach every stage of its group."""
import paddle
import paddle.distributed as dist

from .pipe import install_last_stage_loss, pipeline_group, wrapped_pipeline
from .preference_pipe import PreferenceCriterion, PreferencePolicyInputs, kl_sides, pipeline_answer_logps


def from_last_stage(means):
    """`(names, vector)` of the pipeline group's last stage, on every rank of the group."""
    group = pipeline_group()
    box = [None if means is None else (means[0], means[1].numpy())]
    dist.broadcast_object_list(box, src=group.ranks[-1], group=group)
    if box[0] is None:
        return None
    return box[0][0], paddle.to_tensor(box[0][1])


class PreferencePipelineRun:
    """The pipeline path of one preference `trainer` (its `model`, `model_wrapped`, `ref_model`).
    `objective(logps, lengths, ref, kl_point)`: the run's preference objective -> `(loss, stats)`;
    `record_stats(stats)`: what the last stage's loss records; `kl_mean(policy_kl, reference_kl)`:
    KTO's z0 averaged across ranks; `use_reference` / `kl_point`: whether the loss reads the
    reference's log-probs / KTO's KL point."""

    def __init__(self, trainer, objective, record_stats, kl_mean, use_reference, kl_point):
        self.trainer, self.objective, self.kl_mean = trainer, objective, kl_mean
        self.use_reference, self.kl_point = use_reference, kl_point
        self._reference = None
        prepare = trainer.model._prepare_pipeline_inputs_func
        if not isinstance(prepare, PreferencePolicyInputs):
            raise TypeError(f"a pipeline DPO policy needs PreferencePolicyInputs, got {type(prepare).__name__}")
        install_last_stage_loss(trainer.model, PreferenceCriterion(objective, record_stats, use_reference, kl_point))
        if use_reference:
            prepare.reference = lambda micro: pipeline_answer_logps(self.reference_pipeline(), micro)
        if kl_point:
            prepare.kl_point = self.kl_points

    def reference_pipeline(self):
        """The reference pipe wrapped in fleet's `PipelineParallel` (built on first use)."""
        if self._reference is None:
            from paddle.distributed import fleet

            self._reference = fleet.distributed_model(self.trainer.ref_model)
        return self._reference

    def kl_points(self, micro_batches):
        """KTO's z0 of each micro-batch of mismatched pairs (stacked `[2m, T]`): policy and
        reference log-probs through the pipelines, no gradients, averaged across ranks."""
        policy = pipeline_answer_logps(wrapped_pipeline(self.trainer), micro_batches)
        reference = pipeline_answer_logps(self.reference_pipeline(), micro_batches)
        return [self.kl_mean(p, r) for (p, _), (r, _) in zip(policy, reference)]

    def batch_logps(self, model, inputs, prefix=""):
        """Summed answer log-probs and lengths `[2B]` (chosen rows first) of a whole batch's
        pairs (`{prefix}better_*` / `{prefix}worse_*`) through a wrapped pipeline model."""
        prepare = self.trainer.model._prepare_pipeline_inputs_func
        micro, groups = prepare.evaluation_groups(inputs, prefix)
        parts = pipeline_answer_logps(model, micro)
        return prepare.ungroup(groups, [p for p, _ in parts]), prepare.ungroup(groups, [n for _, n in parts])

    def preference_loss(self, inputs, model=None):
        """`(loss, stats)` of a batch through the pipelines (evaluation): the same values on every
        rank of the pipeline group (`model`: the `Trainer`'s, unused: the pipes run wrapped)."""
        policy = wrapped_pipeline(self.trainer)
        logps, lengths = self.batch_logps(policy, inputs)
        ref = self.batch_logps(self.reference_pipeline(), inputs)[0] if self.use_reference else None
        kl_point = None
        if self.kl_point:
            sides = kl_sides(inputs)
            kl_point = self.kl_mean(self.batch_logps(policy, sides, "kl_")[0],
                                    self.batch_logps(self.reference_pipeline(), sides, "kl_")[0])
        return self.objective(logps, lengths, ref, kl_point)
