"""On-policy distillation (GKD) on the PaddleNLP `Trainer`: the student is trained towards a
teacher's per-token distributions on its own samples (a fraction `lmbda` of the steps) or on the
dataset's answers (the others).

One step:
 1. the data loader reads the step's micro-batches; on an on-policy step the student answers
    their prompts with the rollout engine (`sft.distill_sampling.StudentSampler`);
 2. the teacher scores the answer tokens: its hidden states, or its top-k distribution
    (`sft.distill_objective.TeacherScorer`);
 3. the loss is the generalised JSD of each answer token (`ppo.algos.gjsd_from_hidden`), summed
    and divided by the step's answer tokens over every micro-batch and data rank, so gradient
    accumulation and data parallelism change nothing;
 4. the Trainer steps the optimiser (LoRA or full weights, data parallel as for SFT).

Logged with every training log: `distill/jsd` (token mean), `distill/teacher_logprob` (the
teacher's mean log-prob of the trained tokens: on-policy, how likely the teacher finds the
student's samples), `distill/on_policy_frac` (fraction of the micro-batches since the last log
that were on-policy) and `distill/response_length`.
"""
import paddle
import paddle.distributed as dist
from paddlenlp.trainer import Trainer

from ppo.common.step_tokens import STEP_TOKENS_KEY, step_token_scale
from sft.distill_objective import shifted_labels, student_token_gjsd
from sft.distill_sampling import ON_POLICY_KEY
from sft.sft_trainer import SFTTrainer

class DistillTrainer(SFTTrainer):
    """`SFTTrainer` (held-out exact-match evaluation, resume) whose loss is the generalised JSD
    against `teacher` (a `TeacherScorer`); `sampler` (a `StudentSampler`) makes the on-policy
    batches."""

    def __init__(self, *args, teacher=None, sampler=None, **kwargs):
        super().__init__(*args, **kwargs)
        if teacher is None or sampler is None:
            raise ValueError("DistillTrainer needs a teacher (TeacherScorer) and a sampler (StudentSampler)")
        self.teacher, self.sampler = teacher, sampler
        self.stat_sums = None  # [6] float32 sums since the last log (see `record`)
        self.trained_tokens = 0.0

    def get_train_dataloader(self):
        """The Trainer's loader wrapped by the sampler: on-policy steps carry the student's answers,
        every batch its step's token count (see `sft.distill_sampling`)."""
        return self.sampler.wrap(Trainer.get_train_dataloader(self))

    def compute_loss(self, model, inputs, return_outputs=False):
        """Training: the summed token JSD times the step's token scale (`step_token_scale`);
        elsewhere (evaluation) the batch's token mean."""
        labels = shifted_labels(inputs["labels"])
        teacher, teacher_logp = self.teacher(inputs["input_ids"], inputs["attention_mask"], labels)
        jsd = student_token_gjsd(model, inputs["input_ids"], inputs["attention_mask"], labels, teacher, self.args.beta,
                                 self.args.temperature, self.args.logprob_chunk_size)
        counted = (labels >= 0).astype("float32")
        tokens = paddle.clip(counted.sum(), min=1.0)
        loss = (jsd * counted).sum() / tokens
        if STEP_TOKENS_KEY in inputs:
            scale = step_token_scale(inputs, self.args.gradient_accumulation_steps, self.args.dataset_world_size)
            loss = self.add_moe_aux_loss(model, (jsd * counted).sum() * scale)  # an MoE student's router losses
            self.record(jsd, teacher_logp, counted, inputs)
        return (loss, {"jsd": jsd}) if return_outputs else loss

    def record(self, jsd, teacher_logp, counted, inputs):
        """Add this micro-batch's sums to those since the last log: JSD and teacher log-prob over
        the counted tokens, the tokens, the rows, and the micro-batch (on-policy or not)."""
        with paddle.no_grad():
            sums = paddle.stack([(jsd.detach() * counted).sum(), (teacher_logp * counted).sum(), counted.sum(),
                                 paddle.to_tensor(float(counted.shape[0])),
                                 paddle.to_tensor(float(inputs.get(ON_POLICY_KEY, 0.0))), paddle.to_tensor(1.0)])
        self.stat_sums = sums if self.stat_sums is None else self.stat_sums + sums

    def training_step(self, model, inputs, step_control=0):
        if STEP_TOKENS_KEY in inputs:  # each micro-batch carries its step's total
            self.trained_tokens += float(inputs[STEP_TOKENS_KEY]) / max(self.args.gradient_accumulation_steps, 1)
        return super().training_step(model, inputs, step_control)

    def reduced_stats(self):
        """Token means since the last log over every rank (sums all-reduced, then divided), the
        on-policy fraction of the micro-batches, and `distill/tokens`: answer tokens trained on so
        far over every rank. Resets the sums."""
        sums, self.stat_sums = self.stat_sums, None
        if sums is None:
            return {}
        if dist.get_world_size() > 1:
            dist.all_reduce(sums)
        jsd, teacher_logp, tokens, rows, on_policy, micro = sums.numpy().tolist()
        return {"distill/jsd": jsd / max(tokens, 1.0), "distill/teacher_logprob": teacher_logp / max(tokens, 1.0),
                "distill/on_policy_frac": on_policy / max(micro, 1.0), "distill/response_length": tokens / max(rows, 1.0),
                "distill/tokens": self.trained_tokens}

    def log(self, logs, **kwargs):
        if "loss" in logs:  # a training log: add the accumulated distillation statistics
            logs = {**logs, **self.reduced_stats()}
        super().log(logs, **kwargs)
