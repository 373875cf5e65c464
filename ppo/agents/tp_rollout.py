"""Multi-turn rollouts under tensor or pipeline parallel: one rank of the group runs the
environments and the schedule, every rank returns the same trajectories.

The ranks of a tensor-parallel group hold the same prompts and run the engine's passes together
(sharded weights, eval_mode tensor_parallel: an all-reduce per layer; gathered weights, eval_mode
single: a gather when the decoder is built). A multi-turn rollout's schedule depends on when each
environment answers, which differs from process to process, and an environment run on every
rank would do each tool call once per rank. So the group's first rank (the leader) runs the
whole ``AgentRollout`` (ppo/agents/rollout.py): environments, stop strings, the pausing
schedule. It broadcasts ``("build",)`` before building its decoder and, when the passes are
collectives (sharded), what each pass feeds (``("step", feeds, quiet, forced)``, ``("compact",
rows)``); the other ranks (followers) build no environment and run the same build and passes
on their own decoder, discarding what they sample (the same tokens were fed, the logits are
gathered: they are the leader's). Under pipeline parallel each stage generates from the gathered
weights of every stage, with no collective: the group is the pipeline group and the followers
only wait. At the end the leader broadcasts ``("stop",)`` and then the result (trajectories,
metrics, stats) or its error, so every rank returns the same ``AgentRolloutResult`` (as verl's
agent loop runs the tools on the driver only).
"""
import paddle.distributed as dist

from ..rollout.multi_turn import SlotDecoder
from ..rollout.weights import unwrap_model


def _broadcast(value, group):
    box = [value]
    dist.broadcast_object_list(box, src=group.ranks[0], group=group)
    return box[0]


def _sharded(engine):
    """Whether every pass of the engine's decoder is a collective of its tensor-parallel group."""
    return engine.sharded and engine.tensor_parallel_group is not None


class _BroadcastingDecoder:
    """The leader's decoder: each pass is announced to the followers before it runs."""

    def __init__(self, decoder, group):
        self._decoder, self._group = decoder, group

    def step(self, feeds, suppress_rows=(), forced=None):
        _broadcast(("step", feeds, set(suppress_rows), forced), self._group)
        return self._decoder.step(feeds, suppress_rows, forced)

    def compact(self, keep):
        _broadcast(("compact", set(keep)), self._group)
        return self._decoder.compact(keep)

    def __getattr__(self, name):
        return getattr(self._decoder, name)


def _leader_hook(group, engine):
    """`AgentRollout.decoder_hook` of the leader: the build, and each pass when sharded, announced."""

    def hook(build):
        _broadcast(("build",), group)  # building it may gather the weights over the group: together
        decoder = build()
        return _BroadcastingDecoder(decoder, group) if _sharded(engine) else decoder

    return hook


def _lead(group, engine, new_rollout, seed, row_offset):
    result, error = None, None
    try:
        rollout = new_rollout()
        rollout.decoder_hook = _leader_hook(group, engine)
        result = rollout.run(seed, row_offset)
    except Exception as err:  # noqa: BLE001 - re-raised on every rank, after the followers are released
        error = err
    _broadcast(("stop",), group)
    _broadcast((result, None if error is None else f"{type(error).__name__}: {error}"), group)
    if error is not None:
        raise error
    return result


def _follow(group, engine, rows, settings, params, seed, row_offset):
    lm, decoder = unwrap_model(engine.model), None
    while True:
        plan = _broadcast(None, group)
        if plan[0] == "stop":
            break
        if plan[0] == "build":
            if engine.tensor_parallel_group is not None:  # a pipeline stage has nothing to gather with the leader
                decoder = SlotDecoder(engine, lm, rows, settings.max_total_len, params, seed=seed, row_offset=row_offset)
        elif plan[0] == "step":
            decoder.step(*plan[1:])
        elif plan[0] == "compact":
            decoder.compact(plan[1])
    result, error = _broadcast(None, group)
    if error is not None:
        raise RuntimeError(f"the multi-turn rollout failed on tensor-parallel rank {group.ranks[0]}: {error}")
    return result


def shared_rollout_group(engine):
    """The ranks that hold the same prompts and must return the same trajectories: the engine's
    tensor-parallel group, else the pipeline group (each stage generates from the gathered
    weights); None on a run with neither."""
    from ..common.parallel_groups import pipeline_group

    group = getattr(engine, "tensor_parallel_group", None)
    return group if group is not None and group.nranks > 1 else pipeline_group()


def rollout_tensor_parallel(group, engine, new_rollout, rows, settings, params, seed, row_offset):
    """The `AgentRolloutResult` of a rollout of `rows` records on every rank of `group` (see the
    module docstring): `new_rollout()` builds the `AgentRollout` (and its environments) on the
    leader only; `settings` (`AgentSettings`: `max_total_len`), `params`, `seed`, `row_offset`
    build the followers' decoders."""
    if dist.get_rank() == group.ranks[0]:
        return _lead(group, engine, new_rollout, seed, row_offset)
    return _follow(group, engine, rows, settings, params, seed, row_offset)


def run_on_rollout_group(engine, new_rollout, rows, settings, params, seed, row_offset):
    """`new_rollout().run(seed, row_offset)`, or under tensor or pipeline parallel the same result
    on every rank of the group, the environments on its first rank only (`rollout_tensor_parallel`)."""
    group = shared_rollout_group(engine)
    if group is not None and group.nranks > 1:
        return rollout_tensor_parallel(group, engine, new_rollout, rows, settings, params, seed, row_offset)
    return new_rollout().run(seed, row_offset)
