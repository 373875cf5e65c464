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


LAUNCH_DEGREES = ("tensor_parallel_degree", "pipeline_parallel_degree", "sharding_parallel_degree",
                  "sharding_degree", "expert_parallel_degree")
"""The degrees that only a `paddle.distributed.launch` of that many processes can run."""


def unlaunched_degree_notes(given, world_size=None):
    """One line per degree > 1 in `given` (the argument file's and command line's keys as given)
    when this process was not launched with other processes: PaddleNLP's arguments then set
    them to 1, so the run trains at degree 1. `world_size` defaults to the launcher's
    `PADDLE_TRAINERS_NUM` (1 when not launched)."""
    import os

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) if world_size is None else world_size
    if world > 1:
        return []
    notes = []
    for key in LAUNCH_DEGREES:
        try:
            degree = int(given.get(key, 1))
        except (TypeError, ValueError):
            continue  # the parse itself reports a value that is not a number
        if degree > 1:
            notes.append(f"{key} {degree} runs at 1 in this single process: launch "
                         f"`python -m paddle.distributed.launch --nproc_per_node N ...` to run it at {degree}")
    return notes
