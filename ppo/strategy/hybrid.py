"""Fleet's data and sharding axes, shared by every layout that runs under fleet's hybrid
parallelism (`ppo.strategy.tensor`, `ppo.strategy.pipeline`): the trained model and optimiser
wrapped by `fleet.distributed_model` / `fleet.distributed_optimizer` (data-parallel all-reduce
and sharding inside the optimiser's step, see `ppo.strategy.grad_sync`), and which ranks take
part in writing a model (the data-parallel and sharding rank 0 of every model-parallel part)."""


class FleetAxes:
    """Data x sharding under fleet; `ranks`: the run's `Ranks`."""

    def __init__(self, ranks):
        self.ranks = ranks

    def wrap(self, model, optimizer):
        if model is None or self.ranks.world_size == 1:
            return model, optimizer
        from paddle.distributed import fleet

        return fleet.distributed_model(model), fleet.distributed_optimizer(optimizer)

    def saves_models(self, model_parallel_groups):
        """Rank 0, and with tensor or pipeline parallelism (`model_parallel_groups` not all None)
        every rank holding a part of rank 0's copy of the model (the merge gathers from them):
        data-parallel and sharding rank 0."""
        if all(group is None for group in model_parallel_groups):
            return self.ranks.is_main
        from paddle.distributed import fleet

        hcg = fleet.get_hybrid_communicate_group()
        return hcg.get_data_parallel_rank() == 0 and hcg.get_sharding_parallel_rank() == 0
