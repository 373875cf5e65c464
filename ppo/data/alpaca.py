"""Alpaca-schema instruction data read from local files.

Record schema: `{"instruction": str, "input": str (optional), "output": str}`.
The sample's `input` is the instruction, followed by a newline and the record's
`input` when that is non-empty; `answer` is `output`.
"""
from __future__ import annotations

from .base import RawSample
from .readers import LocalFileDataset, Record

__all__ = ["AlpacaDataset"]


class AlpacaDataset(LocalFileDataset):
    NAME = "alpaca"
    ALIASES = ("stanford-alpaca", "tatsu-lab/alpaca")
    FIELD_ROLES = {"prompt": "instruction", "response": "output"}
    SEPARATOR = "\n"
    """Between the instruction and a non-empty input (safe-rlhf's own alpaca uses a space)."""

    def convert(self, record: Record) -> RawSample:
        instruction = record.get_str("instruction", nonempty=True, what="prompt (instruction)")
        extra = record.get_str("input", required=False, default="")
        output = record.get_str("output")
        prompt = instruction + self.SEPARATOR + extra if extra.strip() else instruction
        return RawSample(input=prompt, answer=output)
