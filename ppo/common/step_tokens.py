"""Counted tokens of a whole optimiser step, for token-mean losses that stay the same however a
step's rows are spread over gradient-accumulation micro-batches and data-parallel ranks.

A Trainer divides each micro-batch loss by `gradient_accumulation_steps` and data parallelism
averages the ranks' gradients, so a per-micro-batch token mean weights a token by the size of
the micro-batch it landed in. Scaling each micro-batch's summed NLL by
`micro_batches * data_ranks / tokens_of_the_step` instead gives every token of the step the same
weight (the `num_items_in_batch` fix of Hugging Face transformers 4.46)."""
import itertools

import paddle
import paddle.distributed as dist

STEP_TOKENS_KEY = "step_answer_tokens"


def global_token_count(local_count, dataset_world_size):
    """`local_count` summed over the ranks that read different data: a sum over every rank
    divided by the copies of each data shard (tensor- and pipeline-parallel ranks of one data
    rank hold the same batch). Collective: every rank calls it."""
    world = dist.get_world_size()
    if world <= 1:
        return float(local_count)
    total = paddle.to_tensor([float(local_count)], dtype="float64")
    dist.all_reduce(total)
    return float(total.numpy()[0]) * dataset_world_size / world


def answer_token_count(batch):
    """Answer tokens of a collated supervised batch (`labels [N, T]`, -100 off the answer;
    position t predicts token t + 1, so the first column never counts)."""
    return float((batch["labels"][:, 1:] >= 0).astype("float32").sum())


class StepTokenCounting:
    """DataLoader mixin: reads one optimiser step's micro-batches ahead and adds to each the
    step's counted tokens over every data rank under `STEP_TOKENS_KEY` (a float)."""

    step_token_settings = None  # (micro-batches per step, count function, dataset world size)

    def __iter__(self):
        per_step, count, dataset_world = self.step_token_settings
        batches = super().__iter__()
        while True:
            group = list(itertools.islice(batches, per_step))
            if not group:
                return
            if group[0] is None:  # a resumed stream's placeholders for the steps the Trainer skips
                yield from group
                continue
            total = global_token_count(sum(count(b) for b in group), dataset_world)
            for batch in group:
                batch[STEP_TOKENS_KEY] = total
                yield batch


def count_step_tokens(loader, micro_batches_per_step, dataset_world_size, count=answer_token_count):
    """`loader` (a `paddle.io.DataLoader`, kept an instance of its class so the Trainer still
    sets its sampler's epoch) yielding batches annotated by `StepTokenCounting`."""
    base = type(loader)
    loader.__class__ = type(f"StepTokenCounting{base.__name__}", (StepTokenCounting, base), {})
    loader.step_token_settings = (micro_batches_per_step, count, dataset_world_size)
    return loader


def step_token_scale(batch, micro_batches_per_step, dataset_world_size):
    """The factor turning a micro-batch's summed NLL into its share of the step's token mean
    (see the module docstring), or None when `batch` carries no step count."""
    total = batch.get(STEP_TOKENS_KEY)
    if total is None:
        return None
    return micro_batches_per_step * dataset_world_size / max(total, 1.0)
