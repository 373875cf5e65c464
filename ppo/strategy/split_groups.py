"""The process groups of a split run (`rollout_placement split`): its trainer ranks', the weights
groups of trainer rank 0 and its rollout ranks (one per slice of a tensor-parallel replica), and one group per trainer rank and rollout rank
that exchange batches (`ppo.strategy.rollout_layout`).

Paddle's gloo send / recv pair up by a tag that each process counts per process group (one per
operation on that group), so a point-to-point exchange over the default group of a launch of
more than two ranks pairs a message with another's; a group of just the two ranks keeps both
counts in step.

Paddle 3.3's gloo process group rendezvouses twice when it is made: once under keys prefixed
by the group's id, and once more in the `ProcessGroupGloo` constructor under the bare group
ranks ("0", "1", ...) of the launch's shared store. A second group therefore reads the first
group's (or the default group's) stale addresses and fails at random ("sizeof(impl_) ==
bytes.size(). 136 vs 68", or a connect timeout). Each group here rendezvouses in a store of
its own, served by its first rank on a free port that it publishes in the launch's store."""
import os
import socket

import paddle.distributed as dist

_stores = []  # the groups' stores, kept for the life of the process


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def isolated_group(ranks, name):
    """`dist.new_group(ranks)`, rendezvousing in a store of its own (see the module docstring).
    Collective over the whole launch: every rank calls it, in the same order, with the same
    `ranks` and `name` (a key unique to this group in the launch's store)."""
    from paddle.base import core
    from paddle.distributed import collective

    shared, rank, key = collective._default_store, dist.get_rank(), f"ppo_split_group/{name}"
    if rank == ranks[0]:
        host = (os.getenv("PADDLE_CURRENT_ENDPOINT") or "127.0.0.1:0").split(":")[0]
        shared.set(key, f"{host}:{_free_port()}".encode())
    if rank not in ranks:
        return dist.new_group(ranks)  # numbers the group alike on every rank; no store is read
    shared.wait(key)
    host, port = bytes(shared.get(key)).decode().rsplit(":", 1)
    store = core.TCPStore(host, int(port), rank == ranks[0], len(ranks), 900)
    _stores.append(store)
    collective._default_store = store
    try:
        return dist.new_group(ranks)
    finally:
        collective._default_store = shared


def split_groups(layout):
    """`(trainer group, [weights group of each slice], {(trainer rank, rollout rank): their group})`
    of a `RolloutLayout`, each None where Paddle's default group serves (one trainer rank; a group
    that is the whole launch). The weights groups: one of trainer rank 0 and every rollout rank
    ("weights") at `rollout_tp` 1, else one per slice j of trainer rank 0 and rank j of every
    replica ("weights_j", `weight_shard_ranks`). A pair for each exchange: the first trainer rank
    of a data rank sends its hello to every rank of each replica that serves it, and a replica's
    leader sends the batches to every trainer rank of the data rank. Collective over the launch."""
    def group(ranks, name):
        return isolated_group(ranks, name) if 1 < len(ranks) < layout.world else None

    trainer_group = group(layout.trainer_ranks, "trainers")
    weight_groups = [group(layout.weight_shard_ranks(j), "weights" if layout.rollout_tp == 1 else f"weights_{j}")
                     for j in range(layout.rollout_tp)]
    def exchanges(t, r):
        return r == layout.leader(r) or t == layout.data_rank_trainers(layout.data_rank(t))[0]

    pairs = {(t, r): group([t, r], f"pair_{t}_{r}") for r in layout.replica_ranks for t in layout.served_trainers(r)
             if exchanges(t, r)}
    return trainer_group, weight_groups, pairs


def parallel_groups(layout):
    """`({rollout rank: its replica's group}, {trainer rank: its data-parallel group})` of a layout
    with tensor parallelism: each replica of `rollout_tp` > 1 ranks generates over a group of its
    own, and with `trainer_tp` > 1 and several data ranks the trainer ranks of one model-parallel
    index sum their gradients over theirs. Empty without. Collective over the launch."""
    replica, data = {}, {}
    if layout.rollout_tp > 1:
        for leader in layout.replica_ranks[::layout.rollout_tp]:
            members = layout.replica_members(leader)
            made = isolated_group(members, f"replica_{leader}")
            replica.update({r: made for r in members})
    if layout.trainer_tp > 1 and layout.data_ranks > 1:
        for index in range(layout.trainer_tp):
            ranks = layout.trainer_ranks[index::layout.trainer_tp]
            made = isolated_group(ranks, f"trainer_data_{index}")
            data.update({t: made for t in ranks})
    return replica, data


def confine_fleet_data_axis(layout, rank, data_group=None):
    """Fleet's data axis on trainer rank `rank` of a split run with tensor parallelism: fleet's
    topology spans the whole launch (`fleet.init` in PaddleNLP's arguments), so its data axis
    holds the rollout ranks too, and fleet's wrappers would broadcast the initial parameters and
    all-reduce the gradients with ranks that never train. From here fleet sees the trainer's own
    data axis: `layout.data_ranks` ranks, this rank's index among them, over `data_group` (the
    trainer ranks of this model-parallel index, `parallel_groups`; a group of this rank alone
    when there is one data rank). Its model-parallel and check groups (the ranks of one data
    index: one trainer tensor-parallel group) are left as fleet made them."""
    from paddle.distributed import fleet
    from paddle.distributed.communication.group import Group

    hcg = fleet.get_hybrid_communicate_group()
    ranks = layout.trainer_ranks[rank % layout.trainer_tp::layout.trainer_tp]
    if data_group is None:
        data_group = Group(0, -1 - rank, [rank], name=f"ppo_split_data_{rank}")  # one rank: no collective runs on it
    hcg._dp_degree, hcg._data_parallel_id = layout.data_ranks, layout.data_rank(rank)
    hcg._dp_group, hcg._dp_comm_group = ranks, data_group
