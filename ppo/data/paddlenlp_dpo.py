"""PaddleNLP's DPO/KTO preference format (`llm/alignment/dpo` data), read from local files.

Record schema (one JSON object a line)::

    {"src": str | [str, ...], "tgt": str | [str, ...], "response": [str, str], "sort": [int, int]}

- `src`: the user turns; `tgt`: the assistant turns between them (one fewer than
  `src`; `[]` or `""`-free single-turn records give `"tgt": []`);
- `response`: two answers to the final user turn, neither empty;
- `sort`: their ranks; the answer with the larger rank is the better one (PaddleNLP's
  `preprocess_preference_data`), so the two ranks must differ.

Samples: `input` (the user turns), `dialogue` for multi-turn records,
`answer = response[0]`, `other_answer = response[1]`, `better = sort[0] > sort[1]`.
A record with one response (PaddleNLP's unpaired KTO data) or more than two is refused
here: read those as `paddlenlp-unpaired` / `paddlenlp-ranked` (`ppo/data/feedback_formats.py`).
"""
from __future__ import annotations

from .base import RawSample
from .readers import LocalFileDataset, Record

__all__ = ["PaddleNLPPreferenceDataset", "paddlenlp_prompt_sample"]


def paddlenlp_prompt_sample(record: Record) -> RawSample:
    """The prompt of a PaddleNLP record (`src` user turns, `tgt` the assistant turns between
    them): `input`, plus `dialogue` for multi-turn records."""
    src = record.get_user_turns("src")
    tgt = record.get_str_list("tgt", required=False, allow_str=True) or []
    if len(tgt) != len(src) - 1:
        raise record.error(f"expected {len(src) - 1} assistant turns (one fewer than {record.key('src')!r}), got {len(tgt)}", "tgt")
    if len(src) == 1:
        return RawSample(input=src[0])
    dialogue = []
    for user, assistant in zip(src[:-1], tgt):
        dialogue += [user, assistant]
    dialogue.append(src[-1])
    return RawSample(input=list(src), dialogue=dialogue)


class PaddleNLPPreferenceDataset(LocalFileDataset):
    NAME = "paddlenlp-dpo"
    ALIASES = ("paddlenlp-preference", "paddlenlp-kto")
    FIELD_ROLES = {"prompt": "src"}  # 'response' holds the two answers compared

    def convert(self, record: Record) -> RawSample:
        sample = paddlenlp_prompt_sample(record)
        response = record.get_str_list("response")
        if len(response) != 2:
            raise record.error(
                f"expected 2 responses, got {len(response)} (unpaired KTO records: read them as 'paddlenlp-unpaired'; "
                "k > 2 ranked responses: 'paddlenlp-ranked')", "response"
            )
        for i, text in enumerate(response):
            if not text.strip():
                raise record.error(f"response {i} is empty", "response")
        sort = record.get("sort", (list,))
        if len(sort) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in sort):
            raise record.error(f"expected two numeric ranks, got {sort!r}", "sort")
        if sort[0] == sort[1]:
            raise record.error(f"the two ranks are equal ({sort[0]!r}): no preference", "sort")
        sample.update(answer=response[0], other_answer=response[1], better=sort[0] > sort[1])
        return sample
