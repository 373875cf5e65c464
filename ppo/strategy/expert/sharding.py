"""Expert parallelism with sharding stage 1 (fleet's `DygraphShardingOptimizer`, PaddleNLP's
``sharding: stage1``), when the sharding group is the expert-parallel group
(``sharding_parallel_degree == expert_parallel_degree``: both are consecutive data ranks).

Stage 1 partitions the optimiser's parameters over the sharding ranks by position: rank r
updates the parameters of its part and broadcasts them to the group after the step, and the
gradients are reduced to their owner before it. The experts at one position are different
experts on different ranks (rank 0's ``mlp.experts.0`` where rank 1 holds ``mlp.experts.2``), so
`adopt_sharding_optimizer` takes them out of that partition: every rank owns and steps its own
experts (their AdamW states stay with them, as without sharding), their gradients are never
reduced over the group (`ppo.strategy.expert.grads` syncs them) and never broadcast. The other
parameters keep fleet's partition. The global norm then sums each rank's part of the other
parameters and its own experts over the sharding group: every expert counted once."""
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import \
    DygraphShardingOptimizer


class ExpertShardingOptimizer(DygraphShardingOptimizer):
    """`DygraphShardingOptimizer` whose gradient reduce and parameter broadcast leave out
    `expert_ids` (this rank's experts, in its own part)."""

    expert_ids = frozenset()

    def reduce_gradients(self, parameter_list, hcg):
        return super().reduce_gradients([p for p in parameter_list if id(p) not in self.expert_ids], hcg)

    def _sharding_sync_parameters(self):
        whole = self._rank2params
        self._rank2params = {r: [p for p in params if id(p) not in self.expert_ids] for r, params in whole.items()}
        try:
            super()._sharding_sync_parameters()
        finally:
            self._rank2params = whole


def sharding_optimizer(optimizer):
    """Fleet's stage-1 sharding optimizer inside `optimizer`'s wrappers, or None."""
    while optimizer is not None and not isinstance(optimizer, DygraphShardingOptimizer):
        optimizer = vars(optimizer).get("_inner_opt")
    return optimizer


def adopt_sharding_optimizer(optimizer, expert_params):
    """Give this rank's `expert_params` to its own part of the stage-1 sharding optimizer inside
    `optimizer` (see the module docstring); returns the sharding group, None without sharding."""
    sharding = sharding_optimizer(optimizer)
    if sharding is None:
        return None
    if sharding.tensor_fusion or sharding.comm_overlap:
        raise ValueError("expert parallelism with sharding: tensor_fusion / comm_overlap are not supported")
    ids = frozenset(id(p) for p in expert_params)
    own = sharding._rank2params[sharding._sharding_rank]  # also the inner optimiser's parameter list
    for params in sharding._rank2params.values():
        params[:] = [p for p in params if id(p) not in ids]
    own.extend(expert_params)
    for p in expert_params:
        sharding._param2rank[p.name] = sharding._sharding_rank
    sharding.__class__ = ExpertShardingOptimizer
    sharding.expert_ids = ids
    return sharding._hcg.get_sharding_parallel_group()
