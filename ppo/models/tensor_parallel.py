"""Tensor-parallel plumbing shared by the trainers and the rollout engine.

PaddleNLP builds a tensor-parallel Llama / Qwen2 (`tensor_parallel_degree > 1` in the
config, loaded with `from_pretrained(..., tensor_parallel_degree=R, tensor_parallel_rank=r)`
through the model's `_get_tensor_parallel_mappings`) from fleet's column / row parallel
linears and a vocabulary-parallel embedding: every rank keeps its slice of those weights
(`param.is_distributed` is True), the rest (norms, score heads) is replicated. This module:

* `model_parallel_group()`: fleet's model-parallel group, or None without tensor parallelism;
* `group_all_reduce(group)`: the `all_reduce(tensor, op)` that `ppo.algos.vocab_parallel`
  takes, on that group;
* `vocab_parallel_head(model)`: the LM head's slice of the vocabulary, for log-probs that
  never gather the vocabulary;
* `gather_full_weight(tensor, axis, group)`: one weight put back together from its slices
  (the rollout engine runs the whole model on every rank, see `ppo.rollout.weights`);
* `save_pretrained_merged(model, path)`: a checkpoint a single-rank run loads, and
  `split_for_this_rank(model, state_dict)`: such a checkpoint's slices for this rank.
"""
import paddle
import paddle.distributed as dist

from .basics import unwrap_model

_OPS = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}


def model_parallel_group():
    """Fleet's model-parallel group when tensor parallelism is on (more than one rank), else None."""
    from paddle.distributed import fleet

    try:
        hcg = fleet.get_hybrid_communicate_group()
    except Exception:  # fleet not initialised: no hybrid parallelism in this process
        return None
    if hcg is None or hcg.get_model_parallel_world_size() <= 1:
        return None
    return hcg.get_model_parallel_group()


def group_all_reduce(group):
    """`all_reduce(tensor, op) -> tensor` over `group` (`op` "max" or "sum"); the input is
    left as it was (the reduction is written into a copy)."""

    def all_reduce(tensor, op):
        out = tensor.clone()
        dist.all_reduce(out, op=_OPS[op], group=group)
        return out

    return all_reduce


def vocab_parallel_head(model):
    """`(weight, transpose_y, vocab_start, group)` of a column-parallel LM head whose weight
    holds this rank's vocabulary slice, or None when the head is not split. The slice of rank
    `r` is `[r * V_r, (r + 1) * V_r)` (PaddleNLP splits the vocabulary evenly)."""
    lm = unwrap_model(model)
    head = getattr(lm, "lm_head", None)
    weight = getattr(head, "weight", None)
    if weight is None or not getattr(weight, "is_distributed", False):
        return None
    group = model_parallel_group()
    if group is None:
        raise RuntimeError("the LM head weight is split across ranks but fleet has no model-parallel group")
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError("vocab-parallel log-probs: an LM head with a bias is not supported")
    transpose_y = bool(getattr(head, "transpose_y", False))
    width = int(weight.shape[0] if transpose_y else weight.shape[1])
    return weight, transpose_y, group.rank * width, group


def model_parallel_identity(x, group):
    """Identity forward, all-reduce of the gradient backward (Megatron-LM's `f`): the input of
    a column-parallel matmul whose output stays split."""
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops._c_identity(x, group=group)


def gather_full_weight(tensor, axis, group):
    """The full tensor from the slices every rank of `group` holds, concatenated along `axis`
    in rank order (how PaddleNLP splits column / row parallel weights). No gradient."""
    with paddle.no_grad():
        parts = []
        dist.all_gather(parts, tensor, group=group)
        return paddle.concat(parts, axis=axis)


def is_split(model):
    """Whether `model` (any wrappers) holds tensor-parallel slices."""
    return model_parallel_group() is not None and getattr(unwrap_model(model).config, "tensor_parallel_degree", 1) > 1


def save_pretrained_merged(model, path, **kwargs):
    """`save_pretrained` that merges tensor-parallel slices into one checkpoint (PaddleNLP's
    `merge_tensor_parallel`); every rank of the model-parallel group must call it, rank 0 of
    the group writes. Without tensor parallelism, a plain `save_pretrained`."""
    if is_split(model):
        model.save_pretrained(path, merge_tensor_parallel=True, **kwargs)
    else:
        model.save_pretrained(path, **kwargs)


def split_for_this_rank(model, state_dict):
    """A merged (single-rank) state dict cut to this rank's slices with the model's own
    tensor-parallel mappings (what `from_pretrained` does at load time); unchanged when
    `model` is not split. A LoRA adapter's state is split by its `LoRAModel` mappings."""
    if not is_split(model):
        return state_dict
    if type(model).__name__ == "LoRAModel":
        return model._convert_tensor_parallel(lora_state_dict=dict(state_dict))
    base = unwrap_model(model)
    return type(base).convert_tensor_parallel(None, base.config, state_dict=dict(state_dict))


class DatasetOrderMixin:
    """For PaddleNLP `Trainer` subclasses: draw the training batches as a single-process run
    does. When every rank reads the same batches (all ranks are tensor-parallel copies,
    `dataset_world_size == 1`), each draws the single-process batches; under data parallelism
    each data rank takes its share of every single-process global batch (`DataRankBatchSampler`),
    so that a data-parallel run trains on the batches of a one-process run with the same global
    batch. PaddleNLP switches to its `DistributedBatchSampler` (another shuffle) as soon as
    there are two processes, so a TP=2 run would otherwise train on another data order than
    the TP=1 run it should reproduce. Tensor-parallel ranks draw alike (PaddleNLP seeds numpy
    with the same seed on each); pipeline stages do not (PaddleNLP seeds numpy with
    `seed + 100 * stage`), so under pipeline parallelism every stage takes the first stage's
    draw (`FirstStageOrderSampler`): the first stage reads the inputs, the last the labels."""

    def _get_train_sampler(self):
        if self.train_dataset is None or self.args.world_size <= 1:
            return super()._get_train_sampler()
        if self.args.dataset_world_size > 1:
            return DataRankBatchSampler(
                self.train_dataset, self.args.per_device_train_batch_size, self.args.dataset_rank,
                self.args.dataset_world_size, self.args.dataloader_drop_last,
            )
        if self.args.pipeline_parallel_degree > 1:
            return paddle.io.BatchSampler(
                sampler=FirstStageOrderSampler(self.train_dataset), batch_size=self.args.per_device_train_batch_size,
                drop_last=self.args.dataloader_drop_last,
            )
        return paddle.io.BatchSampler(
            dataset=self.train_dataset, shuffle=True, batch_size=self.args.per_device_train_batch_size,
            drop_last=self.args.dataloader_drop_last,
        )


    def _get_eval_sampler(self, eval_dataset):
        """Under pipeline parallelism, PaddleNLP fills the last evaluation batch up with rows of
        the first one (its schedule needs `per_device_eval_batch_size` rows), so those rows count
        twice; the pipeline evaluation here takes any number of rows (`ppo.models.pipeline`), so
        the batches are the single-process ones."""
        if self.args.pipeline_parallel_degree > 1 and self.args.dataset_world_size == 1:
            return paddle.io.BatchSampler(eval_dataset, batch_size=self.args.per_device_eval_batch_size, shuffle=False)
        return super()._get_eval_sampler(eval_dataset)


class DataRankBatchSampler(paddle.io.BatchSampler):
    """The single-process order (a `RandomSampler` on numpy's global generator, drawn on global
    rank 0 and broadcast) cut into global batches of `batch_size * dataset_world_size` rows; data
    rank r takes rows `[r * batch_size, (r + 1) * batch_size)` of each. A short last global batch
    (without `drop_last`) is filled up from the start of the order, so that every rank yields the
    same number of batches (collectives stay in step)."""

    def __init__(self, dataset, batch_size, dataset_rank, dataset_world_size, drop_last=False):
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.rank, self.world = dataset_rank, dataset_world_size

    def __len__(self):
        rows, size = len(self.dataset), self.batch_size * self.world
        return rows // size if self.drop_last else -(-rows // size)

    def __iter__(self):
        order = paddle.to_tensor(list(paddle.io.RandomSampler(self.dataset)), dtype="int64")
        dist.broadcast(order, src=0)
        order = order.numpy().tolist()
        size = self.batch_size * self.world
        wrapped = order * (size // max(len(order), 1) + 2)  # room to fill the last global batch
        for start in range(0, len(self) * size, size):
            yield wrapped[start + self.rank * self.batch_size : start + (self.rank + 1) * self.batch_size]


class FirstStageOrderSampler(paddle.io.RandomSampler):
    """`RandomSampler` (numpy's global generator, as PaddleNLP's single-process runs) whose
    order, drawn on every rank, is the one the pipeline group's first stage drew (broadcast)."""

    def __iter__(self):
        from paddle.distributed import fleet

        order = paddle.to_tensor(list(super().__iter__()), dtype="int64")
        group = fleet.get_hybrid_communicate_group().get_pipe_parallel_group()
        dist.broadcast(order, src=group.ranks[0], group=group)
        yield from order.numpy().tolist()
