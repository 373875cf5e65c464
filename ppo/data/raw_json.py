"""Generic local data whose records already use the `RawSample` field names.

Record fields: `input` (string, or list of user turns) and/or `dialogue`
(alternating user/assistant turns ending with a user turn), optional `answer`,
`other_answer`, `label` (strings) and `better`, `safer`, `is_safe`,
`is_other_safe`, `desirable` (booleans); a ranked record gives `answers` (k >= 2 strings)
with `answer_scores` (k numbers, higher = better). Other fields are ignored (logged once).
"""
from __future__ import annotations

from .base import RawSample, _logger
from .feedback_formats import ranked_fields
from .readers import LocalFileDataset, Record

__all__ = ["RawJsonDataset"]

STR_FIELDS = ("answer", "other_answer", "label")
BOOL_FIELDS = ("better", "safer", "is_safe", "is_other_safe", "desirable")
KNOWN_FIELDS = {"input", "dialogue", "answers", "answer_scores", *STR_FIELDS, *BOOL_FIELDS}


class RawJsonDataset(LocalFileDataset):
    NAME = "json"
    ALIASES = ("raw-json",)
    SAFETY_LABELS = "optional"
    FIELD_ROLES = {"prompt": "input"}  # answer and label are both answers here: no single response field

    def __init__(self, path=None, split=None, prompt_key=None, response_key=None, stream=False) -> None:
        self._unknown = set()
        super().__init__(path, split, prompt_key=prompt_key, response_key=response_key, stream=stream)
        if self._unknown:
            _logger().warning(f"{self.path}: ignored field(s) {sorted(self._unknown)} (not RawSample fields)")

    def convert(self, record: Record) -> RawSample:
        self._unknown.update(set(record.data) - (KNOWN_FIELDS - set(record.keys)) - set(record.keys.values()))
        sample = RawSample()
        dialogue = record.get_str_list("dialogue", required=False)
        inp = record.get("input", (str, list), required=dialogue is None)
        prompt_field = "input" if inp is not None else "dialogue"
        if isinstance(inp, list):
            inp = record.get_str_list("input")
        if dialogue is not None:
            if len(dialogue) % 2 != 1:
                raise record.error(
                    f"expected alternating user/assistant turns ending with a user turn (odd length), got {len(dialogue)}",
                    "dialogue",
                )
            users = dialogue[::2]
            if inp is None:
                inp = users if len(users) > 1 else users[0]
            elif (inp if isinstance(inp, list) else [inp]) not in (users, users[-1:]):
                raise record.error("'input' disagrees with the user turns of 'dialogue'", "input")
            sample["dialogue"] = dialogue
        elif isinstance(inp, list) and len(inp) > 1:
            raise record.error("a multi-turn 'input' needs 'dialogue' with the assistant turns", "dialogue")
        turns = inp if isinstance(inp, list) else [inp]
        if not turns or any(not t.strip() for t in turns):
            raise record.error("empty prompt", prompt_field)
        sample["input"] = inp
        for field in STR_FIELDS:
            value = record.get_str(field, required=False)
            if value is not None:
                sample[field] = value
        for field in BOOL_FIELDS:
            value = record.get_bool(field, required=False)
            if value is not None:
                sample[field] = value
        if record.has("answers") or record.has("answer_scores"):
            sample["answers"], sample["answer_scores"] = ranked_fields(record, "answers", "answer_scores")
        return sample
