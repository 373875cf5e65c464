"""Fleet's process groups of the hybrid topology, looked up by any part of a run: each is None
when its axis is off (degree 1) or fleet is not initialised, so a caller needs no layout test.
The groups are fleet's (`fleet.get_hybrid_communicate_group()`); the layouts that create them
live in `ppo.strategy`."""


def _hcg():
    from paddle.distributed import fleet

    try:
        return fleet.get_hybrid_communicate_group()
    except Exception:  # fleet not initialised: no hybrid parallelism in this process
        return None


def model_parallel_group():
    """Fleet's model-parallel group when tensor parallelism is on (more than one rank), else None."""
    hcg = _hcg()
    if hcg is None or hcg.get_model_parallel_world_size() <= 1:
        return None
    return hcg.get_model_parallel_group()


def pipeline_group():
    """Fleet's pipeline group, or None without pipeline parallelism."""
    hcg = _hcg()
    if hcg is None or hcg.get_pipe_parallel_world_size() <= 1:
        return None
    return hcg.get_pipe_parallel_group()
