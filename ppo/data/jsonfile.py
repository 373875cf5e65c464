"""PaddleNLP's `Jsonfile` data (`{"src": [...], "tgt": [...]}`, as its ppo-kk data).

- `src`: the user turns (a list of strings, or one string);
- `tgt`: the assistant turns, a list of the same length as `src` (or one string
  when `src` is one string); it may be one shorter than `src` or left out for a
  single-turn record, making a prompt-only record without an answer.

Samples: single turn `input=src[0]`; multi-turn `input=src` (the user turns) and
`dialogue=[src0, tgt0, ..., src[-1]]`. When the final answer exists,
`answer = label = tgt[-1]` (the label is the reference a reward server checks). The record's
other fields (test cases, a database id, `env_name`, `env_kwargs`, `extra_info`) are kept as
`extra`: a multi-turn run's `env.reset` receives them (docs/agents.md).
"""
from __future__ import annotations

from .base import RawSample
from .readers import LocalFileDataset, Record

__all__ = ["JsonDataset"]


class JsonDataset(LocalFileDataset):
    NAME = "Jsonfile"
    ALIASES = ("jsonfile", "json-src-tgt")
    FIELD_ROLES = {"prompt": "src", "response": "tgt"}

    def __init__(self, path=None, split=None, use_rm_server: bool = False, prompt_key=None, response_key=None,
                 stream=False) -> None:
        """`use_rm_server=True` (PaddleNLP's flag) requires every record to carry its `tgt`;
        `prompt_key` / `response_key` read `src` / `tgt` from other fields (PaddleNLP's names)."""
        self.use_rm_server = use_rm_server
        super().__init__(path, split, prompt_key=prompt_key, response_key=response_key, stream=stream)

    def convert(self, record: Record) -> RawSample:
        src = record.get_user_turns("src")
        tgt = record.get_str_list("tgt", required=self.use_rm_server or len(src) > 1, allow_str=True)
        if tgt is not None and len(tgt) not in (len(src), len(src) - 1):
            raise record.error(f"expected {len(src)} assistant turns (one per {record.key('src')!r} turn), got {len(tgt)}", "tgt")
        if len(src) == 1:
            sample = RawSample(input=src[0])
        else:
            dialogue = []
            for i, user in enumerate(src[:-1]):
                dialogue += [user, tgt[i]]
            dialogue.append(src[-1])
            sample = RawSample(input=list(src), dialogue=dialogue)
        if tgt is not None and len(tgt) == len(src):
            sample["answer"] = tgt[-1]
            sample["label"] = tgt[-1]
        elif self.use_rm_server:
            raise record.error(f"use_rm_server needs the final answer (the last {record.key('tgt')!r} turn)", "tgt")
        extra = {k: v for k, v in record.data.items() if k not in (record.key("src"), record.key("tgt"))}
        if extra:
            sample["extra"] = extra  # the record's other fields, for a multi-turn run's environment
        return sample
