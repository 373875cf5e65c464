"""The passes of a PPO / GRPO step through pipeline-parallel models (`pipeline_parallel_degree
> 1`, see `ppo.models.policy_pipe`): used by `ppo.ppo_trainer.PPOTrainer` in place of its
plain-model calls. Every rank of a pipeline group runs the same step on the same experience
(the prompts, seeds and samples of a pipeline group agree)."""
import contextlib
import logging

import paddle
import paddle.distributed as dist

from .models.pipeline import answer_nll_from_logits, pipeline_group
from .models.policy_pipe import (
    ExperienceCriterion,
    FrozenModelLoss,
    gathered_into,
    padded_micro_batch,
    pipeline_rows,
    plain_copy_of,
    response_logprobs_from_logits,
    response_values_from_scores,
    schedule_data,
    supervised_micro_batch,
)
from .models.score_model_pipe import end_scores_of, score_head_of

logger = logging.getLogger(__name__)


def set_micro_batches(model, count):
    """Make fleet's pipeline `model` run `count` micro-batches per schedule (its accumulate
    steps and the capacity of its per-micro-batch hook counters)."""
    model.accumulate_steps = count
    chunks = getattr(model, "_virtual_pp_world_size", None) or 1
    for hooks in (getattr(model, "forward_hooks", None), getattr(model, "backward_hooks", None)):
        if hooks is not None:
            hooks.set_hooks_capacity(chunks * count)


class PipelinePasses:
    """`trainer`'s models as pipelines: `actor` / `critic` are the trainer's fleet-wrapped
    pipes, the frozen reference and reward pipes are wrapped here. Holds the generation copy
    (the whole actor as one plain model on every rank, for the rollout engine), filled only
    while a rollout or an evaluation uses it."""

    def __init__(self, trainer):
        from paddle.distributed import fleet

        self.trainer = trainer
        models = trainer.models
        self.steps = trainer.args.gradient_accumulation_steps
        self.actor_records, self.critic_records = [], []  # per micro-batch stats of the last stage
        self.actor_criterion = ExperienceCriterion(self.steps, self.actor_records.append)
        models.actor._loss_fn = [self.actor_criterion]
        self.critic_criterion = None
        if models.critic is not None:
            self.critic_criterion = ExperienceCriterion(self.steps, self.critic_records.append)
            models.critic._loss_fn = [self.critic_criterion]
        for frozen in (models.reference, models.reward):
            if frozen is not None:
                frozen._loss_fn = [FrozenModelLoss()]
        self.reference = fleet.distributed_model(models.reference) if models.reference is not None else None
        self.reward = fleet.distributed_model(models.reward) if models.reward is not None else None
        self.reward_head = score_head_of(models.reward) if models.reward is not None else None
        sharded = trainer.args.eval_mode == "tensor_parallel" and trainer.args.tensor_parallel_degree > 1
        self.generation_copy = plain_copy_of(models.actor, keep_tensor_parallel=sharded)
        self.generation_filled = False
        logger.info(
            "rollout under pipeline parallel: every stage of the actor gathered on each rank for each rollout and "
            + ("evaluation, each rank keeping its tensor-parallel slices (eval_mode tensor_parallel)" if sharded
               else "evaluation, tensor-parallel slices merged (eval_mode single)")
        )

    # ---- generation --------------------------------------------------------------
    @contextlib.contextmanager
    def generation_weights(self):
        """Context: the generation copy holding the actor's current weights of every stage,
        released when the outermost such block ends (collective: every rank of the pipeline
        group enters it). A nested block reuses the filled copy: the weights do not change
        between the rollouts of one step."""
        if self.generation_filled:
            yield self.generation_copy
            return
        self.generation_filled = True
        try:
            with gathered_into(self.generation_copy, self.trainer.models.actor) as copy:
                yield copy
        finally:
            self.generation_filled = False

    # ---- no-gradient passes ----------------------------------------------------------
    def logprobs(self, which, exp):
        """Response log-probs `[N, Tr]` under the actor (`which` "actor") or the reference."""
        model = self.trainer.actor if which == "actor" else self.reference
        temperature = self.trainer.args.temperature
        return pipeline_rows(
            model, exp, lambda logits, m: response_logprobs_from_logits(logits, m, temperature)[0], [exp.response_ids.shape[1]]
        )

    def values(self, exp):
        """Critic values `[N, Tr]`."""
        return pipeline_rows(self.trainer.critic, exp, response_values_from_scores, [exp.response_ids.shape[1]])

    def reward_scores(self, exp):
        """Reward-model end scores `[N]` (normalised as the plain score model's `end_scores`)."""
        head = self.reward_head
        return pipeline_rows(self.reward, exp, lambda scores, m: head.normalize(end_scores_of(scores, m.attention_mask)), [])

    # ---- update ------------------------------------------------------------------
    def run_schedule(self, model, optimizer, criterion, data, fields, prompt_len, objective, tail=()):
        """One forward-backward of fleet's schedule over `data` (`optimizer`: the model's fleet
        optimizer, stepped by the trainer afterwards); returns the summed loss of its
        micro-batches (the same on every rank). `tail`: `(first-stage inputs, labels, fields,
        objective)` of micro-batches run after `data`'s in the same schedule (shared weights are
        all-reduced once per schedule, so extra losses must join it, not follow it)."""
        criterion.prepare(prompt_len, fields, objective, [(f, o) for _, _, f, o in tail])
        if tail:
            firsts, labels = data
            columns = [list(c) + [t[0][i] for t in tail] for i, c in enumerate(firsts)]
            data = [tuple(columns), list(labels) + [t[1] for t in tail]]
        model.train()
        set_micro_batches(model, self.steps + len(tail))
        try:
            data = model._prepare_training(data, optimizer, None)
            model.optimizer = model.lr_scheduler = None  # the trainer steps the optimiser itself
            loss = model.forward_backward_pipeline(data)
        finally:
            set_micro_batches(model, self.steps)
        return float(loss)

    def ptx_tail(self, batches, rows, width):
        """The ptx micro-batches of one optimiser step: supervised `batches` padded to `[rows,
        width]`, each weighted `ptx_coeff / len(batches)` as in the plain trainer's update."""
        trainer = self.trainer
        weight = trainer.args.ptx_coeff / len(batches)

        def ptx_objective(mb, logits):
            nll = answer_nll_from_logits(logits, mb.labels)
            return weight * nll, {"loss/ptx": nll.detach()}

        pad = trainer.tokenizer.pad_token_id
        return [(*supervised_micro_batch(b, rows, width, pad), ["labels"], ptx_objective) for b in batches]

    def backward_step(self, exp, plan, num_tokens, num_seqs):
        """Gradients of one optimiser step (`plan`: its micro-batches' row lists) for the actor
        (with the ptx loss's micro-batches in the same schedule when there is ptx data) and the
        critic; returns `(actor loss, critic loss or 0, [micro-batch stats])`, the stats as
        every rank's copy of the last stage's. Every micro-batch is padded to
        `per_device_train_batch_size` rows and one width (see `schedule_data`)."""
        trainer = self.trainer
        if len(plan) > self.steps:
            raise ValueError(f"an optimiser step of {len(plan)} micro-batches; the pipeline schedule runs {self.steps}")
        rows = max([trainer.args.per_device_train_batch_size] + [len(r) for r in plan])
        ptx_batches = [trainer.next_ptx_batch() for _ in plan] if trainer.ptx_sampler is not None else []
        width = max([exp.sequences.shape[1]] + [b["input_ids"].shape[1] for b in ptx_batches])
        tail = self.ptx_tail(ptx_batches, rows, width) if ptx_batches else []
        micro = [padded_micro_batch(exp, r, rows) for r in plan] + [padded_micro_batch(exp, [], rows)] * (self.steps - len(plan))
        data, fields = schedule_data(micro, width, trainer.tokenizer.pad_token_id)
        self.actor_records.clear()
        self.critic_records.clear()
        temperature = trainer.args.temperature

        def actor_objective(mb, logits):
            logprobs, entropy = response_logprobs_from_logits(logits, mb, temperature, with_entropy=True)
            return trainer.actor_loss(mb, num_tokens, num_seqs, {"logprobs": logprobs, "entropy": entropy})

        def critic_objective(mb, scores):
            return trainer.critic_loss(mb, num_tokens, num_seqs, {"values": response_values_from_scores(scores, mb)})

        actor_total = self.run_schedule(
            trainer.actor, trainer.actor_optimizer, self.actor_criterion, data, fields, exp.prompt_len, actor_objective, tail
        )
        critic_total = 0.0
        if self.critic_criterion is not None:
            critic_total = self.run_schedule(trainer.critic, trainer.critic_optimizer, self.critic_criterion, data, fields, exp.prompt_len, critic_objective)
        stats = None
        if self.actor_records:  # the last stage: the real micro-batches' stats, actor's, ptx's and critic's merged
            actor, ptx = self.actor_records[: self.steps], self.actor_records[self.steps :]
            ptx = ptx or [{}] * len(actor)
            critic = self.critic_records or [{}] * len(actor)
            stats = [{k: float(v) for k, v in {**a, **x, **c}.items()} for a, x, c in zip(actor, ptx, critic)][: len(plan)]
        return actor_total, critic_total, self.from_last_stage(stats)

    @staticmethod
    def from_last_stage(value):
        """A picklable value of the pipeline group's last stage, on every rank of the group."""
        group = pipeline_group()
        box = [value]
        dist.broadcast_object_list(box, src=group.ranks[-1], group=group)
        return box[0]

    # ---- bookkeeping --------------------------------------------------------------
    @staticmethod
    def group_sum(value):
        """`value` (a float) summed over the pipeline group (each stage holds other weights)."""
        t = paddle.to_tensor([value], dtype="float64")
        dist.all_reduce(t, group=pipeline_group())
        return float(t.numpy()[0])
