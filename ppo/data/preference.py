"""Pairwise preference data (reward model training, DPO): a better and a worse answer."""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .base import IGNORE_INDEX, RawSample
from .collate import CollatorBase, right_padding
from .tokenized import PromptTruncationMixin, TokenizedDataset

__all__ = ["PreferenceDataset", "PreferenceCollator"]


class PreferenceDataset(PromptTruncationMixin, TokenizedDataset):
    """Items (int64 numpy): `better_input_ids [Lb]`, `better_labels [Lb]`,
    `worse_input_ids [Lw]`, `worse_labels [Lw]`; each sequence is prompt + answer
    (+EOS) and its labels are -100 on the prompt. `better` of the raw sample says
    whether `answer` (else `other_answer`) is the better one.

    Over-long rule (counts in `stats`, logged): a pair whose prompt alone has
    `>= max_length` tokens is dropped (`dropped_prompt_too_long`); otherwise each
    answer is cut to fit `max_length` (`truncated_answers` counts answers; a cut
    answer loses its EOS). A pair whose two sequences are identical after
    tokenisation/truncation carries no preference and is dropped
    (`dropped_identical_pair`). A pair whose better answer is empty (or only whitespace)
    would teach the model to answer nothing and is dropped (`dropped_empty_answer`, logged as
    a warning); no pair left is an error. An empty worse answer is kept: "an empty answer is
    worse" is a preference worth learning.

    Constructor: `PreferenceDataset(datasets, tokenizer, max_length=512,
    prompt_template=DEFAULT_TEMPLATE, use_chat_template=False, seed=42)`.
    """

    REQUIRED_FIELDS = ("answer", "other_answer", "better")
    STAT_KEYS = ("dropped_prompt_too_long", "truncated_answers", "dropped_identical_pair", "dropped_empty_answer")

    def order_answers(self, raw_sample: RawSample) -> Tuple[str, str, dict]:
        """`(better_answer, worse_answer, extra_item_fields)`."""
        answer, other = raw_sample["answer"], raw_sample["other_answer"]
        return (answer, other, {}) if raw_sample["better"] else (other, answer, {})

    def preprocess(self, raw_sample: RawSample) -> Optional[dict]:
        better, worse, extra = self.order_answers(raw_sample)
        if not better.strip():
            self._count("dropped_empty_answer")
            return None
        prompt, _ = self.format_sample_prompt(raw_sample)
        prompt_ids = self.cut_prompt(self.tokenize_prompt(prompt), self.truncate_prompt_to)
        item = {}
        for key, answer in (("better", better), ("worse", worse)):
            sequence = self.answer_sequence(prompt_ids, answer, "truncated_answers")
            if sequence is None:
                return None
            item[f"{key}_input_ids"], item[f"{key}_labels"] = sequence
        if np.array_equal(item["better_input_ids"], item["worse_input_ids"]):
            self._count("dropped_identical_pair")
            return None
        item.update(extra)
        return item

    def get_collator(self, return_tensors: str = "pd") -> "PreferenceCollator":
        return PreferenceCollator(self._pad_token_id(), return_tensors)


class PreferenceCollator(CollatorBase):
    """Right-pads both sides to one common length T (the longest of either side), int64:

    - `better_input_ids [B, T]`, `better_attention_mask [B, T]`, `better_labels [B, T]`;
    - `worse_input_ids [B, T]`, `worse_attention_mask [B, T]`, `worse_labels [B, T]`;

    ids padded with `pad_token_id`, masks 1 on real tokens, labels -100 on prompt and padding.
    """

    def __call__(self, samples: List[dict]) -> dict:
        width = max(max(len(s["better_input_ids"]), len(s["worse_input_ids"])) for s in samples)
        batch = {}
        for side in ("better", "worse"):
            ids = [s[f"{side}_input_ids"] for s in samples]
            batch[f"{side}_input_ids"] = self._tensor(right_padding(ids, self.pad_token_id, width=width))
            batch[f"{side}_attention_mask"] = self._tensor(
                right_padding([np.ones(len(x)) for x in ids], 0, width=width)
            )
            batch[f"{side}_labels"] = self._tensor(
                right_padding([s[f"{side}_labels"] for s in samples], IGNORE_INDEX, width=width)
            )
        return batch
