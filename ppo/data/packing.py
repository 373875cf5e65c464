"""Packed supervised batches (PaddleNLP's `zero_padding`): the samples of a batch share rows of
at most `max_length` tokens instead of each taking a row padded to the batch's longest.

Each packed row carries, per token, the position within its own sample (`position_ids`) and a
block-diagonal causal mask (`attention_mask [R, 1, L, L]`, bool: token i sees token j when both
belong to the same sample and j <= i), so every sample is computed exactly as alone in a padded
row. The batch holds the same samples as without packing, so its answer-token loss and gradients
are the padded batch's (up to float rounding); only the pad tokens' work disappears.
"""
from __future__ import annotations

from typing import List

import numpy as np
import paddle

from .base import IGNORE_INDEX
from .collate import CollatorBase

__all__ = ["pack_rows", "place_samples", "block_causal_mask", "PackedSupervisedCollator"]


def pack_rows(lengths: List[int], capacity: int) -> List[List[int]]:
    """First-fit decreasing: sample indices grouped into rows whose lengths sum to at most
    `capacity`; longer samples are placed first, each into the first row with room. Raises
    naming the sample when one is longer than `capacity`."""
    rows, room = [], []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        size = lengths[index]
        if size > capacity:
            raise ValueError(f"sample {index} has {size} tokens, more than the packed row length {capacity}")
        for r, left in enumerate(room):
            if size <= left:
                rows[r].append(index)
                room[r] -= size
                break
        else:
            rows.append([index])
            room.append(capacity - size)
    return rows


def place_samples(lengths: List[int], capacity: int):
    """Where each sample goes when packed (`pack_rows`, in each row's order): `(rows, row_of
    [n], start [n], width)`, rows the sample indices per row, `row_of` / `start` each sample's
    row and first column, `width` the longest row's token count."""
    rows = pack_rows(lengths, capacity)
    row_of, start = np.zeros(len(lengths), dtype="int64"), np.zeros(len(lengths), dtype="int64")
    width = 0
    for r, row in enumerate(rows):
        column = 0
        for index in row:
            row_of[index], start[index] = r, column
            column += lengths[index]
        width = max(width, column)
    return rows, row_of, start, width


def block_causal_mask(segments: np.ndarray) -> np.ndarray:
    """`segments [R, L]` (sample number per token, -1 on padding) -> bool `[R, 1, L, L]`: token
    i attends to token j iff same sample and j <= i; a padding token attends only to itself
    (no empty softmax row)."""
    same = segments[:, :, None] == segments[:, None, :]
    causal = np.tril(np.ones(segments.shape[1:] * 2, dtype=bool))[None]
    pad_self = (segments[:, :, None] < 0) & np.eye(segments.shape[1], dtype=bool)[None]
    return ((same & causal & (segments[:, :, None] >= 0)) | pad_self)[:, None]


class PackedSupervisedCollator(CollatorBase):
    """Packs SFT items (`input_ids [L_i]`, `labels [L_i]`) into rows of at most `max_length`:
    `input_ids`, `labels` (-100 on padding and on each sample's first token), `position_ids`
    `[R, T]` int64 and `attention_mask [R, 1, T, T]` bool (see `block_causal_mask`), with T the
    longest packed row."""

    def __init__(self, pad_token_id: int, max_length: int, return_tensors: str = "pd") -> None:
        super().__init__(pad_token_id, return_tensors)
        self.max_length = int(max_length)

    def __call__(self, samples: List[dict]) -> dict:
        sizes = [len(s["input_ids"]) for s in samples]
        rows, row_of, starts, width = place_samples(sizes, self.max_length)
        ids = np.full([len(rows), width], self.pad_token_id, dtype="int64")
        labels = np.full([len(rows), width], IGNORE_INDEX, dtype="int64")
        positions = np.zeros([len(rows), width], dtype="int64")
        segments = np.full([len(rows), width], -1, dtype="int64")
        for index, sample in enumerate(samples):
            r, start, end = row_of[index], starts[index], starts[index] + sizes[index]
            ids[r, start:end], labels[r, start:end] = sample["input_ids"], sample["labels"]
            labels[r, start] = IGNORE_INDEX  # the previous sample's last token must not predict it
            positions[r, start:end] = np.arange(sizes[index])
            segments[r, start:end] = index
        mask = block_causal_mask(segments)
        return {
            "input_ids": self._tensor(ids),
            "labels": self._tensor(labels),
            "position_ids": self._tensor(positions),
            "attention_mask": paddle.to_tensor(mask) if self.return_tensors == "pd" else mask,
        }
