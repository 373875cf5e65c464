"""Which ranks of a split run (`rollout_placement split`) are gone, and one verdict for every trainer rank.

Beacons: at start-up every rank of the launch listens on a port of its own for as long as its
process lives (`open_beacons`; the kernel completes a probe's connection without the process
doing anything) and learns every other rank's port through the launch's store. A rank that died
(SIGKILL, a crash) has its port closed with its other sockets, so `dead_ranks` (a connection
attempt to each, `PROBE_TIMEOUT_S` at most for a host that no longer answers) names exactly the
ranks that are gone, whatever exchange noticed it: a failed weights broadcast alone cannot say
which of several rollout ranks closed its socket.

Verdict (`agree`): a trainer rank whose exchange with the rollout ranks failed must not go on
alone, and one that got its batch must not enter the gradient all-reduce with a rank that is
saving and stopping. So every trainer rank calls `agree` at the same two points of each step,
after the weights went out and after the batches came in: one all-reduce (MAX) over the trainer
group of `[rank r found gone, for every r] + [this rank's exchange failed]`. The first matters
because gloo's broadcast is a tree that a dead member cuts short: a live rollout rank it did not
reach waits in it until trainer rank 0 exits, so a trainer rank must not wait for that rank's batch. When any trainer rank's exchange failed, every
trainer rank gets the same `RolloutRankLost` naming the ranks found gone (`on_every_trainer`:
the loop may then save the last completed step collectively, `OnlineLoop.save_before_stopping`).
A trainer group collective that fails because a trainer rank died (`lost_rank_error`) gives
`TrainerRankLost` naming it: nothing new can be saved whole without that rank's states."""
import contextlib
import os
import socket

from .run_guard import RolloutRankLost

PROBE_TIMEOUT_S = 2.0
KEY = "ppo_split_alive/{}"

_beacon = None  # this rank's listening socket, kept open for the life of the process
_addresses = {}  # rank -> (host, port) of its beacon
_layout = None  # the run's RolloutLayout


def open_beacons(layout):
    """Listen on a free port, publish it in the launch's store and read every rank's (collective:
    every rank of the launch calls it once, after the store exists). `layout`: the run's
    `RolloutLayout` (who is a trainer rank, who a rollout rank)."""
    import paddle.distributed as dist
    from paddle.distributed import collective

    global _beacon, _layout
    _layout, world = layout, layout.world
    store, rank = collective._default_store, dist.get_rank()
    host = (os.getenv("PADDLE_CURRENT_ENDPOINT") or "127.0.0.1:0").split(":")[0]
    _beacon = socket.socket()
    _beacon.bind((host, 0))
    _beacon.listen(1024)  # probes are only made after a failure: the queue never fills
    store.set(KEY.format(rank), f"{host}:{_beacon.getsockname()[1]}".encode())
    for r in range(world):
        store.wait(KEY.format(r))
        peer_host, port = bytes(store.get(KEY.format(r))).decode().rsplit(":", 1)
        _addresses[r] = (peer_host, int(port))


def lost_rank_error(err):
    """After `err` (a RuntimeError of a collective) on a trainer rank of a split run: a
    `TrainerRankLost` naming the ranks found gone, or None when every rank still answers (or
    this is no split run: no beacons)."""
    if not _addresses or type(err) is not RuntimeError:  # gloo's errors; not the run's own stops (subclasses)
        return None
    gone = dead_ranks(_layout.trainer_ranks)  # the collectives of the trainer group: a trainer rank is the cause
    if not gone:
        return None
    detail = (str(err).strip().splitlines() or [""])[-1][:200]
    return TrainerRankLost(f"{names(_layout, gone)} of this rollout_placement split run stopped answering ({detail})")


class TrainerRankLost(RuntimeError):
    """A trainer rank of a split run died while this one was in a collective with it (the
    gradient all-reduce, a checkpoint barrier): the run stops; the checkpoints on disk are
    whole, and the same command resumes from the newest."""


def dead_ranks(ranks=None, timeout=PROBE_TIMEOUT_S):
    """The ranks of `ranks` (default: every rank with a beacon) whose beacon refuses a connection
    or does not answer within `timeout` seconds, ascending. Makes no collective call."""
    found = []
    for r in sorted(_addresses if ranks is None else ranks):
        if r not in _addresses or r == _own_rank():
            continue
        try:
            with socket.create_connection(_addresses[r], timeout=timeout):
                pass
        except OSError:
            found.append(r)
    return found


def _own_rank():
    import paddle.distributed as dist

    return dist.get_rank()


def rank_name(layout, rank):
    return f"the {'rollout' if layout.is_replica(rank) else 'trainer'} rank (rank {rank})"


def names(layout, ranks):
    return " and ".join(rank_name(layout, r) for r in ranks)


def agree(layout, failure, probe=False):
    """The verdict of every trainer rank (collective over the trainer group when there are
    several). `failure`: the `RolloutRankLost` this rank's exchanges raised, or None; `probe`:
    look for dead ranks even without one (after a stop request). Returns None when no trainer
    rank failed and none found a dead rank, else the `RolloutRankLost` to raise (the same ranks
    named on every trainer rank, `on_every_trainer` set)."""
    import paddle
    import paddle.distributed as dist

    from .training_world import training_group, training_world_size

    world = layout.world  # the exchanges are with rollout ranks: one of them is the cause
    gone = dead_ranks(layout.replica_ranks) if (failure is not None or probe) else []
    flags = [int(r in gone) for r in range(world)] + [int(failure is not None)]
    if training_world_size() > 1:
        tensor = paddle.to_tensor(flags, dtype="int64")
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=training_group())
        flags = [int(v) for v in tensor.numpy()]
    gone = [r for r in range(world) if flags[r]]
    if not gone and not flags[-1]:
        return None
    how = str(failure).split(" stopped answering ", 1)[-1] if failure is not None else (
        "(another trainer rank's exchange failed)" if flags[-1] else "(its port no longer accepts connections)")
    if gone:
        lost = RolloutRankLost(f"{names(layout, gone)} of this rollout_placement split run stopped answering {how}")
    elif failure is not None:  # every rank still listens: a link that broke, not a process that died
        lost = RolloutRankLost(str(failure))
    else:
        lost = RolloutRankLost(f"another trainer rank lost its link to a rollout rank {how}")
    lost.on_every_trainer = True
    return lost


@contextlib.contextmanager
def lost_together(layout):
    """Run a trainer rank's exchanges of one step, then `agree` (every trainer rank, each step):
    raises the common `RolloutRankLost` when any trainer rank's exchanges failed."""
    failure = None
    try:
        yield
    except RolloutRankLost as err:
        failure = err
    verdict = agree(layout, failure)
    if verdict is not None:
        raise verdict from failure
