"""Tensor-parallel layers of the model classes, shared by the trainers and the rollout engine.

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
* `gather_full_weight(tensor, kind, group)`: one weight put back together from its slices by
  its kind (`ppo.models.tensor_slices`; the rollout engine runs the whole model on every rank,
  see `ppo.rollout.weights`).

Every layout builds the same model classes from these (each is an identity or None at degree
1); the tensor layout's own pieces (merged saves, this rank's slices of a checkpoint,
resharding whole state dicts) live in `ppo.strategy.tensor`.
"""
import paddle
import paddle.distributed as dist

from ..common.parallel_groups import model_parallel_group
from .basics import unwrap_model
from .tensor_slices import merge

_OPS = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}


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


def gather_full_weight(tensor, kind, group):
    """The full tensor from the slices every rank of `group` holds (rank order), put back together
    by its tensor-parallel `kind` (`ppo.models.tensor_slices.merge`: "column", "row",
    "column_2fuse"). No gradient."""
    with paddle.no_grad():
        parts = []
        dist.all_gather(parts, tensor, group=group)
        return merge(parts, kind)
