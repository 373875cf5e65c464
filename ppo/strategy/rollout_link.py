"""The exchanges between a split run's trainer ranks and its rollout ranks (`rollout_placement split`).

Weights go one way, batches the other (gloo on CPU, NCCL on GPU); who meets whom is the run's
`ppo.strategy.rollout_layout.RolloutLayout`.
- Weights (`send_weights` / `receive_weights`): a header `[version, checksum]` (float64), then
  the actor's parameters, whole (`whole_parameters`: a tensor-parallel trainer gathers its
  slices first), flattened into one buffer per dtype, broadcast from trainer rank 0 to every
  rollout rank over the group of those ranks (Paddle's default group when they are the whole
  launch); another trainer rank (the same whole weights) only computes the checksum of what it
  would send. A rollout rank receives into buffers of its own and copies them into its model only once every
  buffer has arrived and the checksum of what it now holds equals the trainer's, so it never
  generates from half-received or torn weights; each set carries its version (the trainer's
  completed optimiser steps).
- Batches and messages (`send_object` / `recv_object`): a pickled object as an int64 length and
  a uint8 payload through point-to-point send / recv between one trainer and one rollout rank
  (over the pair's own group).
A peer that dies makes the collective fail (gloo: the pair's socket closes) and the link raises
`RolloutRankLost` naming it."""
import pickle

import numpy as np
import paddle
import paddle.distributed as dist

from ..common.rank_faults import open_beacons
from ..common.run_guard import RolloutRankLost
from ..common.training_world import set_training_world
from .rollout_layout import RolloutLayout
from .split_groups import confine_fleet_data_axis, parallel_groups, split_groups


def weights_checksum(params):
    """One float64 number of `params` (a list of tensors, in order): sum over i of (i + 1) x the
    float64 sum of tensor i, the formula of `Strategy.fingerprint`."""
    return sum(float((p.astype("float64") * (i + 1)).sum()) for i, p in enumerate(params))


def whole_parameters(model):
    """`model`'s parameters in order, each whole: a tensor-parallel model's slices all-gathered
    over fleet's model-parallel group and merged (`ppo.strategy.tensor.reshard.merge`, the
    kinds from the model's own tensor-parallel mappings), so the trainer sends the weights of
    the one-process layout whatever its degree. Collective over that group; without tensor
    parallelism the parameters themselves."""
    from ..common.parallel_groups import model_parallel_group
    from ..models.basics import unwrap_model

    base, group = unwrap_model(model), model_parallel_group()
    if group is None or getattr(base.config, "tensor_parallel_degree", 1) <= 1:
        return list(model.parameters())
    from .tensor.reshard import merge, tensor_parallel_kinds

    named = list(base.named_parameters())
    kinds = tensor_parallel_kinds(type(base), base.config, [n for n, _ in named], degree=group.nranks)
    whole = []
    with paddle.no_grad():
        for name, p in named:
            if not getattr(p, "is_distributed", False):
                whole.append(p)
                continue
            if kinds[name] == "replicated":  # never expected: the mappings cut every split parameter
                raise RuntimeError(f"{name} is a tensor-parallel slice that the model's mappings do not cut")
            parts = []
            dist.all_gather(parts, p, group=group)
            whole.append(merge(parts, kinds[name], name))
    return whole


def _dtype_groups(params):
    """`{dtype: [index of each param of that dtype]}` in parameter order."""
    groups = {}
    for i, p in enumerate(params):
        groups.setdefault(p.dtype, []).append(i)
    return groups


def _rank_name(layout, rank):
    return f"the {'rollout' if layout.is_replica(rank) else 'trainer'} rank (rank {rank})"


class RolloutLink:
    """`layout`: the run's `RolloutLayout` (default: trainer rank 0, rollout rank 1); `rank`:
    this process's (default: Paddle's); `weight_group`: the process group of
    `layout.weight_group_ranks`; `pair_groups`: `{(trainer rank, rollout rank): their group}`
    (`ppo.strategy.split_groups`; None or absent: the default group, a launch of these ranks only)."""

    trainer_rank = 0  # the source of the weights
    replica_group = None  # a rollout rank's replica group (`rollout_tp` > 1)

    def __init__(self, layout=None, rank=None, weight_group=None, pair_groups=None):
        self.layout = layout or RolloutLayout(2, 1)
        self.rank = dist.get_rank() if rank is None else rank
        self.weight_group, self.pair_groups = weight_group, dict(pair_groups or {})

    def _pair_group(self, peer):
        return self.pair_groups.get((min(self.rank, peer), max(self.rank, peer)))

    def _collective(self, what, peer, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as err:  # gloo: "Connection closed by peer", "TIMEOUT ... pair_rank"
            raise RolloutRankLost(f"{peer} of this rollout_placement split run stopped answering while {what} "
                                  f"({str(err).splitlines()[0][:200]})") from err

    def _weights_peer(self):
        """Who a failed weights broadcast names from this rank."""
        replicas = self.layout.replica_ranks
        if self.rank != self.trainer_rank:
            return _rank_name(self.layout, self.trainer_rank) + ("" if len(replicas) == 1 else " or another rollout rank")
        return _rank_name(self.layout, replicas[0]) if len(replicas) == 1 else f"a rollout rank (ranks {replicas})"

    def _broadcast(self, what, tensor):
        self._collective(what, self._weights_peer(), dist.broadcast, tensor, src=self.trainer_rank, group=self.weight_group)

    def send_object(self, obj, dst, what="sending a batch"):
        data = np.frombuffer(pickle.dumps(obj, protocol=4), dtype=np.uint8)
        peer, group = _rank_name(self.layout, dst), self._pair_group(dst)
        self._collective(what, peer, dist.send, paddle.to_tensor([data.size], dtype="int64"), dst=dst, group=group)
        self._collective(what, peer, dist.send, paddle.to_tensor(data), dst=dst, group=group)

    def recv_object(self, src, what="waiting for a batch"):
        size, peer, group = paddle.zeros([1], dtype="int64"), _rank_name(self.layout, src), self._pair_group(src)
        self._collective(what, peer, dist.recv, size, src=src, group=group)
        payload = paddle.zeros([int(size.numpy()[0])], dtype="uint8")
        self._collective(what, peer, dist.recv, payload, src=src, group=group)
        return pickle.loads(payload.numpy().tobytes())

    def send_weights(self, params, version):
        """Broadcast `params` (the trainer's actor parameters, in order) as version `version`
        (from trainer rank 0; another trainer rank sends nothing); returns their checksum."""
        checksum = weights_checksum(params)
        if self.rank != self.trainer_rank:
            return checksum
        what = f"sending the weights of version {version}"
        self._broadcast(what, paddle.to_tensor([float(version), checksum], dtype="float64"))
        for indices in _dtype_groups(params).values():
            self._broadcast(what, paddle.concat([params[i].detach().reshape([-1]) for i in indices]))
        return checksum

    def receive_weights(self, params):
        """Receive one version into `params` (the rollout model's parameters, in the trainer's
        order), atomically; returns `(version, checksum)`. Raises RuntimeError when what
        arrived does not add up to the trainer's checksum (nothing is then changed)."""
        header = paddle.zeros([2], dtype="float64")
        self._broadcast("waiting for weights", header)
        version, checksum = int(header.numpy()[0]), float(header.numpy()[1])
        received = {}
        for dtype, indices in _dtype_groups(params).items():
            flat = paddle.zeros([sum(int(np.prod(params[i].shape)) for i in indices)], dtype=dtype)
            self._broadcast(f"receiving the weights of version {version}", flat)
            sizes = [int(np.prod(params[i].shape)) for i in indices]
            for i, part in zip(indices, paddle.split(flat, sizes)):
                received[i] = part.reshape(params[i].shape)
        staged = [received[i] for i in range(len(params))]
        got = weights_checksum(staged)
        if got != checksum:
            raise RuntimeError(f"weights of version {version} arrived torn: checksum {got!r}, the trainer's {checksum!r}")
        with paddle.no_grad():
            for p, value in zip(params, staged):
                p.set_value(value)
        return version, checksum


_run_link = None


def open_split_world(world, rollout_ranks, trainer_tp=1, rollout_tp=1):
    """Make a split run's process groups on every rank of the launch (`split_groups`,
    `parallel_groups`); a trainer rank's own collectives then span the trainer group
    (`set_training_world`), and with `trainer_tp` > 1 fleet's data axis its data ranks only
    (`confine_fleet_data_axis`). Returns this rank's link, also kept for `run_link`; a rollout
    rank of a replica with `rollout_tp` > 1 finds its replica's group in `link.replica_group`."""
    global _run_link
    layout, rank = RolloutLayout(world, rollout_ranks, trainer_tp, rollout_tp), dist.get_rank()
    trainer_group, weight_group, pair_groups = split_groups(layout)
    replica_groups, data_groups = parallel_groups(layout)
    open_beacons(layout)  # who is gone when an exchange fails (ppo.common.rank_faults)
    if not layout.is_replica(rank):
        set_training_world(layout.trainers, trainer_group)
        if trainer_tp > 1:
            confine_fleet_data_axis(layout, rank, data_groups.get(rank))
    _run_link = RolloutLink(layout, weight_group=weight_group, pair_groups=pair_groups)
    _run_link.replica_group = replica_groups.get(rank)
    return _run_link


def run_link():
    """The link `open_split_world` made (one trainer rank and one rollout rank before it runs)."""
    return _run_link or RolloutLink()
