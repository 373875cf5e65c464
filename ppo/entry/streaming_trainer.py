"""PaddleNLP's `Trainer` on a `StreamingDataset` (`lazy: true`): batches read in the training
process as the Trainer asks for them, and a resume that starts at the record after the last one
the checkpoint trained.

PaddleNLP's Trainer resumes an iterable dataset by reading and dropping every batch the
checkpoint already trained (`steps_trained_in_current_epoch`): on a large file that reads and
tokenises all of it again. Here each checkpoint holds `stream_position.json`, the byte offset
and line of the next record (`ppo.data.streaming`); the resumed loader hands the Trainer
placeholder batches (None) for the steps it skips and then reads from that offset.
"""
import json
import logging
import os

from ..data.base import DataError
from ..data.streaming import StreamingDataset, start_position

logger = logging.getLogger("ppo")

POSITION_FILE = "stream_position.json"


class StreamLoader:
    """Batches of `per_device` items of a `StreamingDataset`, epoch after epoch. With several
    data ranks each reads the whole stream and keeps its share of each `per_device * ranks`
    items (PaddleNLP's `IterableDatasetShard`); a last batch too small to give every rank its
    share is dropped there. `position` is where the stream stands after the last batch handed
    out (what a checkpoint saved now must resume from). `skip`: placeholder batches (None)
    handed out first, one per micro-batch the resuming Trainer drops."""

    def __init__(self, dataset, collate, per_device, rank=0, ranks=1, position=None, skip=0):
        self.dataset, self.collate, self.per_device, self.rank, self.ranks = dataset, collate, per_device, rank, ranks
        self.position = position or start_position()
        self.skip = skip

    def __iter__(self):
        for _ in range(self.skip):
            yield None
        self.skip = 0
        width, batch = self.per_device * self.ranks, []
        for item, after in self.dataset.items(self.position):
            batch.append(item)
            if len(batch) == width:
                self.position = after
                yield self.collate(batch[self.rank * self.per_device:(self.rank + 1) * self.per_device])
                batch = []
        self.position = start_position(self.position["epoch"] + 1)
        if batch and self.ranks == 1:
            yield self.collate(batch)
        elif batch:
            logger.warning(f"lazy: the last {len(batch)} samples of the epoch do not fill a batch on each of "
                           f"{self.ranks} data ranks: dropped")


def saved_position(checkpoint):
    """The stream position saved in `checkpoint` (None when it has none)."""
    path = os.path.join(checkpoint, POSITION_FILE) if checkpoint else None
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class StreamingTrainerMixin:
    """For PaddleNLP `Trainer` subclasses: a `StreamingDataset` train set is read by a
    `StreamLoader`, whose position each checkpoint saves; `train(resume_from_checkpoint=...)`
    continues at the saved record. `ignore_data_skip` starts again at the first record, as
    PaddleNLP's Trainer does."""

    _stream_checkpoint = None

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        self._stream_checkpoint = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def get_train_dataloader(self):
        if not isinstance(self.train_dataset, StreamingDataset):
            return super().get_train_dataloader()
        args, position, skip = self.args, None, 0
        if self._stream_checkpoint and not args.ignore_data_skip:
            position = saved_position(self._stream_checkpoint)
            if position is None:
                raise DataError(f"{self._stream_checkpoint} has no {POSITION_FILE}: it was not saved by a lazy run, so "
                                 "where its data stream stopped is unknown; resume it with lazy false")
            skip = self._resumed_steps() * args.gradient_accumulation_steps  # the Trainer drops these batches
            logger.info(f"lazy: resuming the data stream at line {position['line'] + 1} of {position['path']} "
                        f"(epoch {position['epoch']})")
        self.stream_loader = StreamLoader(self.train_dataset, self.data_collator, args.per_device_train_batch_size,
                                          args.dataset_rank, args.dataset_world_size, position, skip)
        return self.stream_loader

    def _resumed_steps(self):
        """Optimiser steps the Trainer skips when resuming `_stream_checkpoint`: its global step
        (an iterable dataset's epoch is `max_steps` steps long to PaddleNLP's Trainer)."""
        with open(os.path.join(self._stream_checkpoint, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f)["global_step"]) % max(self.args.max_steps, 1)

    def _save_checkpoint(self, model, metrics=None):
        """The stream position first: the Trainer's scheduler file, written last, marks a
        complete checkpoint (`ppo.checkpoints.checkpoint.incomplete_reason`), so a complete one holds it."""
        loader = getattr(self, "stream_loader", None)
        if loader is not None and self.args.should_save:
            folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, POSITION_FILE + ".tmp"), "w", encoding="utf-8") as f:
                json.dump(loader.position, f)
            os.replace(os.path.join(folder, POSITION_FILE + ".tmp"), os.path.join(folder, POSITION_FILE))
        super()._save_checkpoint(model, metrics)
