"""The exchanges between a split run's trainer ranks and its rollout ranks (`rollout_placement split`).

Weights go one way, batches the other (gloo on CPU, NCCL on GPU); who meets whom is the run's
`ppo.strategy.rollout_layout.RolloutLayout`.
- Weights (`send_weights` / `receive_weights`): a header `[version, checksum]` (float64), then
  the actor's parameters, whole (`whole_parameters`: a tensor-parallel trainer gathers its
  slices first), flattened into one buffer per dtype, broadcast from trainer rank 0 to every
  rollout rank over the group of those ranks (Paddle's default group when they are the whole
  launch); another trainer rank (the same whole weights) only computes the checksum of what it
  would send. The checksum is always that of the whole weights (`weights_checksum`).
  Replicas of `rollout_tp` > 1 ranks hold only their slices (`ppo.rollout.tp_weights.hold_slices`):
  trainer rank 0 cuts the whole weights to the replica's degree by the model's own mappings
  (`plan_slices`; PaddleNLP's ReshardController from any trainer degree) and sends slice j,
  one buffer per dtype with the header `[version, checksum, slice checksum, slice values]`,
  over the group of rank j of every replica (`RolloutLayout.weight_shard_ranks`), so a rollout
  rank never holds, receives or allocates the whole weights; it checks the slice checksum (the
  same formula over exactly the slices it holds) and reports the whole one.
  A rollout rank receives into buffers of its own and copies them into its model only once every
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
    this process's (default: Paddle's); `weight_groups`: the process group of each slice's
    broadcast (`layout.weight_shard_ranks`; one, of `layout.weight_group_ranks`, at `rollout_tp`
    1); `pair_groups`: `{(trainer rank, rollout rank): their group}` (`ppo.strategy.split_groups`;
    None or absent: the default group, a launch of these ranks only)."""

    trainer_rank = 0  # the source of the weights
    replica_group = None  # a rollout rank's replica group (`rollout_tp` > 1)
    slice_kinds = None  # trainer rank 0: each parameter's kind at the replicas' degree (`plan_slices`)

    def __init__(self, layout=None, rank=None, weight_groups=None, pair_groups=None):
        self.layout = layout or RolloutLayout(2, 1)
        self.rank = dist.get_rank() if rank is None else rank
        self.weight_groups = list(weight_groups or [None] * self.layout.rollout_tp)
        self.pair_groups = dict(pair_groups or {})

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

    def _broadcast(self, what, tensor, group):
        self._collective(what, self._weights_peer(), dist.broadcast, tensor, src=self.trainer_rank, group=group)

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

    def plan_slices(self, model):
        """Trainer side: the kind of each of `model`'s parameters at the replicas' degree
        (`ppo.rollout.tp_weights.replica_kinds`, the rule the replicas cut themselves by), kept
        for `send_weights`."""
        from ..rollout.tp_weights import replica_kinds

        self.slice_kinds = replica_kinds(model, self.layout.rollout_tp)

    def send_weights(self, params, version):
        """Broadcast `params` (the trainer's actor parameters, whole, in order) as version
        `version` (from trainer rank 0; another trainer rank sends nothing), each replica rank's
        slice to it with `rollout_tp` > 1; returns their checksum."""
        checksum = weights_checksum(params)
        if self.rank != self.trainer_rank:
            return checksum
        what, degree = f"sending the weights of version {version}", self.layout.rollout_tp
        if degree == 1:
            self._send(what, self.weight_groups[0], [float(version), checksum], params)
            return checksum
        from .tensor.reshard import split

        kinds = self.slice_kinds or ["replicated"] * len(params)
        if len(kinds) != len(params):
            raise RuntimeError(f"plan_slices gave {len(kinds)} kinds for {len(params)} parameters")
        for shard, group in enumerate(self.weight_groups):
            with paddle.no_grad():
                part = [p if kind == "replicated" else split(p.detach(), kind, degree)[shard] for p, kind in zip(params, kinds)]
            numel = sum(int(np.prod(p.shape)) for p in part)
            self._send(what, group, [float(version), checksum, weights_checksum(part), float(numel)], part)
        return checksum

    def _send(self, what, group, header, params):
        self._broadcast(what, paddle.to_tensor(header, dtype="float64"), group)
        for indices in _dtype_groups(params).values():
            self._broadcast(what, paddle.concat([params[i].detach().reshape([-1]) for i in indices]), group)

    def receive_weights(self, params):
        """Receive one version into `params` (the rollout model's parameters, in the trainer's
        order: whole, or this rank's slices with `rollout_tp` > 1), atomically; returns
        `(version, checksum of the whole weights)`. Raises RuntimeError when what arrived does
        not add up to the trainer's checksum (of the slice, when sliced; nothing is then changed)."""
        sliced = self.layout.rollout_tp > 1
        group = self.weight_groups[self.layout.weight_shard(self.rank) if sliced else 0]
        header = paddle.zeros([4 if sliced else 2], dtype="float64")
        self._broadcast("waiting for weights", header, group)
        values = header.numpy()
        version, checksum = int(values[0]), float(values[1])
        sizes = [int(np.prod(p.shape)) for p in params]
        if sliced and int(values[3]) != sum(sizes):
            raise RuntimeError(f"weights of version {version}: the trainer sends {int(values[3])} values of slice "
                               f"{self.layout.weight_shard(self.rank)}, this rank holds {sum(sizes)}")
        received = {}
        for dtype, indices in _dtype_groups(params).items():
            flat = paddle.zeros([sum(sizes[i] for i in indices)], dtype=dtype)
            self._broadcast(f"receiving the weights of version {version}", flat, group)
            for i, part in zip(indices, paddle.split(flat, [sizes[i] for i in indices])):
                received[i] = part.reshape(params[i].shape)
        staged = [received[i] for i in range(len(params))]
        got, want = weights_checksum(staged), float(values[2]) if sliced else checksum
        if got != want:
            raise RuntimeError(f"weights of version {version} arrived torn: checksum {got!r}, the trainer's {want!r}")
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
    trainer_group, weight_groups, pair_groups = split_groups(layout)
    replica_groups, data_groups = parallel_groups(layout)
    open_beacons(layout)  # who is gone when an exchange fails (ppo.common.rank_faults)
    if not layout.is_replica(rank):
        set_training_world(layout.trainers, trainer_group)
        if trainer_tp > 1:
            confine_fleet_data_axis(layout, rank, data_groups.get(rank))
    _run_link = RolloutLink(layout, weight_groups=weight_groups, pair_groups=pair_groups)
    _run_link.replica_group = replica_groups.get(rank)
    return _run_link


def run_link():
    """The link `open_split_world` made (one trainer rank and one rollout rank before it runs)."""
    return _run_link or RolloutLink()
