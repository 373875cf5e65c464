"""Raw readers of non-pairwise preference data: ranked lists and unpaired binary feedback.

- `paddlenlp-ranked`: PaddleNLP's DPO format (`src`, `tgt`, `response`, `sort`) with
  k >= 2 responses and one numeric rank each (larger = better, PaddleNLP's convention);
  samples get `answers = response`, `answer_scores = sort`.
- `paddlenlp-unpaired`: PaddleNLP's KTO records with one response and one label in `sort`
  (`[1]` desirable, `[0]` undesirable); samples get `answer`, `desirable`.
- `trl-unpaired` (alias `trl-kto`): TRL's unpaired format, `{"prompt": str, "completion": str,
  "label": bool}`; samples get `input`, `answer`, `desirable`.

Our `json` reader takes the same sample fields directly (`answers` + `answer_scores`, or
`answer` + `desirable`). `ranked_fields` checks a ranked record's fields for every reader.
"""
from __future__ import annotations

from typing import List, Tuple

from .base import RawSample
from .paddlenlp_dpo import paddlenlp_prompt_sample
from .readers import LocalFileDataset, Record

__all__ = ["PaddleNLPRankedDataset", "PaddleNLPUnpairedDataset", "TRLUnpairedDataset", "ranked_fields", "numeric_list"]


def numeric_list(record: Record, field: str, length: int) -> List[float]:
    """`field` as a list of `length` numbers (booleans refused), or a `DataError` naming it."""
    values = record.get(field, (list,))
    if len(values) != length or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise record.error(f"expected {length} numbers (one per answer), got {values!r}", field)
    return [float(v) for v in values]


def ranked_fields(record: Record, answers_field: str, scores_field: str) -> Tuple[List[str], List[float]]:
    """`(answers, scores)` of a ranked record: k >= 2 non-empty answers, k numeric scores,
    not all equal (else no preference); a `DataError` naming the field otherwise."""
    answers = record.get_str_list(answers_field)
    if len(answers) < 2:
        raise record.error(f"a ranked record needs k >= 2 answers, got {len(answers)}", answers_field)
    for i, text in enumerate(answers):
        if not text.strip():
            raise record.error(f"answer {i} is empty", answers_field)
    scores = numeric_list(record, scores_field, len(answers))
    if len(set(scores)) == 1:
        raise record.error(f"all {len(scores)} scores are equal ({scores[0]!r}): no preference", scores_field)
    return answers, scores


class PaddleNLPRankedDataset(LocalFileDataset):
    NAME = "paddlenlp-ranked"
    ALIASES = ("paddlenlp-listwise",)
    FIELD_ROLES = {"prompt": "src"}  # 'response' holds the ranked answers

    def convert(self, record: Record) -> RawSample:
        sample = paddlenlp_prompt_sample(record)
        answers, scores = ranked_fields(record, "response", "sort")
        sample.update(answers=answers, answer_scores=scores)
        return sample


class PaddleNLPUnpairedDataset(LocalFileDataset):
    NAME = "paddlenlp-unpaired"
    ALIASES = ("paddlenlp-kto-unpaired",)
    FIELD_ROLES = {"prompt": "src"}  # the judged answer is no reference answer

    def convert(self, record: Record) -> RawSample:
        sample = paddlenlp_prompt_sample(record)
        response = record.get_str_list("response", allow_str=True)
        if len(response) != 1 or not response[0].strip():
            raise record.error(f"expected one non-empty response, got {response!r}", "response")
        label = record.get("sort", (list, int))
        label = label if isinstance(label, list) else [label]
        if len(label) != 1 or label[0] not in (0, 1) or isinstance(label[0], bool):
            raise record.error(f"expected the label [1] (desirable) or [0] (undesirable), got {label!r}", "sort")
        sample.update(answer=response[0], desirable=label[0] == 1)
        return sample


class TRLUnpairedDataset(LocalFileDataset):
    NAME = "trl-unpaired"
    ALIASES = ("trl-kto",)
    FIELD_ROLES = {"prompt": "prompt"}  # the judged completion is no reference answer

    def convert(self, record: Record) -> RawSample:
        prompt = record.get_str("prompt", nonempty=True)
        completion = record.get_str("completion", nonempty=True)
        return RawSample(input=prompt, answer=completion, desirable=record.get_bool("label"))
