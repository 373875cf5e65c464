"""PPO and GRPO under `pipeline_parallel_degree > 1`: the actor, reference, critic and reward
model are pipelines split over the same stages (PaddleNLP's causal-LM pipe for the actor and
the reference, the score-model pipe of `score_model_pipe.py` for the critic and the reward
model), and the pipeline passes (`ppo.strategy.pipeline.passes.PipelinePasses`) run every pass of a
PPO step through them:

* no-gradient passes (old and reference log-probs, values, reward scores): the experience's
  rows cut into the schedule's `accumulate_steps` micro-batches, fleet's `eval_batch`, the
  per-row result computed on the last stage and broadcast to the group (`pipeline_rows`);
* the update: each optimiser step's micro-batches through `forward_backward_pipeline`, whose
  last stage turns the outputs into the trainer's own actor / critic loss (`ExperienceCriterion`
  with the fields the loss reads sent along as labels);
* generation: every stage's weights gathered into one plain model on every rank
  (`all_stage_states`) for each rollout or evaluation and released after it (`gathered_into`),
  which the rollout engine uses (`eval_mode` single; with tensor parallel and `eval_mode`
  tensor_parallel, each rank's slices of every stage, generated from without merging).
"""
import contextlib

import paddle
import paddle.distributed as dist
import paddle.nn as nn

from ...algos import entropy_from_logits, token_logprobs
from .pipe import all_stage_states, pipeline_group

def row_groups(rows, groups):
    """`rows` row indices dealt into `groups` lists (row i to group i % groups)."""
    return [list(range(rows))[g::groups] for g in range(groups)]


def first_stage_inputs(exp):
    """The first stage's inputs for an experience: `(sequences, attention_mask as bool,
    position_ids)`, each `[n, T]` (PaddleNLP's pipeline embedding reads an int mask as
    FlashMask indices on GPU)."""
    return exp.sequences, exp.attention_mask.astype("bool"), exp.position_ids


def response_logprobs_from_logits(logits, exp, temperature, with_entropy=False):
    """Response log-probs `[n, Tr]` (and entropies, else None) from the last stage's logits
    `[n, T, V]`, 0 outside the response mask, as `ppo.experience.forward.response_logprobs`."""
    P, Tr = exp.prompt_len, exp.response_ids.shape[1]
    z = logits[:, P - 1 : P - 1 + Tr].astype("float32")
    if temperature != 1.0:
        z = z / temperature
    counted = exp.response_mask != 0
    zeros = paddle.zeros(counted.shape, "float32")
    logp = paddle.where(counted, token_logprobs(z, exp.response_ids), zeros)
    entropy = paddle.where(counted, entropy_from_logits(z), zeros) if with_entropy else None
    return logp, entropy


def response_values_from_scores(scores, exp):
    """Critic values `[n, Tr]` from per-token scores `[n, T]`, as `ppo.experience.forward.response_values`."""
    P, Tr = exp.prompt_len, exp.response_ids.shape[1]
    return scores[:, P - 1 : P - 1 + Tr].astype("float32") * exp.response_mask


def pipeline_rows(model, exp, per_row, tail_shape, groups=None):
    """A per-row result of `exp` through a wrapped pipeline model without gradients:
    `per_row(output, micro_exp)` (on the last stage, for each micro-batch's output) gives
    `[n_i, *tail_shape]` float32; returns `[N, *tail_shape]` in `exp`'s row order on every rank
    of the pipeline group (broadcast from the last stage)."""
    steps = model.accumulate_steps
    groups = groups or row_groups(len(exp), steps)
    micro = [exp.select(g or [0]) for g in groups]  # a group without rows repeats row 0, dropped below
    firsts = [first_stage_inputs(m) for m in micro]
    data = [tuple(list(column) for column in zip(*firsts)), [m.attention_mask for m in micro]]
    model._p2p_helper.clear_meta_cache()
    with paddle.no_grad():
        outputs = model.eval_batch(data, compute_loss=False)
    model._p2p_helper.clear_meta_cache()
    result = paddle.zeros([len(exp), *tail_shape], dtype="float32")
    if model.is_pipeline_last_stage():
        with paddle.no_grad():
            order = [r for g in groups for r in g]
            parts = [per_row(out, m)[: len(g)] for out, m, g in zip(outputs, micro, groups)]
            values = paddle.concat([p for p in parts if p.shape[0]], axis=0)
            inverse = paddle.to_tensor(sorted(range(len(order)), key=order.__getitem__), dtype="int64")
            result = paddle.index_select(values.astype("float32"), inverse, axis=0)
    group = pipeline_group()
    dist.broadcast(result, src=group.ranks[-1], group=group)
    return result


class ExperienceCriterion(nn.Layer):
    """Last-stage loss of an actor or critic pipe: `output` (logits `[n, T, V]` or scores
    `[n, T]`) and `labels` (the micro-batch's `fields`, in that order) ->
    `objective(micro_exp, output)`'s loss times the number of micro-batches (fleet's schedule
    divides each micro-batch's loss by it; the trainer's losses are already normalised by the
    whole step's token count). `record(stats)` receives each micro-batch's statistics.
    `prepare(prompt_len, fields, objective, tail)` is called by the trainer before each
    schedule: the first `accumulate_steps` micro-batches are experience rows, then one more
    micro-batch for each `(fields, objective)` in `tail` (PPO's ptx batches). `view(prompt_len,
    {field: tensor})` builds the micro-batch the objective reads from its labels."""

    def __init__(self, accumulate_steps, record, view):
        super().__init__()
        self.accumulate_steps, self.record, self.view = accumulate_steps, record, view
        self.prompt_len, self.kinds, self.calls, self.real_rows = None, [], 0, []

    def prepare(self, prompt_len, fields, objective, tail=(), real_rows=None):
        """`real_rows`: the experience micro-batches' real rows (the rest stand in; None: all real)."""
        self.prompt_len, self.calls = prompt_len, 0
        self.kinds = [(tuple(fields), objective)] * self.accumulate_steps + [(tuple(f), o) for f, o in tail]
        self.real_rows = list(real_rows) if real_rows is not None else [None] * self.accumulate_steps

    def router_loss_share(self):
        """`(real rows, weight)` of the next micro-batch's router loss (a mixture-of-experts actor,
        `family_moe_pipe.RouterLossCriterion`): the plain update adds each real micro-batch's
        router loss over their count, the schedule divides every loss by `len(kinds)`; stand-in
        and ptx micro-batches add none."""
        if self.calls >= self.accumulate_steps or self.real_rows[self.calls] == 0:
            return 0, 0.0
        real = sum(1 for rows in self.real_rows if rows != 0)
        return self.real_rows[self.calls], len(self.kinds) / real

    def forward(self, output, labels):
        fields, objective = self.kinds[self.calls]  # the last stage sees the micro-batches in order
        self.calls += 1
        loss, stats = objective(self.view(self.prompt_len, dict(zip(fields, labels))), output)
        self.record(stats)
        return loss * len(self.kinds)


def padded_right(tensor, width, value):
    """`tensor [n, T]` with columns of `value` appended up to `width`."""
    extra = width - tensor.shape[1]
    if extra <= 0:
        return tensor
    return paddle.concat([tensor, paddle.full([tensor.shape[0], extra], value, dtype=tensor.dtype)], axis=1)


def padded_first_stage_inputs(firsts, width, pad_token_id):
    """First-stage inputs `(ids, bool mask, position_ids)`, each `[n, T]`, padded on the right
    to `width` (masked columns: the outputs at the other positions do not change)."""
    ids, mask, positions = firsts
    return padded_right(ids, width, pad_token_id), padded_right(mask, width, False), padded_right(positions, width, 0)


def supervised_micro_batch(batch, rows, width, pad_token_id):
    """A supervised batch (`input_ids`, `attention_mask`, `labels`, each `[n, T]`, labels in
    input alignment, -100 where not counted) as the first stage's inputs and its labels, padded
    to `[rows, width]`: extra rows repeat the first row with no label counted, extra columns
    are masked padding."""
    from ...models.causal_lm import position_ids_from_mask

    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    n = ids.shape[0]
    if n > rows:
        raise ValueError(f"a supervised batch of {n} rows for micro-batches of {rows}")
    if n < rows:
        index = paddle.to_tensor(list(range(n)) + [0] * (rows - n), dtype="int64")
        ids, mask, labels = (paddle.index_select(t, index, axis=0) for t in (ids, mask, labels))
        counted = paddle.to_tensor([[1]] * n + [[0]] * (rows - n), dtype="bool")
        labels = paddle.where(counted, labels, paddle.full_like(labels, -100))
    firsts = (ids, mask.astype("bool"), position_ids_from_mask(mask))
    return padded_first_stage_inputs(firsts, width, pad_token_id), [padded_right(labels, width, -100)]


class FrozenModelLoss(nn.Layer):
    """The loss slot of a frozen pipeline model (fleet's `eval_batch` requires one; with
    `compute_loss=False` it is never called)."""

    def forward(self, output, labels):
        raise RuntimeError("a frozen pipeline model (reference or reward) has no training loss")


def schedule_data(micro, width=None, pad_token_id=0):
    """`[first-stage inputs, labels]` of a list of micro-batch experiences for fleet's
    schedule, and the label field names: the tensors the losses read (`loss_tensors()`). The
    micro-batches of one schedule must have one shape (fleet sizes the gradient it receives
    for a micro-batch by the last activation it sent): the same rows (`padded_micro_batch`),
    and one experience's width, padded on the right to `width` when given."""
    named = [m.loss_tensors() for m in micro]
    fields = list(named[0])
    firsts = [first_stage_inputs(m) for m in micro]
    if width is not None:
        firsts = [padded_first_stage_inputs(f, width, pad_token_id) for f in firsts]
    labels = [[n[f] for f in fields] for n in named]
    return [tuple(list(column) for column in zip(*firsts)), labels], fields


def padded_micro_batch(exp, rows, count):
    """`exp`'s rows `rows` followed by copies of its first row with an empty response mask, up
    to `count` rows: the extra rows change no loss and no gradient (no rows: a stand-in that
    fills a short optimiser step up to the schedule's fixed number of micro-batches)."""
    mb = exp.select(list(rows) + [0] * (count - len(rows)))
    if len(rows) < count:
        keep = paddle.to_tensor([[1]] * len(rows) + [[0]] * (count - len(rows)), dtype=mb.response_mask.dtype)
        mb.response_mask = mb.response_mask * keep
    return mb


def plain_copy_of(pipe, keep_tensor_parallel=False):
    """An empty plain causal LM (PaddleNLP's non-pipeline class) of a causal-LM pipe's config,
    frozen, in eval mode, its parameters released (no storage): the whole model on one rank, for
    generation. `gathered_into` fills it for a rollout or an evaluation and releases it after.
    `keep_tensor_parallel`: a tensor-parallel plain model holding this rank's slices of every
    stage (the rollout engine's `eval_mode` tensor_parallel), instead of whole weights."""
    import copy

    from .pipe import plain_class

    config = copy.deepcopy(pipe.config)
    if not keep_tensor_parallel:
        config.tensor_parallel_degree, config.tensor_parallel_rank = 1, 0  # whole weights (see all_stage_states)
    model = plain_class(config).from_config(config, dtype=config.dtype or "float32")
    model.eval()
    for p in model.parameters():
        p.stop_gradient = True
    release_plain_copy(model)
    return model


def fill_plain_copy(plain, pipe):
    """Point `plain`'s parameters at every stage's current weights of `pipe`, tensor-parallel
    slices merged (or this rank's slices, for a tensor-parallel `plain`): this rank's own stage
    is shared (no copy), the other stages' tensors are the ones broadcast to this rank
    (collective over the pipeline and model-parallel groups: all their ranks call it).
    Returns `plain`."""
    states = all_stage_states(pipe, merge_tensor_parallel=getattr(plain.config, "tensor_parallel_degree", 1) <= 1)
    targets = plain.state_dict()
    missing = sorted(k for k in targets if k not in states)
    if missing:
        raise RuntimeError(f"the pipeline stages did not give the plain copy {missing[:5]}")
    for name, target in targets.items():
        value = states[name]
        if list(value.shape) != list(target.shape):
            raise RuntimeError(f"{name}: the stages give shape {list(value.shape)}, the plain copy has {list(target.shape)}")
        if value.dtype != target.dtype:
            value = value.astype(target.dtype)
        value._share_buffer_to(target)
    return plain


def release_plain_copy(plain):
    """Drop the storage of every parameter of `plain` (shapes and dtypes stay); a forward
    through it fails until `fill_plain_copy` fills it again."""
    for p in plain.parameters():
        p._clear_data()


@contextlib.contextmanager
def gathered_into(plain, pipe):
    """`plain` holding `pipe`'s current weights (`fill_plain_copy`) inside the block, released
    when the block ends: the generation layout lives only for one rollout or evaluation."""
    fill_plain_copy(plain, pipe)
    try:
        yield plain
    finally:
        release_plain_copy(plain)
