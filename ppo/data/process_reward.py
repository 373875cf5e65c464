"""Step-labelled data for process reward models (PRMs), in Math-Shepherd's format (the data
PaddleNLP's `llama/prm_flashmask_argument.json` trains on; Wang et al. 2024).

Record schema (one JSON object a line, read as `paddlenlp-prm`, alias `math-shepherd`)::

    {"input": "<question> <step 1> ки\\n<step 2> ки", "label": "<question> <step 1> +\\n<step 2> -"}

- `input`: the question and the solution, the placeholder token (`placeholder_token`, `ки`)
  after each step;
- `label`: the same text with each placeholder replaced by a reward token (`reward_tokens`
  `+,-`: the first marks a good step, the second a bad one), or a list with one reward token
  (or 1/0, true/false) per placeholder.

Tokenised (`ProcessRewardDataset`): the text between placeholders is tokenised piece by piece
(the first piece with the tokenizer's special tokens, the others without) and the placeholder's
one token id follows each piece, so the score model's score at that token is the step's score
and the placeholder is never merged into a neighbouring token. The records are used as they
are: `prompt_template` does not apply (the `input` holds the question). `prm_sequence` is the
one home of that layout (training, evaluation and the RL scorer build the same ids).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from .base import RawSample
from .collate import CollatorBase, right_padding
from .tokenized import PromptTruncationMixin, TokenizedDataset
from .encode import encode_text
from .readers import LocalFileDataset, Record

__all__ = ["PRM_DATASET", "ProcessRewardRawDataset", "ProcessRewardDataset", "ProcessRewardCollator",
           "placeholder_id", "prm_sequence", "step_labels_from_text", "parse_reward_tokens", "PLACEHOLDER_TOKEN",
           "REWARD_TOKENS"]

PRM_DATASET = "paddlenlp-prm"
PLACEHOLDER_TOKEN = "ки"
"""The default `placeholder_token` (Math-Shepherd's, PaddleNLP's): rm/run_reward.py's field and the dataset's."""
REWARD_TOKENS = "+,-"
"""The default `reward_tokens` (PaddleNLP's): rm/run_reward.py's field, the dataset's, an older config's."""


def parse_reward_tokens(text: str) -> Tuple[str, str]:
    """PaddleNLP's `reward_tokens` (`"+,-"`): `(good, bad)`. Raises ValueError for anything but
    two different, non-empty tokens."""
    tokens = [t.strip() for t in str(text).split(",")]
    if len(tokens) != 2 or not all(tokens) or tokens[0] == tokens[1]:
        raise ValueError(f"reward_tokens must name two different tokens, good then bad (e.g. '+,-'), got {text!r}")
    return tokens[0], tokens[1]


class ProcessRewardRawDataset(LocalFileDataset):
    NAME = PRM_DATASET
    ALIASES = ("math-shepherd",)
    PROCESS_LABELS = True  # rm/run_reward.py's process_reward reads only datasets that say so
    FIELD_ROLES = {"prompt": "input"}

    def convert(self, record: Record) -> RawSample:
        text = record.get_str("input", nonempty=True)
        label = record.get("label", (str, list))
        return RawSample(input=text, prm_label=label)


def step_labels_from_text(pieces: Sequence[str], label: str, reward_tokens: Tuple[str, str]) -> List[int]:
    """1/0 per placeholder from Math-Shepherd's `label` text: `pieces[0] + t1 + pieces[1] + t2 ...`
    with each `t` one of `reward_tokens`. Raises ValueError where the texts differ."""
    labels, pos = [], 0
    for i, piece in enumerate(pieces):
        if not label.startswith(piece, pos):
            raise ValueError(f"'label' differs from 'input' in step {i + 1} (after {len(labels)} reward tokens): "
                             f"expected {piece[:40]!r} at character {pos}")
        pos += len(piece)
        if i == len(pieces) - 1:
            break
        token = next((t for t in reward_tokens if label.startswith(t, pos)), None)
        if token is None:
            raise ValueError(f"'label' has {label[pos:pos + 8]!r} where placeholder {i + 1} is; expected one of {list(reward_tokens)}")
        labels.append(1 if token == reward_tokens[0] else 0)
        pos += len(token)
    if pos != len(label):
        raise ValueError(f"'label' has {len(label) - pos} characters more than 'input'")
    return labels


def step_labels_from_list(values: list, count: int, reward_tokens: Tuple[str, str]) -> List[int]:
    if len(values) != count:
        raise ValueError(f"'label' has {len(values)} step labels for {count} placeholders")
    out = []
    for v in values:
        if v in (reward_tokens[0], True, 1):
            out.append(1)
        elif v in (reward_tokens[1], False, 0):
            out.append(0)
        else:
            raise ValueError(f"step label {v!r} is none of {list(reward_tokens)}, true/false, 1/0")
    return out


def placeholder_id(tokenizer, placeholder_token: str) -> int:
    """The one token id of `placeholder_token`; ValueError when the tokenizer splits it."""
    ids = tokenizer(placeholder_token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1 or ids[0] == getattr(tokenizer, "unk_token_id", None):
        raise ValueError(f"placeholder_token {placeholder_token!r} is {len(ids)} token(s) {ids} for this tokenizer; PRM "
                         "scores are read at one known token per step: choose a token of its vocabulary")
    return ids[0]


def prm_sequence(tokenizer, pieces: Sequence[str], placeholder: int,
                 first_ids: Optional[List[int]] = None) -> Tuple[List[int], List[int]]:
    """`(input_ids, step_positions)`: each piece's tokens followed by the placeholder id, one step
    per piece; the first piece with the tokenizer's special tokens (or given as `first_ids`)."""
    ids = list(first_ids) if first_ids is not None else encode_text(tokenizer, pieces[0], add_special_tokens=True)
    positions = [len(ids)]
    ids.append(placeholder)
    for piece in pieces[1:]:
        ids += encode_text(tokenizer, piece, add_special_tokens=False) if piece else []
        positions.append(len(ids))
        ids.append(placeholder)
    return ids, positions


class ProcessRewardDataset(PromptTruncationMixin, TokenizedDataset):
    """Items (numpy): `input_ids [L]` int64, `step_positions [k]` int64 (where each step's
    placeholder is), `step_labels [k]` float32 (1 good, 0 bad).

    Over-long rules (counts in `stats`): `truncate_prompt_to` keeps the last tokens of the text
    before the first placeholder (the question and the first step; `truncated_prompt`); a
    sequence longer than `max_length` keeps the steps whose placeholder fits (`truncated_steps`
    counts the steps cut); a record whose first placeholder does not fit is dropped
    (`dropped_too_long`); a record without a placeholder is an error.

    Constructor: `ProcessRewardDataset(datasets, tokenizer, max_length=512, placeholder_token="ки",
    reward_tokens="+,-", truncate_prompt_to=None, seed=42)` (`prompt_template` and
    `use_chat_template` are not used).
    """

    REQUIRED_FIELDS = ("input", "prm_label")
    STAT_KEYS = ("truncated_prompt", "truncated_steps", "dropped_too_long")

    def __init__(self, *args, placeholder_token: str = PLACEHOLDER_TOKEN, reward_tokens: str = REWARD_TOKENS, **kwargs) -> None:
        self.placeholder_token = placeholder_token
        self.reward_tokens = parse_reward_tokens(reward_tokens)
        self.placeholder = placeholder_id(kwargs["tokenizer"] if "tokenizer" in kwargs else args[1], placeholder_token)
        super().__init__(*args, **kwargs)

    def preprocess(self, raw_sample: RawSample) -> Optional[dict]:
        text, label = raw_sample["input"], raw_sample["prm_label"]  # errors are raised with the record's place
        pieces = text.split(self.placeholder_token)
        steps = len(pieces) - 1
        if steps < 1:
            raise ValueError(f"'input' holds no placeholder_token {self.placeholder_token!r}")
        if isinstance(label, str):
            labels = step_labels_from_text(pieces, label, self.reward_tokens)
        else:
            labels = step_labels_from_list(label, steps, self.reward_tokens)
        first = self.cut_prompt(encode_text(self.tokenizer, pieces[0], add_special_tokens=True), self.truncate_prompt_to)
        ids, positions = prm_sequence(self.tokenizer, pieces[:-1], self.placeholder, first_ids=first)
        kept = sum(1 for p in positions if p < self.max_length) if self.max_length else steps
        if kept == 0:
            self._count("dropped_too_long")
            return None
        if kept < steps:
            self._count("truncated_steps", steps - kept)
            ids = ids[: positions[kept - 1] + 1]
        return {
            "input_ids": np.asarray(ids, dtype="int64"),
            "step_positions": np.asarray(positions[:kept], dtype="int64"),
            "step_labels": np.asarray(labels[:kept], dtype="float32"),
        }

    def get_collator(self, return_tensors: str = "pd") -> "ProcessRewardCollator":
        return ProcessRewardCollator(self._pad_token_id(), return_tensors)


class ProcessRewardCollator(CollatorBase):
    """Right-pads to the batch's longest: `input_ids [B, L]`, `attention_mask [B, L]`,
    `step_positions [B, S]` (0 on padding), `step_labels [B, S]`, `step_mask [B, S]` (1 on real steps)."""

    def __call__(self, samples: List[dict]) -> dict:
        import paddle

        ids = [s["input_ids"] for s in samples]
        steps = [s["step_positions"] for s in samples]
        labels = right_padding([s["step_labels"] for s in samples], 0.0, dtype="float32")
        return {
            "input_ids": self._tensor(right_padding(ids, self.pad_token_id)),
            "attention_mask": self._tensor(right_padding([np.ones(len(x), dtype="int64") for x in ids], 0)),
            "step_positions": self._tensor(right_padding(steps, 0)),
            "step_labels": paddle.to_tensor(labels) if self.return_tensors == "pd" else labels,
            "step_mask": self._tensor(right_padding([np.ones(len(x), dtype="int64") for x in steps], 0)),
        }
