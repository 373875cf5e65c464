"""The DPO family under `pipeline_parallel_degree > 1`: the policy is PaddleNLP's causal-LM
pipe (`ppo.strategy.pipeline.pipe.load_pipe`) whose last stage computes the preference loss, and the
reference is a second pipe, split over the same stages, that only runs forward passes.

One training step (`gradient_accumulation_steps` micro-batches of `m` pairs each):

1. `PreferencePolicyInputs` stacks each micro-batch's pairs (`[2m, T]`, chosen rows first,
   as `dpo.dpo_trainer` does for a batch) and right-pads all micro-batches alike;
2. the reference's summed answer log-probs of every micro-batch come from the reference
   pipe's `eval_batch`, broadcast from its last stage (`pipeline_answer_logps`), and travel
   to the policy's last stage with the labels; so does KTO's KL reference point, from both
   pipes' log-probs on the mismatched pairs;
3. fleet's 1F1B schedule runs the policy; its last stage turns each micro-batch's logits into
   summed answer log-probs and lengths and applies the preference objective
   (`PreferenceCriterion`), whose detached statistics go to the trainer's log.
"""
import paddle
import paddle.distributed as dist
import paddle.nn as nn

from ...algos import masked_sum, token_logprobs
from ...data import IGNORE_INDEX
from .pipe import pipeline_group
from .score_pipe import PreferencePipelineInputs, stack_pairs

PAIR_KEYS = ("input_ids", "attention_mask", "labels")


def answer_logps_from_logits(logits, labels):
    """Summed answer log-probs and answer lengths, both `[N]` float32, from
    `logits [N, T, V]` and `labels [N, T]` in input alignment (-100 off the answer): the sum
    over t of `log p(labels[:, t + 1] | tokens <= t)` where `labels[:, t + 1]` is an answer token."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    tok = token_logprobs(logits[:, :-1].astype("float32"), targets)
    return masked_sum(tok, mask, axis=-1), mask.astype("float32").sum(axis=-1)


def kl_sides(batch):
    """KTO's mismatched examples (`kl_*` `[2B, T]`, `dpo.dpo_trainer.KTOCollator`) in the
    layout of a preference batch: rows `[:B]` as `kl_better_*`, rows `[B:]` as `kl_worse_*`, so
    that they are cut into micro-batches like the pairs they were built from."""
    B = int(batch["kl_input_ids"].shape[0]) // 2
    out = {}
    for key in PAIR_KEYS:
        value = batch[f"kl_{key}"]
        out[f"kl_better_{key}"], out[f"kl_worse_{key}"] = value[:B], value[B:]
    return out


class PreferenceCriterion(nn.Layer):
    """Last-stage loss of the policy pipe: `logits [2m, T, V]` and
    `labels = [labels [2m, T], reference log-probs [2m], KL reference point [1]]` ->
    `objective(logps, lengths, reference, kl_point)`'s loss (a scalar); its statistics (a
    dict of detached scalars) go to `record(stats)`. `reference` / `kl_point` are passed as
    None when `uses_reference` / `uses_kl_point` is false (the tensors sent are then zeros)."""

    def __init__(self, objective, record, uses_reference, uses_kl_point):
        super().__init__()
        self.objective, self.record = objective, record
        self.uses_reference, self.uses_kl_point = uses_reference, uses_kl_point

    def forward(self, logits, labels):
        labels, reference, kl_point = labels
        logps, lengths = answer_logps_from_logits(logits, labels)
        loss, stats = self.objective(
            logps, lengths, reference if self.uses_reference else None, kl_point.reshape([]) if self.uses_kl_point else None
        )
        self.record(stats)
        return loss


def pipeline_answer_logps(model, micro_batches):
    """Summed answer log-probs and answer lengths of each micro-batch (dicts of `input_ids`,
    `attention_mask`, `labels` `[n_i, T_i]`) through a wrapped pipeline model (fleet's
    `PipelineParallel`; as many micro-batches as its `accumulate_steps`), without gradients:
    a list of `(logps [n_i], lengths [n_i])` float32, the same on every rank of the pipeline
    group (computed on the last stage, broadcast from it)."""
    prepare = model._layers._prepare_pipeline_inputs_func
    firsts = [prepare.first_stage(b) for b in micro_batches]
    data = [tuple(list(column) for column in zip(*firsts)), [b["labels"] for b in micro_batches]]
    model._p2p_helper.clear_meta_cache()
    with paddle.no_grad():
        outputs = model.eval_batch(data, compute_loss=False)
    model._p2p_helper.clear_meta_cache()
    sizes = [int(b["input_ids"].shape[0]) for b in micro_batches]
    flat = paddle.zeros([sum(sizes), 2], dtype="float32")
    if model.is_pipeline_last_stage():
        with paddle.no_grad():
            parts = [paddle.stack(answer_logps_from_logits(logits, b["labels"]), axis=-1) for logits, b in zip(outputs, micro_batches)]
        flat = paddle.concat(parts, axis=0)
    group = pipeline_group()
    dist.broadcast(flat, src=group.ranks[-1], group=group)
    parts = paddle.split(flat, sizes, axis=0)
    return [(p[:, 0], p[:, 1]) for p in parts]


class PreferencePolicyInputs(PreferencePipelineInputs):
    """The `Trainer`'s `_prepare_pipeline_inputs_func` of the policy pipe (`PreferenceCriterion`).

    Training gets `accumulate_steps` collated preference batches (`better_*`, `worse_*`, and
    `kl_*` for KTO) and returns `[(input_ids, mask, position_ids), labels]`, one entry per
    micro-batch, each micro-batch's pairs stacked and all right-padded to the widest; a
    micro-batch's labels are `[labels, reference log-probs, KL reference point]`, from the
    callables set by the trainer: `reference(micro_batches)` (a `pipeline_answer_logps` list)
    and `kl_point(micro_batches)` (one scalar per micro-batch). Either may be None (zeros sent).

    Evaluation does not go through the `Trainer`'s loss: `evaluation_groups` cuts a batch into
    the schedule's micro-batches for `pipeline_answer_logps`, `ungroup` puts the rows back.
    """

    pad_values = {
        f"{side}_{key}": value
        for side in ("better", "worse", "kl_better", "kl_worse")
        for key, value in (("attention_mask", 0), ("labels", IGNORE_INDEX))
    }
    stacked_keys = PAIR_KEYS

    def __init__(self, accumulate_steps):
        super().__init__(accumulate_steps)
        self.reference = None
        self.kl_point = None

    def __call__(self, inputs):
        if isinstance(inputs, dict):
            raise ValueError("preference batches are evaluated with pipeline_answer_logps, not the Trainer's loss")
        if len(inputs) != self.accumulate_steps:
            raise ValueError(f"expected {self.accumulate_steps} micro-batches, got {len(inputs)}")
        width = max(int(b["better_input_ids"].shape[1]) for b in inputs)
        padded = [self.right_pad(b, width) for b in inputs]
        stacked = [stack_pairs(b, PAIR_KEYS) for b in padded]
        rows = [int(b["input_ids"].shape[0]) for b in stacked]
        if self.reference is not None:
            reference = [logps for logps, _ in self.reference(stacked)]
        else:
            reference = [paddle.zeros([n], dtype="float32") for n in rows]
        if self.kl_point is not None:
            kl_width = max(int(b["kl_input_ids"].shape[1]) for b in inputs)
            kl = [stack_pairs(self.right_pad(kl_sides(b), kl_width), PAIR_KEYS, "kl_") for b in inputs]
            kl_points = [paddle.reshape(z, [1]).astype("float32") for z in self.kl_point(kl)]
        else:
            kl_points = [paddle.zeros([1], dtype="float32") for _ in rows]
        firsts = [self.first_stage(b) for b in stacked]
        lasts = [[b["labels"], ref, z] for b, ref, z in zip(stacked, reference, kl_points)]
        return [tuple(list(column) for column in zip(*firsts)), lasts]
