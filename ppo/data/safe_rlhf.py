"""PKU-SafeRLHF-schema preference data read from local files.

Record schema (one JSON object per record)::

    {"prompt": str, "response_0": str, "response_1": str,
     "better_response_id": 0|1, "safer_response_id": 0|1,
     "is_response_0_safe": bool, "is_response_1_safe": bool}

Every variant yields, as safe-rlhf does, `input=prompt`, `answer=response_0`,
`other_answer=response_1`, `better = better_response_id == 0` and, when the record
has them, `safer = safer_response_id == 0`, `is_safe`, `is_other_safe`.

- helpful variants (`PKU-SafeRLHF/train`, `PKU-SafeRLHF/test`) need only
  `prompt, response_0, response_1, better_response_id` (the safety fields are
  checked when present);
- safety variants (`PKU-SafeRLHF/safety`, `PKU-SafeRLHF/safety/test`) need the
  safety fields too and reject a record whose safer response is flagged unsafe
  while the other one is safe.

The `/test` names differ only in the split taken from a `DatasetDict`
directory or the `test.jsonl` looked for in a plain directory.
"""
from __future__ import annotations

from .base import RawSample
from .readers import LocalFileDataset, Record

__all__ = [
    "SafeRLHFDataset",
    "SafeRLHFTrainDataset",
    "SafeRLHFTestDataset",
    "SafeRLHFSafetyDataset",
    "SafeRLHFSafetyTrainDataset",
    "SafeRLHFSafetyTestDataset",
]


class SafeRLHFDataset(LocalFileDataset):
    """Base of the PKU-SafeRLHF variants (unregistered: no NAME)."""

    REQUIRE_SAFETY = False
    SAFETY_LABELS = "optional"
    FIELD_ROLES = {"prompt": "prompt"}  # two responses (response_0, response_1): no single response field

    def convert(self, record: Record) -> RawSample:
        prompt = record.get_str("prompt", nonempty=True, what="prompt")
        response_0 = record.get_str("response_0")
        response_1 = record.get_str("response_1")
        better_id = record.get_choice("better_response_id", (0, 1))
        safety = self.REQUIRE_SAFETY
        safer_id = record.get_choice("safer_response_id", (0, 1), required=safety)
        is_safe_0 = record.get_bool("is_response_0_safe", required=safety)
        is_safe_1 = record.get_bool("is_response_1_safe", required=safety)
        sample = RawSample(input=prompt, answer=response_0, other_answer=response_1, better=better_id == 0)
        if safer_id is not None:
            sample["safer"] = safer_id == 0
        if is_safe_0 is not None:
            sample["is_safe"] = is_safe_0
        if is_safe_1 is not None:
            sample["is_other_safe"] = is_safe_1
        if safety:
            safer_safe, other_safe = (is_safe_0, is_safe_1) if safer_id == 0 else (is_safe_1, is_safe_0)
            if other_safe and not safer_safe:
                raise record.error(
                    f"response_{safer_id} is marked safer but flagged unsafe while the other response is safe",
                    "safer_response_id",
                )
        return sample


class SafeRLHFTrainDataset(SafeRLHFDataset):
    NAME = "PKU-SafeRLHF/train"
    ALIASES = (
        "PKU-SafeRLHF", "safe-rlhf", "PKU-Alignment/PKU-SafeRLHF", "PKU-Alignment/PKU-SafeRLHF/train",
        "PKU-SafeRLHF-30K/train", "PKU-SafeRLHF-10K/train",  # safe-rlhf's subsets: same schema
    )
    SPLIT = "train"


class SafeRLHFTestDataset(SafeRLHFDataset):
    NAME = "PKU-SafeRLHF/test"
    ALIASES = ("safe-rlhf/test", "PKU-Alignment/PKU-SafeRLHF/test", "PKU-SafeRLHF-30K/test")
    SPLIT = "test"


class SafeRLHFSafetyTrainDataset(SafeRLHFDataset):
    NAME = "PKU-SafeRLHF/safety"
    ALIASES = ("PKU-SafeRLHF/safety/train", "safe-rlhf/safety")
    SPLIT = "train"
    REQUIRE_SAFETY = True
    SAFETY_LABELS = "required"


class SafeRLHFSafetyTestDataset(SafeRLHFDataset):
    NAME = "PKU-SafeRLHF/safety/test"
    ALIASES = ("safe-rlhf/safety/test",)
    SPLIT = "test"
    REQUIRE_SAFETY = True
    SAFETY_LABELS = "required"


SafeRLHFSafetyDataset = SafeRLHFSafetyTrainDataset
