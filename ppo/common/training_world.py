"""Which processes the trainer's own collectives span (gradients, checkpoint barriers, metric reductions).

By default every process of the launch trains. A `rollout_placement split` run keeps its rollout
ranks out of them: those run their own loop (`ppo.trainer.rollout_worker`) and meet the
trainers only in the rollout link's exchanges, so each trainer process calls
`set_training_world(size, group)` once at start-up, before anything collective runs: `size`
trainer ranks, `group` their process group (None when they are the whole launch or one rank)."""
_training_world_size = None
_training_group = None


def set_training_world(size, group=None):
    """The trainer's collectives span `size` processes, over `group`, from now on (once per process)."""
    global _training_world_size, _training_group
    _training_world_size, _training_group = int(size), group


def training_world_size():
    """The processes the trainer's collectives span: the launch's unless set otherwise."""
    if _training_world_size is not None:
        return _training_world_size
    import paddle.distributed as dist

    return dist.get_world_size()


def training_group():
    """The process group of the trainer's collectives (None: Paddle's default group)."""
    return _training_group
