"""The reductions a training step takes over its processes, for the trainer's math (whitening
over data ranks, running score statistics, the Lagrange window, group checks, metrics): one
object per run, built by the strategy (`ppo.strategy`), so that the trainer's parts never call
`paddle.distributed` themselves. On one process every method returns its input without a
collective; on several, every rank must call the same methods in the same order.

`data_rank` / `data_world`: PaddleNLP's dataset rank and world (the ranks that read different
data); `copies`: how many ranks hold each data rank's rows (its tensor- and pipeline-parallel
ranks). A split run's collectives span its trainer ranks only (`training_group`)."""
import numpy as np
import paddle

from ..common.training_world import training_group


class Ranks:
    """The run's processes as the trainer's math sees them (see the module docstring)."""

    def __init__(self, rank=0, world_size=1, data_rank=0, data_world=1):
        self.rank, self.world_size, self.data_rank, self.data_world = rank, world_size, data_rank, data_world

    @property
    def is_main(self):
        return self.rank == 0

    @property
    def copies(self):
        """Ranks holding the same data rank's rows (float: the divisor of sums over all ranks)."""
        return self.world_size / self.data_world

    def sum(self, values, divisor=1.0):
        """Each of `values` (numbers or scalar tensors) summed over every rank in float64, divided
        by `divisor`; a list of floats."""
        t = paddle.to_tensor([float(v) for v in values], dtype="float64")
        if self.world_size > 1:
            import paddle.distributed as dist

            dist.all_reduce(t, group=training_group())
        return (t.numpy() / divisor).tolist()

    def any(self, flag):
        """Whether `flag` is true on some rank."""
        if self.world_size == 1:
            return bool(flag)
        import paddle.distributed as dist

        t = paddle.to_tensor([int(bool(flag))], dtype="int64")
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=training_group())
        return bool(int(t))

    def gather(self, values, dtype="float64"):
        """Every rank's `values` (a list of numbers, the same length on every rank), in rank
        order: a list of numpy arrays."""
        if self.world_size == 1:
            return [np.asarray(values, dtype=dtype)]
        import paddle.distributed as dist

        gathered = []
        dist.all_gather(gathered, paddle.to_tensor(list(values), dtype=dtype), group=training_group())
        return [g.numpy() for g in gathered]

    def gather_objects(self, obj):
        """Every rank's picklable `obj`, in rank order."""
        if self.world_size == 1:
            return [obj]
        import paddle.distributed as dist

        gathered = []
        dist.all_gather_object(gathered, obj, group=training_group())
        return gathered

    def reduce_metrics(self, metrics):
        """A name -> float dict reduced over the ranks by each name's reduction
        (`ppo.common.metrics.reduce_across_ranks`)."""
        from ..common.metrics import reduce_across_ranks

        return reduce_across_ranks(metrics)
