"""Prompt-only data for RL rollouts (PPO/GRPO): de-duplicated prompts, left-padded for generation."""
from __future__ import annotations

import json
from typing import Any, List, Optional

import numpy as np

from .base import DEFAULT_TEMPLATE, RawSample
from .collate import CollatorBase, left_padding, position_ids_from_mask
from .tokenized import DEFAULT_MAX_LENGTH, TokenizedDataset

__all__ = ["PromptOnlyDataset", "PromptOnlyCollator"]


class PromptOnlyDataset(TokenizedDataset):
    """Items: `input_ids [Lp]` (int64 numpy prompt ids), `prompt` (the formatted prompt
    text), `src` (the raw final user turn) and `label` (the sample's reference answer,
    e.g. Jsonfile's `tgt`, or None) for a reward server.

    Items also hold `extra`, the record's other fields (an environment's per-record data).
    Prompts are de-duplicated by prompt text (and `extra`), the first occurrence kept
    (`duplicates_removed` in `stats`). Over-long rule: a prompt longer than
    `max_prompt_len` tokens (default `max_length`; None keeps all) is dropped
    (`dropped_prompt_too_long`). Counts are logged.
    """

    STAT_KEYS = ("duplicates_removed", "dropped_prompt_too_long")

    def __init__(
        self,
        datasets: Any,
        tokenizer: Any,
        max_length: Optional[int] = DEFAULT_MAX_LENGTH,
        prompt_template: str = DEFAULT_TEMPLATE,
        use_chat_template: bool = False,
        seed: int = 42,
        max_prompt_len: Optional[int] = None,
        require_label: bool = False,
        prompt_key: Optional[str] = None,
        response_key: Optional[str] = None,
    ) -> None:
        self.require_label = require_label  # a reward server needs every prompt's reference answer
        self.response_key = response_key
        self.longest_prompt = 0
        self.max_prompt_len = max_length if max_prompt_len is None else max_prompt_len
        if self.max_prompt_len is not None and (not isinstance(self.max_prompt_len, int) or self.max_prompt_len <= 0):
            raise ValueError(f"max_prompt_len must be a positive int, got {self.max_prompt_len!r}")
        self._seen = set()
        super().__init__(datasets, tokenizer, max_length, prompt_template, use_chat_template, seed,
                         prompt_key=prompt_key, response_key=response_key)
        del self._seen

    def preprocess(self, raw_sample: RawSample) -> Optional[dict]:
        prompt, src = self.format_sample_prompt(raw_sample)
        if self.require_label and raw_sample.get("label") is None:
            where = f"'{self.response_key}', the response_key" if self.response_key else "'tgt'"
            raise ValueError(f"no reference answer ({where}); the reward server (use_rm_server) needs one for every prompt")
        extra = raw_sample.get("extra")
        key = prompt if not extra else (prompt, json.dumps(extra, sort_keys=True, default=str))
        if key in self._seen:  # one prompt with other per-record data (an environment's) is another sample
            self._count("duplicates_removed")
            return None
        self._seen.add(key)
        prompt_ids = self.tokenize_prompt(prompt)
        self.longest_prompt = max(self.longest_prompt, len(prompt_ids))
        if self.max_prompt_len is not None and len(prompt_ids) > self.max_prompt_len:
            self._count("dropped_prompt_too_long")
            return None
        return {
            "input_ids": np.asarray(prompt_ids, dtype="int64"),  # [Lp]
            "prompt": prompt,
            "src": src,
            "label": raw_sample.get("label"),
            "extra": extra or {},
        }

    def length_limit(self) -> str:
        return f"max_prompt_len={self.max_prompt_len}"  # what drops prompts here; max_length limits nothing

    def empty_reason(self) -> str:
        if self.stats["raw"] and self.stats["dropped_prompt_too_long"] + self.stats["duplicates_removed"] == self.stats["raw"]:
            return (
                f"0 prompts kept of {self.stats['raw']}: {self.stats['dropped_prompt_too_long']} longer than "
                f"max_prompt_len={self.max_prompt_len} tokens (the longest has {self.longest_prompt}), "
                f"{self.stats['duplicates_removed']} duplicates"
            )
        return super().empty_reason()

    def get_collator(self, return_tensors: str = "pd") -> "PromptOnlyCollator":
        return PromptOnlyCollator(self._pad_token_id(), return_tensors)


class PromptOnlyCollator(CollatorBase):
    """Left-pads prompts for generation:

    - `input_ids [B, Tp]` (int64, padded on the left with `pad_token_id`);
    - `attention_mask [B, Tp]` (int64, 0 on padding);
    - `position_ids [B, Tp]` (int64, `cumsum(mask) - 1` clipped at 0);
    - `prompt`, `src`, `label`: python lists of length B (label entries may be None);
    - `extra`: the records' other fields (dicts, empty when none), for an environment.
    """

    def __call__(self, samples: List[dict]) -> dict:
        ids = [s["input_ids"] for s in samples]
        mask = left_padding([np.ones(len(x)) for x in ids], 0)
        return {
            "input_ids": self._tensor(left_padding(ids, self.pad_token_id)),
            "attention_mask": self._tensor(mask),
            "position_ids": self._tensor(position_ids_from_mask(mask)),
            "prompt": [s.get("prompt") for s in samples],
            "src": [s.get("src") for s in samples],
            "label": [s.get("label") for s in samples],
            "extra": [s.get("extra") or {} for s in samples],
        }
