"""The gradients an optimiser step will use, seen before the step runs.

`paddle.DataParallel` all-reduces gradients during the backward pass, but fleet's
`HybridParallelOptimizer` (data parallel combined with tensor parallel, or sharding) does its
data-parallel all-reduce and its sharding reduce inside `step()`. A gradient norm or a
finiteness check taken before `step()` would then see this rank's local gradients: a wrong
norm, and ranks that disagree on whether to skip a step (one rank skipping a step the others
take would stop the collectives inside it). `prepare_step` runs the optimizer's own gradient
sync first (leaving out the parameters marked ``no_sync``, as `paddle.DataParallel` and
PaddleNLP's Trainer do: expert-parallel experts, whose gradients `ppo.strategy.expert` syncs)
and returns the parameters whose gradients this rank holds after it, the group
those are summed over, and the rest of the step.
"""
from dataclasses import dataclass
from typing import Callable, List, Optional

import paddle
import paddle.distributed as dist


@dataclass
class PreparedStep:
    """`params`: parameters with a gradient that this rank counts (its own shard under
    sharding, all of them otherwise); `sharding_group`: the group whose ranks hold the other
    shards (None without sharding); `step()`: the optimiser step without a second sync."""

    params: List[paddle.Tensor]
    sharding_group: Optional[object]
    step: Callable[[], None]


def _hybrid_optimizer(optimizer):
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import HybridParallelOptimizer

    return optimizer if isinstance(optimizer, HybridParallelOptimizer) else None


def _reducing_groups(hybrid):
    """The groups fleet's sync sums gradients over: data parallel, and sharding when enabled."""
    hcg = hybrid._hcg
    groups = [hcg.get_data_parallel_group()] + ([hcg.get_sharding_parallel_group()] if hybrid._sharding_enable else [])
    return [g for g in groups if g.nranks > 1]


def fill_unreached_gradients(params, groups):
    """Give a zero gradient to each of `params` that has none on this rank but has one on another
    rank of `groups`; returns those. In a mixture of experts an expert that no token of this rank
    reached has no gradient here, and fleet's fused all-reduce would get buffers of other sizes
    on the ranks (gloo stops: "op.preamble.length <= op.nbytes"). The zero adds nothing to the
    sum, so the expert steps as in one process; one that no rank reached keeps no gradient
    anywhere, as in one process."""
    if not groups or not params:
        return []
    reached = paddle.to_tensor([int(p.grad is not None) for p in params], dtype="int32")
    for group in groups:
        dist.all_reduce(reached, group=group)
    filled = [p for p, n in zip(params, reached.numpy().tolist()) if n > 0 and p.grad is None]
    for p in filled:
        p.grad = paddle.zeros_like(p)
    return filled


def fill_unreached_before_sync(optimizer):
    """`fill_unreached_gradients` over the trainable parameters fleet's sync will reduce, when
    `optimizer` is fleet's hybrid optimiser with data-parallel or sharding ranks (a PaddleNLP
    Trainer's micro-step: its sync runs before the optimiser step, out of `prepare_step`'s reach)."""
    hybrid = _hybrid_optimizer(optimizer)
    if hybrid is None:
        return []
    from paddle.distributed.fleet.utils.hybrid_parallel_util import obtain_optimizer_parameters_list

    params = [p for p in obtain_optimizer_parameters_list(hybrid._inner_opt)
              if not p.stop_gradient and not getattr(p, "no_sync", False)]
    with paddle.no_grad():
        return fill_unreached_gradients(params, _reducing_groups(hybrid))


def prepare_step(model, optimizer):
    """Sync gradients as `optimizer.step()` would, now; see the module docstring."""
    params = [p for p in model.parameters() if not p.stop_gradient and p.grad is not None]
    hybrid = _hybrid_optimizer(optimizer)
    if hybrid is None:
        return PreparedStep(params, None, optimizer.step)
    from paddle.distributed.fleet.utils.hybrid_parallel_util import obtain_optimizer_parameters_list

    all_params = list(obtain_optimizer_parameters_list(hybrid._inner_opt))
    synced = [p for p in all_params if not getattr(p, "no_sync", False)]  # (experts: their own sync)
    with paddle.no_grad():  # data-parallel all-reduce; sharding: reduce to the owner. Not the `no_sync` ones
        fill_unreached_gradients([p for p in synced if not p.stop_gradient], _reducing_groups(hybrid))
        hybrid._hybrid_sync_grad(synced)
    params = [p for p in model.parameters() if not p.stop_gradient and p.grad is not None]  # the filled ones too
    sharding_group = None
    if hybrid._sharding_enable:
        owned = {id(p) for p in hybrid._inner_opt.filter_parameters(all_params, hybrid._hcg)}
        params = [p for p in params if id(p) in owned]
        sharding_group = hybrid._hcg.get_sharding_parallel_group()

    def step():
        with paddle.no_grad():
            hybrid._step(all_params)

    return PreparedStep(params, sharding_group, step)


def squared_grad_norm(params, model_parallel_group=None, sharding_group=None, pipeline_group=None, expert_group=None):
    """Squared norm of the whole gradient as a float: expert-parallel experts (``expert_parallel``)
    summed over `expert_group` when given, tensor-parallel slices (`is_distributed`, the experts
    among them) summed over `model_parallel_group`, replicated parameters counted once (their
    gradients are equal on every rank there), then every shard's part summed over
    `sharding_group` and every pipeline stage's over `pipeline_group`. A tied weight's copy on a
    later pipeline stage (``is_firstly_shared`` False, fleet's mark) is counted on the first only."""
    expert, split, whole = [], [], []
    for p in params:
        if not getattr(p, "is_firstly_shared", True):
            continue
        kind = expert if expert_group is not None and getattr(p, "expert_parallel", False) else (
            split if getattr(p, "is_distributed", False) else whole)
        kind.append(paddle.sum(paddle.square(p.grad.astype("float32"))))
    split_sum = paddle.add_n(split).reshape([1]) if split else paddle.zeros([1], "float32")
    if expert_group is not None:
        expert_sum = paddle.add_n(expert).reshape([1]) if expert else paddle.zeros([1], "float32")
        dist.all_reduce(expert_sum, group=expert_group)
        split_sum = expert_sum + split_sum
    if model_parallel_group is not None:
        dist.all_reduce(split_sum, group=model_parallel_group)
    total = (paddle.add_n(whole).reshape([1]) if whole else paddle.zeros([1], "float32")) + split_sum
    if sharding_group is not None:
        dist.all_reduce(total, group=sharding_group)
    if pipeline_group is not None:
        dist.all_reduce(total, group=pipeline_group)
    return float(total)
