"""Seeded prompt order shared by all ranks, with a resumable position.

Each epoch is a permutation of the dataset drawn from `(seed, epoch)`; a global
batch of `batch_size * world_size` prompts is taken from the current offset and
rank r keeps slice r. An epoch's remainder smaller than a global batch is
skipped. `state_dict()` holds `(epoch, offset)`, so a resumed run draws exactly
the prompts an uninterrupted run would.
"""
import numpy as np


class PromptSampler:
    def __init__(self, dataset_size, batch_size, rank=0, world_size=1, seed=42, shuffle=True):
        global_batch = batch_size * world_size
        if dataset_size < global_batch:
            raise ValueError(
                f"the prompt dataset has {dataset_size} prompts, fewer than one global batch "
                f"(per_device_prompt_batch_size {batch_size} x {world_size} ranks)"
            )
        self.dataset_size, self.batch_size = dataset_size, batch_size
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.offset = 0, 0

    def _order(self):
        if not self.shuffle:
            return np.arange(self.dataset_size)
        return np.random.RandomState(self.seed + self.epoch).permutation(self.dataset_size)

    def next_indices(self):
        """This rank's `batch_size` dataset indices of the next global batch."""
        global_batch = self.batch_size * self.world_size
        if self.offset + global_batch > self.dataset_size:
            self.epoch, self.offset = self.epoch + 1, 0
        chunk = self._order()[self.offset : self.offset + global_batch]
        self.offset += global_batch
        start = self.rank * self.batch_size
        return chunk[start : start + self.batch_size].tolist()

    def state_dict(self):
        return {"epoch": self.epoch, "offset": self.offset}

    def set_state_dict(self, state):
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
