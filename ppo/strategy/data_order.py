"""The order PaddleNLP `Trainer` subclasses (SFT, reward model, DPO) draw their training
batches in, equal to a single-process run's in every layout: data ranks take their share of
each global batch, tensor-parallel copies draw alike, pipeline stages take the first stage's
draw."""
import paddle
import paddle.distributed as dist


class DatasetOrderMixin:
    """For PaddleNLP `Trainer` subclasses: draw the training batches as a single-process run
    does. When every rank reads the same batches (all ranks are tensor-parallel copies,
    `dataset_world_size == 1`), each draws the single-process batches; under data parallelism
    each data rank takes its share of every single-process global batch (`DataRankBatchSampler`),
    so that a data-parallel run trains on the batches of a one-process run with the same global
    batch. PaddleNLP switches to its `DistributedBatchSampler` (another shuffle) as soon as
    there are two processes, so a TP=2 run would otherwise train on another data order than
    the TP=1 run it should reproduce. Tensor-parallel ranks draw alike (PaddleNLP seeds numpy
    with the same seed on each); pipeline stages do not (PaddleNLP seeds numpy with
    `seed + 100 * stage`), so under pipeline parallelism every stage takes the first stage's
    draw (`FirstStageOrderSampler`): the first stage reads the inputs, the last the labels."""

    def _get_train_sampler(self):
        if self.train_dataset is None or self.args.world_size <= 1:
            return super()._get_train_sampler()
        if self.args.dataset_world_size > 1:
            return DataRankBatchSampler(
                self.train_dataset, self.args.per_device_train_batch_size, self.args.dataset_rank,
                self.args.dataset_world_size, self.args.dataloader_drop_last,
            )
        if self.args.pipeline_parallel_degree > 1:
            return paddle.io.BatchSampler(
                sampler=FirstStageOrderSampler(self.train_dataset), batch_size=self.args.per_device_train_batch_size,
                drop_last=self.args.dataloader_drop_last,
            )
        return paddle.io.BatchSampler(
            dataset=self.train_dataset, shuffle=True, batch_size=self.args.per_device_train_batch_size,
            drop_last=self.args.dataloader_drop_last,
        )


    def _get_eval_sampler(self, eval_dataset):
        """Under pipeline parallelism, PaddleNLP fills the last evaluation batch up with rows of
        the first one (its schedule needs `per_device_eval_batch_size` rows), so those rows count
        twice; the pipeline evaluation here takes any number of rows (`ppo.strategy.pipeline.pipe`), so
        the batches are the single-process ones."""
        if self.args.pipeline_parallel_degree > 1 and self.args.dataset_world_size == 1:
            return paddle.io.BatchSampler(eval_dataset, batch_size=self.args.per_device_eval_batch_size, shuffle=False)
        return super()._get_eval_sampler(eval_dataset)


class DataRankBatchSampler(paddle.io.BatchSampler):
    """The single-process order (a `RandomSampler` on numpy's global generator, drawn on global
    rank 0 and broadcast) cut into global batches of `batch_size * dataset_world_size` rows; data
    rank r takes rows `[r * batch_size, (r + 1) * batch_size)` of each. A short last global batch
    (without `drop_last`) is filled up from the start of the order, so that every rank yields the
    same number of batches (collectives stay in step)."""

    def __init__(self, dataset, batch_size, dataset_rank, dataset_world_size, drop_last=False):
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.rank, self.world = dataset_rank, dataset_world_size

    def __len__(self):
        rows, size = len(self.dataset), self.batch_size * self.world
        return rows // size if self.drop_last else -(-rows // size)

    def __iter__(self):
        order = paddle.to_tensor(list(paddle.io.RandomSampler(self.dataset)), dtype="int64")
        dist.broadcast(order, src=0)
        order = order.numpy().tolist()
        size = self.batch_size * self.world
        wrapped = order * (size // max(len(order), 1) + 2)  # room to fill the last global batch
        for start in range(0, len(self) * size, size):
            yield wrapped[start + self.rank * self.batch_size : start + (self.rank + 1) * self.batch_size]


class FirstStageOrderSampler(paddle.io.RandomSampler):
    """`RandomSampler` (numpy's global generator, as PaddleNLP's single-process runs) whose
    order, drawn on every rank, is the one the pipeline group's first stage drew (broadcast)."""

    def __iter__(self):
        from paddle.distributed import fleet

        order = paddle.to_tensor(list(super().__iter__()), dtype="int64")
        group = fleet.get_hybrid_communicate_group().get_pipe_parallel_group()
        dist.broadcast(order, src=group.ranks[0], group=group)
        yield from order.numpy().tolist()
