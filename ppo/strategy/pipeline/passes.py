"""`ModelPasses` through pipeline-parallel models (`pipeline_parallel_degree > 1`, see
`ppo.strategy.pipeline.policy_pipe`). Every rank of a pipeline group runs the same step on the same
experience (the prompts, seeds and samples of a pipeline group agree). The only code here that
touches fleet's private pipeline attributes is `fleet_forward_backward` (with its helper
`set_micro_batches`); the last stage's loss is installed by
`ppo.strategy.pipeline.pipe.install_last_stage_loss`."""
import contextlib
import logging

import paddle
import paddle.distributed as dist

from .pipe import answer_nll_from_logits, install_last_stage_loss, pipeline_group
from .policy_pipe import (
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
from .score_pipe import end_scores_of, score_head_of
from ...experience.stages import loss_view
from ...passes.base import ModelPasses

logger = logging.getLogger(__name__)


def set_micro_batches(model, count):
    """Make fleet's pipeline `model` run `count` micro-batches per schedule (its accumulate
    steps and the capacity of its per-micro-batch hook counters)."""
    model.accumulate_steps = count
    chunks = getattr(model, "_virtual_pp_world_size", None) or 1
    for hooks in (getattr(model, "forward_hooks", None), getattr(model, "backward_hooks", None)):
        if hooks is not None:
            hooks.set_hooks_capacity(chunks * count)


def fleet_forward_backward(model, optimizer, data, micro_batches, default_micro_batches):
    """One forward-backward of fleet's pipeline schedule (`model`: the fleet-wrapped pipe,
    `optimizer`: its fleet optimizer) over `data` in `micro_batches` micro-batches, without the
    optimiser step fleet's `train_batch` would take (the caller steps it); returns the loss
    tensor. Fleet's own `forward_backward_pipeline` with what `train_batch` sets up first;
    the micro-batch count returns to `default_micro_batches` afterwards."""
    model.train()
    set_micro_batches(model, micro_batches)
    try:
        data = model._prepare_training(data, optimizer, None)
        model.optimizer = model.lr_scheduler = None  # the caller steps the optimiser itself
        return model.forward_backward_pipeline(data)
    finally:
        set_micro_batches(model, default_micro_batches)


class PipelinePasses(ModelPasses):
    """models: `PPOModels` of this rank's stages; actor: the actor pipe wrapped by
    `fleet.distributed_model`; critics: `{objective: wrapped critic pipe}`; optimizers: `{"actor":
    fleet optimizer, objective: fleet optimizer}`; the frozen reference and score-model pipes are
    wrapped here. temperature: the sampling temperature; micro_batches: the schedule's
    micro-batches per optimiser step (`gradient_accumulation_steps`); micro_rows: rows per
    micro-batch (`per_device_train_batch_size`); pad_token_id: the padding of schedule inputs;
    keep_tensor_parallel: the generation copy keeps each rank's tensor-parallel slices
    (`eval_mode` tensor_parallel) instead of merging them.

    Holds the generation copy (the whole actor as one plain model on every rank, for the
    rollout engine), filled only while a rollout or an evaluation uses it."""

    def __init__(self, models, actor, critics, optimizers, temperature, micro_batches, *, micro_rows, pad_token_id,
                 keep_tensor_parallel=False):
        from paddle.distributed import fleet

        self.models, self.actor, self.critics, self.optimizers = models, actor, dict(critics), dict(optimizers)
        self.temperature, self.steps, self.micro_rows, self.pad_token_id = temperature, micro_batches, micro_rows, pad_token_id
        self.records = {name: [] for name in ("actor", *self.critics)}  # per micro-batch stats of the last stage
        self.criteria = {}
        pipes = {"actor": models.actor, **{name: models.critic_models()[name] for name in self.critics}}
        for name, pipe in pipes.items():
            self.criteria[name] = ExperienceCriterion(self.steps, self.records[name].append, loss_view)
            install_last_stage_loss(pipe, self.criteria[name])
        frozen = {"reference": models.reference, **models.score_models()}
        for pipe in frozen.values():
            if pipe is not None:
                install_last_stage_loss(pipe, FrozenModelLoss())
        self.reference = fleet.distributed_model(models.reference) if models.reference is not None else None
        self.scorers = {name: fleet.distributed_model(pipe) for name, pipe in models.score_models().items()}
        self.score_heads = {name: score_head_of(pipe) for name, pipe in models.score_models().items()}
        self.generation_model = plain_copy_of(models.actor, keep_tensor_parallel=keep_tensor_parallel)
        self.generation_filled = False
        logger.info(
            "rollout under pipeline parallel: every stage of the actor gathered on each rank for each rollout and "
            + ("evaluation, each rank keeping its tensor-parallel slices (eval_mode tensor_parallel)" if keep_tensor_parallel
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
            yield self.generation_model
            return
        self.generation_filled = True
        try:
            with gathered_into(self.generation_model, self.models.actor) as copy:
                yield copy
        finally:
            self.generation_filled = False

    # ---- no-gradient passes ----------------------------------------------------------
    def logprobs(self, which, exp):
        model = self.actor if which == "actor" else self.reference
        temperature = self.temperature
        return pipeline_rows(
            model, exp, lambda logits, m: response_logprobs_from_logits(logits, m, temperature)[0], [exp.response_ids.shape[1]]
        )

    def values(self, objective, exp):
        return pipeline_rows(self.critics[objective], exp, response_values_from_scores, [exp.response_ids.shape[1]])

    def scores(self, objective, exp):
        """Normalised as the plain score model's `end_scores`."""
        head = self.score_heads[objective]
        return pipeline_rows(self.scorers[objective], exp,
                             lambda scores, m: head.normalize(end_scores_of(scores, m.attention_mask)), [])

    # ---- update ------------------------------------------------------------------
    def first_forward_reusable(self):
        return False  # the schedule's forward stays inside the schedule

    def first_forward(self, exp):
        raise RuntimeError("under pipeline parallel the update's forward runs inside fleet's schedule; it cannot be kept")

    def run_schedule(self, model, optimizer, criterion, data, fields, prompt_len, objective, tail=(), real_rows=None):
        """One forward-backward of fleet's schedule over `data`; returns the summed loss of its
        micro-batches (the same on every rank). `tail`: `(first-stage inputs, labels, fields,
        objective)` of micro-batches run after `data`'s in the same schedule (shared weights are
        all-reduced once per schedule, so extra losses must join it, not follow it). `real_rows`:
        each data micro-batch's real rows (`ExperienceCriterion.prepare`)."""
        criterion.prepare(prompt_len, fields, objective, [(f, o) for _, _, f, o in tail], real_rows)
        if tail:
            firsts, labels = data
            columns = [list(c) + [t[0][i] for t in tail] for i, c in enumerate(firsts)]
            data = [tuple(columns), list(labels) + [t[1] for t in tail]]
        return float(fleet_forward_backward(model, optimizer, data, self.steps + len(tail), self.steps))

    def ptx_tail(self, batches, rows, width, ptx_coeff):
        """The ptx micro-batches of one optimiser step: supervised `batches` padded to `[rows,
        width]`, each weighted `ptx_coeff / len(batches)` as in `PlainPasses.backward_step`."""
        weight = ptx_coeff / len(batches)

        def ptx_objective(mb, logits):
            nll = answer_nll_from_logits(logits, mb.labels)
            return weight * nll, {"loss/ptx": nll.detach()}

        return [(*supervised_micro_batch(b, rows, width, self.pad_token_id), ["labels"], ptx_objective) for b in batches]

    def backward_step(self, exp, plan, losses, first_forward=None):
        """The actor's schedule (with the ptx loss's micro-batches in it when there is ptx data),
        then the critic's. Every micro-batch is padded to `micro_rows` rows and one width (see
        `schedule_data`); the stats are every rank's copy of the last stage's. No `first_forward`:
        the schedule runs its own forwards (`first_forward_reusable` is False)."""
        if first_forward is not None:
            raise RuntimeError("under pipeline parallel the update's forward runs inside fleet's schedule; "
                               "a first forward run ahead cannot serve it")
        if len(plan) > self.steps:
            raise ValueError(f"an optimiser step of {len(plan)} micro-batches; the pipeline schedule runs {self.steps}")
        rows = max([self.micro_rows] + [len(r) for r in plan])
        ptx_batches = [losses.next_ptx_batch() for _ in plan] if losses.next_ptx_batch is not None else []
        width = max([exp.sequences.shape[1]] + [b["input_ids"].shape[1] for b in ptx_batches])
        tail = self.ptx_tail(ptx_batches, rows, width, losses.ptx_coeff) if ptx_batches else []
        micro = [padded_micro_batch(exp, r, rows) for r in plan] + [padded_micro_batch(exp, [], rows)] * (self.steps - len(plan))
        data, fields = schedule_data(micro, width, self.pad_token_id)
        for records in self.records.values():
            records.clear()
        temperature = self.temperature

        def actor_objective(mb, logits):
            logprobs, entropy = response_logprobs_from_logits(logits, mb, temperature, with_entropy=True)
            return losses.actor(mb, {"logprobs": logprobs, "entropy": entropy})

        real_rows = [len(r) for r in plan] + [0] * (self.steps - len(plan))
        actor_total = self.run_schedule(
            self.actor, self.optimizers["actor"], self.criteria["actor"], data, fields, exp.prompt_len, actor_objective, tail,
            real_rows,
        )
        totals = {}
        for name, loss_fn in losses.critics.items():
            def critic_objective(mb, scores, loss_fn=loss_fn):
                return loss_fn(mb, {"values": response_values_from_scores(scores, mb)})

            totals[name] = self.run_schedule(
                self.critics[name], self.optimizers[name], self.criteria[name], data, fields, exp.prompt_len, critic_objective
            )
        return actor_total, totals, self.from_last_stage(self.merged_records(len(plan)))

    def merged_records(self, real):
        """On the last stage, the first `real` micro-batches' stats, actor's, ptx's and each
        critic's merged into one float dict each; None on other stages."""
        actor_records = self.records["actor"]
        if not actor_records:
            return None
        actor, ptx = actor_records[: self.steps], actor_records[self.steps :]
        parts = [actor, ptx or [{}] * len(actor)]
        parts += [self.records[name] or [{}] * len(actor) for name in self.critics]
        return [{k: float(v) for d in dicts for k, v in d.items()} for dicts in zip(*parts)][:real]

    @staticmethod
    def from_last_stage(value):
        """A picklable value of the pipeline group's last stage, on every rank of the group."""
        group = pipeline_group()
        box = [value]
        dist.broadcast_object_list(box, src=group.ranks[-1], group=group)
        return box[0]

    # ---- bookkeeping --------------------------------------------------------------
    def group_sum(self, value):
        """Each stage holds other layers: the whole model's number is the group's sum."""
        t = paddle.to_tensor([value], dtype="float64")
        dist.all_reduce(t, group=pipeline_group())
        return float(t.numpy()[0])
