"""Tokenised preference data beyond pairs: ranked lists, unpaired binary feedback and
rejected-only answers, all as "answer sets" (a prompt with K answers and one score each).

Items (numpy): `input_ids` and `labels`, lists of K int64 arrays (prompt + answer (+EOS),
labels -100 on the prompt), and `scores` float32 `[K]`:

- `RankedPreferenceDataset` (K >= 2): the record's `answers` sorted best first by
  `answer_scores`; a pair (`answer`, `other_answer`, `better`) is refused;
- `UnpairedPreferenceDataset` (K = 1): `answer` with score 1 (`desirable`) or 0;
- `RejectedOnlyDataset` (K = 1, score 0): undesirable unpaired answers (desirable ones are
  skipped, counted in `skipped_desirable`), or the worse answer of a pair.

`AnswerSetCollator` stacks a batch answer-major (see its docstring). `PREFERENCE_DATASETS`
names the dataset class of each data kind of `ppo.algos.DATA_KINDS`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .base import IGNORE_INDEX, RawSample
from .collate import CollatorBase, right_padding
from .tokenized import PromptTruncationMixin, TokenizedDataset
from .preference import PreferenceDataset

__all__ = [
    "AnswerSetCollator",
    "PREFERENCE_DATASETS",
    "RankedPreferenceDataset",
    "RejectedOnlyDataset",
    "UnpairedPreferenceDataset",
    "sample_kind",
]


def sample_kind(sample: RawSample) -> str:
    """What a raw sample holds: `lists`, `pairs`, `unpaired`, or `supervised` (one plain answer)."""
    if sample.get("answers") is not None:
        return "lists"
    if sample.get("other_answer") is not None:
        return "pairs"
    if sample.get("desirable") is not None:
        return "unpaired"
    return "supervised"


class AnswerSetDataset(PromptTruncationMixin, TokenizedDataset):
    """Base of the answer-set datasets: `answer_set(sample)` gives `(answers, scores)` or None
    (skip); a prompt of `>= max_length` tokens drops the sample (`dropped_prompt_too_long`),
    answers are cut to fit (`truncated_answers`)."""

    ACCEPTS: Tuple[str, ...] = ()
    """Sample kinds (`sample_kind`) this dataset reads; any other raises ValueError naming both."""
    STAT_KEYS = ("dropped_prompt_too_long", "truncated_answers")

    def answer_set(self, sample: RawSample) -> Optional[Tuple[List[str], List[float]]]:
        raise NotImplementedError

    def preprocess(self, raw_sample: RawSample) -> Optional[dict]:
        kind = sample_kind(raw_sample)
        if kind not in self.ACCEPTS:
            raise ValueError(f"{type(self).__name__} reads {' or '.join(self.ACCEPTS)} records; this record holds {kind}")
        chosen = self.answer_set(raw_sample)
        if chosen is None:
            return None
        prompt, _ = self.format_sample_prompt(raw_sample)
        prompt_ids = self.cut_prompt(self.tokenize_prompt(prompt), self.truncate_prompt_to)
        ids, labels = [], []
        for answer in chosen[0]:
            sequence = self.answer_sequence(prompt_ids, answer, "truncated_answers")
            if sequence is None:
                return None
            ids.append(sequence[0])
            labels.append(sequence[1])
        return {"input_ids": ids, "labels": labels, "scores": np.asarray(chosen[1], dtype="float32")}

    def get_collator(self, return_tensors: str = "pd") -> "AnswerSetCollator":
        return AnswerSetCollator(self._pad_token_id(), return_tensors)


class RankedPreferenceDataset(AnswerSetDataset):
    """K >= 2 answers per prompt, sorted best first by score (stable for ties)."""

    ACCEPTS = ("lists",)

    def answer_set(self, sample):
        order = sorted(range(len(sample["answers"])), key=lambda i: -sample["answer_scores"][i])
        return [sample["answers"][i] for i in order], [float(sample["answer_scores"][i]) for i in order]


class UnpairedPreferenceDataset(AnswerSetDataset):
    """One answer per prompt with score 1 (desirable) or 0 (undesirable)."""

    ACCEPTS = ("unpaired",)

    def answer_set(self, sample):
        return [sample["answer"]], [1.0 if sample["desirable"] else 0.0]


class RejectedOnlyDataset(AnswerSetDataset):
    """One answer to move away from per prompt (score 0): an undesirable unpaired answer or
    the worse answer of a pair; desirable unpaired answers are skipped (`skipped_desirable`)."""

    ACCEPTS = ("unpaired", "pairs")
    STAT_KEYS = AnswerSetDataset.STAT_KEYS + ("skipped_desirable",)

    def answer_set(self, sample):
        if sample_kind(sample) == "pairs":
            return [sample["other_answer"] if sample["better"] else sample["answer"]], [0.0]
        if sample["desirable"]:
            self._count("skipped_desirable")
            return None
        return [sample["answer"]], [0.0]


class AnswerSetCollator(CollatorBase):
    """Stacks B answer sets (K = the largest set) answer-major, right-padded to one length T:

    - `input_ids`, `attention_mask`, `labels` `[K * B, T]` int64, row `k * B + b` = answer k
      of prompt b; a prompt with fewer answers fills its missing rows with its first sequence
      and all-(-100) labels (no answer tokens);
    - `scores`, `valid` `[B, K]` float32 (`valid` 0 on the filled rows, their score 0).
    """

    def __call__(self, samples: List[dict]) -> dict:
        K, B = max(len(s["input_ids"]) for s in samples), len(samples)
        ids, labels = [], []
        for k in range(K):
            for s in samples:
                present = k < len(s["input_ids"])
                ids.append(s["input_ids"][k] if present else s["input_ids"][0])
                labels.append(s["labels"][k] if present else np.full(len(s["input_ids"][0]), IGNORE_INDEX))
        scores, valid = np.zeros([B, K], "float32"), np.zeros([B, K], "float32")
        for b, s in enumerate(samples):
            scores[b, : len(s["scores"])], valid[b, : len(s["scores"])] = s["scores"], 1.0
        batch = {
            "input_ids": self._tensor(right_padding(ids, self.pad_token_id)),
            "attention_mask": self._tensor(right_padding([np.ones(len(x)) for x in ids], 0)),
            "labels": self._tensor(right_padding(labels, IGNORE_INDEX)),
        }
        batch["scores"], batch["valid"] = self._floats(scores), self._floats(valid)
        return batch

    def _floats(self, array: np.ndarray):
        import paddle

        return paddle.to_tensor(array, dtype="float32") if self.return_tensors == "pd" else array


PREFERENCE_DATASETS = {
    "pairs": PreferenceDataset,
    "lists": RankedPreferenceDataset,
    "unpaired": UnpairedPreferenceDataset,
    "rejected": RejectedOnlyDataset,
}
"""The tokenised dataset class of each preference data kind (`ppo.algos.DATA_KINDS`)."""
