"""Where the experts of a mixture-of-experts model live under expert parallelism, and the
model-side hook.

`ExpertLayout(degree, rank, world, model_parallel)`: the data-parallel ranks form ``data_world /
degree`` expert-parallel groups of ``degree`` consecutive data ranks (``[0, 1], [2, 3]`` at
degree 2 on 4 data ranks), carved out of the data-parallel ranks as in PaddleNLP's
``add_moe_comm_group`` and Megatron-LM: every rank still reads its own data. Inside a group,
rank ``g`` owns experts ``e`` with ``e // (E / degree) == g``; the ranks holding the same
experts (``[0, 2], [1, 3]``) form the expert gradient group. With tensor parallelism
(``model_parallel`` n > 1, fleet's order: rank ``= data_rank * n + model-parallel rank``) every
data rank is n processes, each holding a width slice of every layer; the groups above are
formed once per model-parallel rank, among the processes holding the same slice (Megatron-LM's
expert-tensor-parallel size equal to the tensor-parallel size: each expert split along its
width as the dense MLP is, `ppo.models.families.tensor_parallel`). A process then exchanges
tokens with the processes of the other data ranks that hold the same slice of the other
experts, and the model-parallel all-reduce inside each expert's row-parallel ``down_proj`` adds
the slices up, as without expert parallelism.

`shard_experts(model, layout)` keeps only the owned experts of every sparse block
(`ppo.models.families.moe.SparseMoeBlock`) in an ``nn.LayerDict`` keyed by the global expert
index, so parameter names stay the one-process ones (``mlp.experts.2.up_proj.weight``), and
sets the block's ``expert_parallel`` hook: its forward then runs the token exchange
(`ppo.strategy.expert.exchange`). Expert parameters get ``no_sync`` (`paddle.DataParallel`
and the fleet gradient sync leave them alone), ``is_distributed`` (the gradient norm sums them
over the group, as tensor-parallel slices) and ``expert_parallel``. `whole_experts(model)`
gathers every expert into every rank for a block (saving a checkpoint, generating): a collective.
"""
import contextlib
import logging

import paddle
import paddle.distributed as dist
import paddle.nn as nn

from .checks import expert_degree
from .exchange import GroupComm, exchange_dispatch

logger = logging.getLogger("ppo")


class ExpertLayout:
    """The expert-parallel groups of `world` ranks at `degree`, `model_parallel` ranks per data
    rank (see the module docstring). The process groups are made by `build_groups` (every rank
    calls it, in the same order)."""

    def __init__(self, degree, rank=0, world=1, model_parallel=1):
        if model_parallel < 1 or world % model_parallel:
            raise ValueError(f"tensor_parallel_degree {model_parallel} does not divide the {world} ranks")
        data_world = world // model_parallel
        if degree < 1 or data_world % degree:
            raise ValueError(f"expert_parallel_degree {degree} does not divide the {data_world} data-parallel ranks "
                             f"({world} ranks / tensor_parallel_degree {model_parallel})" if model_parallel > 1 else
                             f"expert_parallel_degree {degree} does not divide the {world} ranks")
        self.degree, self.rank, self.world, self.model_parallel = degree, rank, world, model_parallel
        self.data_rank, self.mp_rank, self.data_world = rank // model_parallel, rank % model_parallel, data_world
        self.group_rank = self.data_rank % degree
        self.comm, self.grad_comm = GroupComm(None), None  # grad_comm: None when each expert has one holder

    def _global(self, data_rank, mp_rank):
        return data_rank * self.model_parallel + mp_rank

    def exchange_groups(self):
        """Every expert-parallel group (global ranks), in the order `build_groups` makes them."""
        return [[self._global(start + g, m) for g in range(self.degree)]
                for m in range(self.model_parallel) for start in range(0, self.data_world, self.degree)]

    def gradient_groups(self):
        """Every expert gradient group (global ranks holding the same experts' same slice); empty
        when each expert slice has one holder."""
        if self.degree == self.data_world:
            return []
        return [[self._global(d, m) for d in range(offset, self.data_world, self.degree)]
                for m in range(self.model_parallel) for offset in range(self.degree)]

    def build_groups(self):
        """The exchange group (all ranks when `degree` is the world) and the expert gradient group."""
        if self.degree == self.world or self.degree == 1:
            return self
        for ranks in self.exchange_groups():
            group = dist.new_group(ranks)
            if self.rank in ranks:
                self.comm = GroupComm(group)
        for ranks in self.gradient_groups():
            group = dist.new_group(ranks)
            if self.rank in ranks:
                self.grad_comm = GroupComm(group)
        return self

    def owned(self, num_experts):
        """The global indices of the experts this rank holds."""
        if num_experts % self.degree:
            raise ValueError(f"expert_parallel_degree {self.degree} does not divide num_experts {num_experts}")
        per = num_experts // self.degree
        return list(range(self.group_rank * per, (self.group_rank + 1) * per))


class ExpertDispatch:
    """A sparse block's ``expert_parallel`` hook: ``(x [N, H], weights [N, k], indices [N, k],
    experts) -> [N, H]`` through the exchange; `make_expert()` builds one expert (`whole_experts`)."""

    def __init__(self, layout, make_expert):
        self.layout, self.make_expert = layout, make_expert

    def __call__(self, x, weights, indices, experts):
        local = {int(key): layer for key, layer in experts.items()}
        return exchange_dispatch(x, weights, indices, local, self.layout.group_rank, self.layout.comm)


def sparse_blocks(model):
    from ppo.models.families.moe import SparseMoeBlock

    return [layer for layer in model.sublayers() if isinstance(layer, SparseMoeBlock)]


def expert_parameters(model):
    """The parameters of the experts this rank holds (empty when not sharded)."""
    return [p for block in sparse_blocks(model) if getattr(block, "expert_parallel", None) is not None
            for p in block.experts.parameters()]


def shard_experts(model, layout, config):
    """Keep this rank's experts of every sparse block of `model` (see the module docstring);
    `config` has ``moe_intermediate_size``. Returns the number of blocks sharded."""
    from ppo.models.families.decoder import MLP

    blocks = sparse_blocks(model)
    for block in blocks:
        kept = nn.LayerDict({str(e): block.experts[e] for e in layout.owned(len(block.experts))})
        block.experts = kept
        block.expert_parallel = ExpertDispatch(layout, lambda: MLP(config, config.moe_intermediate_size))
        for p in kept.parameters():
            p.no_sync, p.is_distributed, p.expert_parallel = True, True, True
    if blocks:
        logger.info(f"expert parallel: rank {layout.rank} holds experts {layout.owned(config.num_experts)} of "
                    f"{config.num_experts} in {len(blocks)} sparse blocks (expert_parallel_degree {layout.degree}"
                    + (f", tensor-parallel slice {layout.mp_rank} of {layout.model_parallel})" if layout.model_parallel > 1 else ")"))
    return len(blocks)


def _gathered_experts(block):
    """An ``nn.LayerList`` of all the block's experts, every rank's weights gathered."""
    hook, layout = block.expert_parallel, block.expert_parallel.layout
    local = [block.experts[key] for key in sorted(block.experts, key=int)]
    whole = []
    for _ in range(len(local) * layout.degree):
        expert = hook.make_expert()
        whole.append(expert.to(dtype=local[0].parameters()[0].dtype) or expert)
    names = [n for n, _ in local[0].named_parameters()]
    for name in names:
        mine = paddle.stack([dict(e.named_parameters())[name].detach() for e in local])
        parts = layout.comm.all_gather(mine)
        for e, value in enumerate(paddle.concat(parts, axis=0)):
            dict(whole[e].named_parameters())[name].set_value(value)
    return nn.LayerList(whole)


@contextlib.contextmanager
def whole_experts(model):
    """Every sparse block of `model` holds all its experts (gathered) inside the block, and
    computes them locally; the sharded experts come back after it. Collective; nests."""
    blocks = [b for b in sparse_blocks(model) if getattr(b, "expert_parallel", None) is not None]
    saved = []
    with paddle.no_grad():
        for block in blocks:
            saved.append((block.experts, block.expert_parallel))
            block.experts = _gathered_experts(block)
            block.expert_parallel = None
    try:
        yield model
    finally:
        for block, (experts, hook) in zip(blocks, saved):
            block.experts, block.expert_parallel = experts, hook


def expert_layout(args, rank, world):
    """The `ExpertLayout` of `args` for `rank` of `world` (groups not built yet): expert groups of
    data ranks, one set per tensor-parallel slice; its data rank must be the run's."""
    model_parallel = max(int(getattr(args, "tensor_parallel_degree", 1) or 1), 1)
    layout = ExpertLayout(expert_degree(args), rank, world, model_parallel)
    data_rank = getattr(args, "dataset_rank", layout.data_rank)
    if data_rank != layout.data_rank:
        raise RuntimeError(f"expert parallelism: rank {rank} reads data rank {data_rank}, the layout expects "
                           f"{layout.data_rank} (tensor_parallel_degree {model_parallel}); fleet's rank order differs")
    return layout
