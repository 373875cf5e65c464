"""How many processes the trainer's own collectives span (checkpoint barriers, metric reductions).

By default every process of the launch trains. A `rollout_placement split` run keeps its rollout
rank out of them: that rank runs its own loop (`ppo.trainer.rollout_worker`) and meets the
trainer only in the rollout link's collectives, so the trainer process calls
`set_training_world_size(1)` once at start-up, before anything collective runs."""
_training_world_size = None


def set_training_world_size(size):
    """The trainer's collectives span `size` processes from now on (called once per process)."""
    global _training_world_size
    _training_world_size = int(size)


def training_world_size():
    """The processes the trainer's collectives span: the launch's unless set otherwise."""
    if _training_world_size is not None:
        return _training_world_size
    import paddle.distributed as dist

    return dist.get_world_size()
