"""Supervised fine-tuning data: prompt + answer, loss on the answer tokens only."""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from .base import IGNORE_INDEX, RawSample
from .collate import CollatorBase, right_padding
from .tokenized import PromptTruncationMixin, TokenizedDataset

__all__ = ["SupervisedDataset", "SupervisedCollator"]


class SupervisedDataset(PromptTruncationMixin, TokenizedDataset):
    """Items `{"input_ids": [L], "labels": [L]}` (int64 numpy):
    `input_ids = prompt_ids + answer_ids`, `labels = [-100] * len(prompt_ids) + answer_ids`,
    where answer ids end with EOS.

    Over-long rule (counts in `stats`, logged): a sample whose prompt alone has
    `>= max_length` tokens is dropped (`dropped_prompt_too_long`); otherwise the
    answer is cut so the sequence has at most `max_length` tokens
    (`truncated_answer`); a cut answer loses its EOS (EOS stays last only if it fits).
    A sample whose answer is empty (or only whitespace) teaches nothing but EOS and is
    dropped (`dropped_empty_answer`, logged as a warning; no sample left is an error).

    Constructor: `SupervisedDataset(datasets, tokenizer, max_length=512,
    prompt_template=DEFAULT_TEMPLATE, use_chat_template=False, seed=42)`.
    """

    REQUIRED_FIELDS = ("answer",)
    STAT_KEYS = ("dropped_prompt_too_long", "truncated_answer", "dropped_empty_answer")

    def preprocess(self, raw_sample: RawSample) -> Optional[dict]:
        if not raw_sample["answer"].strip():
            self._count("dropped_empty_answer")
            return None
        prompt, _ = self.format_sample_prompt(raw_sample)
        prompt_ids = self.cut_prompt(self.tokenize_prompt(prompt), self.truncate_prompt_to)
        answer_ids = self.tokenize_answer(raw_sample["answer"])
        fitted = self.fit_answer(prompt_ids, answer_ids)
        if fitted is None:
            self._count("dropped_prompt_too_long")
            return None
        if len(fitted) < len(answer_ids):
            self._count("truncated_answer")
        return {
            "input_ids": np.asarray(prompt_ids + fitted, dtype="int64"),  # [L]
            "labels": np.asarray([IGNORE_INDEX] * len(prompt_ids) + fitted, dtype="int64"),  # [L]
        }

    def get_collator(self, return_tensors: str = "pd", packed_length: Optional[int] = None):
        """`SupervisedCollator`, or with `packed_length` a `PackedSupervisedCollator` packing each
        batch into rows of at most that many tokens (`zero_padding`)."""
        if packed_length:
            from .packing import PackedSupervisedCollator

            return PackedSupervisedCollator(self._pad_token_id(), packed_length, return_tensors)
        return SupervisedCollator(self._pad_token_id(), return_tensors)


class SupervisedCollator(CollatorBase):
    """Right-pads SFT items into int64 tensors:

    - `input_ids [B, T]`: pad with `pad_token_id`;
    - `attention_mask [B, T]`: 1 on real tokens, 0 on padding;
    - `labels [B, T]`: -100 on prompt tokens and padding.
    """

    def __call__(self, samples: List[dict]) -> dict:
        ids = [s["input_ids"] for s in samples]
        return {
            "input_ids": self._tensor(right_padding(ids, self.pad_token_id)),
            "attention_mask": self._tensor(right_padding([np.ones(len(x)) for x in ids], 0)),
            "labels": self._tensor(right_padding([s["labels"] for s in samples], IGNORE_INDEX)),
        }
