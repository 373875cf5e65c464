"""The collectives between a split run's trainer rank and its rollout rank (`rollout_placement split`).

Weights go one way, batches the other, both over Paddle's default process group (gloo on CPU,
NCCL on GPU): the launch has exactly these two ranks.
- Weights (`send_weights` / `receive_weights`): a header `[version, checksum]` (float64), then
  the actor's parameters flattened into one buffer per dtype, broadcast from the trainer. The
  rollout rank receives into buffers of its own and copies them into its model only once every
  buffer has arrived and the checksum of what it now holds equals the trainer's, so it never
  generates from half-received or torn weights; each set carries its version (the trainer's
  completed optimiser steps).
- Batches and messages (`send_object` / `recv_object`): a pickled object as an int64 length and
  a uint8 payload through point-to-point send / recv.
A peer that dies makes the collective fail (gloo: the pair's socket closes) and the link raises
`RolloutRankLost` naming it."""
import pickle

import numpy as np
import paddle
import paddle.distributed as dist

from ..common.run_guard import RolloutRankLost


def weights_checksum(params):
    """One float64 number of `params` (a list of tensors, in order): sum over i of (i + 1) x the
    float64 sum of tensor i, the formula of `Strategy.fingerprint`."""
    return sum(float((p.astype("float64") * (i + 1)).sum()) for i, p in enumerate(params))


def _dtype_groups(params):
    """`{dtype: [index of each param of that dtype]}` in parameter order."""
    groups = {}
    for i, p in enumerate(params):
        groups.setdefault(p.dtype, []).append(i)
    return groups


class RolloutLink:
    """`trainer_rank` / `rollout_rank`: the two ranks of the launch."""

    def __init__(self, trainer_rank=0, rollout_rank=1):
        self.trainer_rank, self.rollout_rank = trainer_rank, rollout_rank

    def _collective(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as err:  # gloo: "Connection closed by peer", "TIMEOUT ... pair_rank"
            peer = (f"the rollout rank (rank {self.rollout_rank})" if dist.get_rank() == self.trainer_rank
                    else f"the trainer rank (rank {self.trainer_rank})")
            raise RolloutRankLost(f"{peer} of this rollout_placement split run stopped answering while {what} "
                                  f"({str(err).splitlines()[0][:200]})") from err

    def send_object(self, obj, dst, what="sending a batch"):
        data = np.frombuffer(pickle.dumps(obj, protocol=4), dtype=np.uint8)
        self._collective(what, dist.send, paddle.to_tensor([data.size], dtype="int64"), dst=dst)
        self._collective(what, dist.send, paddle.to_tensor(data), dst=dst)

    def recv_object(self, src, what="waiting for a batch"):
        size = paddle.zeros([1], dtype="int64")
        self._collective(what, dist.recv, size, src=src)
        payload = paddle.zeros([int(size.numpy()[0])], dtype="uint8")
        self._collective(what, dist.recv, payload, src=src)
        return pickle.loads(payload.numpy().tobytes())

    def send_weights(self, params, version):
        """Broadcast `params` (the trainer's actor parameters, in order) as version `version`;
        returns their checksum."""
        checksum = weights_checksum(params)
        what = f"sending the weights of version {version}"
        self._collective(what, dist.broadcast, paddle.to_tensor([float(version), checksum], dtype="float64"),
                         src=self.trainer_rank)
        for indices in _dtype_groups(params).values():
            flat = paddle.concat([params[i].detach().reshape([-1]) for i in indices])
            self._collective(what, dist.broadcast, flat, src=self.trainer_rank)
        return checksum

    def receive_weights(self, params):
        """Receive one version into `params` (the rollout model's parameters, in the trainer's
        order), atomically; returns `(version, checksum)`. Raises RuntimeError when what
        arrived does not add up to the trainer's checksum (nothing is then changed)."""
        header = paddle.zeros([2], dtype="float64")
        self._collective("waiting for weights", dist.broadcast, header, src=self.trainer_rank)
        version, checksum = int(header.numpy()[0]), float(header.numpy()[1])
        received = {}
        for dtype, indices in _dtype_groups(params).items():
            flat = paddle.zeros([sum(int(np.prod(params[i].shape)) for i in indices)], dtype=dtype)
            self._collective(f"receiving the weights of version {version}", dist.broadcast, flat, src=self.trainer_rank)
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
