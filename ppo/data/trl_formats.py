"""TRL's dataset formats (https://huggingface.co/docs/trl/dataset_formats), read from local files.

Registered names and record schemas (one JSON object a line, or any source `readers` reads):

- `trl-preference` (aliases `trl-dpo`, `trl-rm`): `{"prompt", "chosen", "rejected"}` for the
  reward model and the DPO family; standard (strings) or conversational (lists of
  `{"role", "content"}` messages: the prompt's messages, and the chosen / rejected assistant
  messages);
- `trl-messages` (alias `trl-sft`): `{"messages": [...]}` conversations for SFT; the final
  assistant message is the answer, the messages before it the prompt;
- `trl-prompt` (alias `trl-rl`): `{"prompt"}` for PPO/GRPO (a string or messages), with an
  optional reference answer for a rule reward or reward server in `solution` or
  `ground_truth` (TRL's GRPO examples pass such columns to the reward functions).

Standard (string) prompts go through `prompt_template` like every other dataset (`{input}`
keeps the prompt as it is, as TRL does). Conversational records keep their messages; when
tokenised, `render_conversational` applies the tokenizer's Jinja chat template the way TRL's
`maybe_apply_chat_template` does: the prompt messages with `add_generation_prompt=True`, each
answer as the text the template adds after that prompt for prompt + answer messages.
"""
from __future__ import annotations

from typing import Any, List, Optional

from .base import RawSample
from .readers import LocalFileDataset, Record

__all__ = ["TRLPreferenceDataset", "TRLMessagesDataset", "TRLPromptDataset", "render_conversational"]

ROLES = ("system", "user", "assistant", "tool")
LABEL_FIELDS = ("solution", "ground_truth")


def read_messages(record: Record, field: str) -> List[dict]:
    """The message list in `field`: a non-empty list of `{"role", "content"}` with known roles."""
    messages = record.get(field, (list,))
    if not messages:
        raise record.error("empty message list", field)
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise record.error(f"message {i} is not an object with a string 'content'", field)
        if message.get("role") not in ROLES:
            raise record.error(f"message {i} has role {message.get('role')!r}; expected one of {list(ROLES)}", field)
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def read_answer_messages(record: Record, field: str) -> List[dict]:
    """An answer in conversational form: assistant messages only."""
    messages = read_messages(record, field)
    if any(m["role"] != "assistant" for m in messages):
        raise record.error("an answer holds assistant messages only", field)
    return messages


def last_user_text(messages: List[dict]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else messages[-1]["content"]


def prompt_sample(record: Record, field: str = "prompt") -> RawSample:
    """`input` for a string prompt; `input` (the last user turn) and `prompt_messages` for messages."""
    value = record.get(field, (str, list))
    if isinstance(value, str):
        if not value.strip():
            raise record.error("empty prompt", field)
        return RawSample(input=value)
    messages = read_messages(record, field)
    if messages[-1]["role"] == "assistant":
        raise record.error("the prompt ends with an assistant message; the answer goes in its own field", field)
    return RawSample(input=last_user_text(messages), prompt_messages=messages)


class TRLPreferenceDataset(LocalFileDataset):
    NAME = "trl-preference"
    ALIASES = ("trl-dpo", "trl-rm")
    FIELD_ROLES = {"prompt": "prompt"}  # chosen and rejected: no single response field

    def convert(self, record: Record) -> RawSample:
        if not record.has("prompt"):
            raise record.error("missing field (TRL's implicit-prompt format is not read here: give the prompt apart)", "prompt")
        sample = prompt_sample(record)
        conversational = "prompt_messages" in sample
        for field, key in (("chosen", "answer"), ("rejected", "other_answer")):
            if conversational:
                sample[f"{key}_messages"] = read_answer_messages(record, field)
                sample[key] = "".join(m["content"] for m in sample[f"{key}_messages"])
            else:
                sample[key] = record.get_str(field, nonempty=field == "chosen", what=f"{field} answer")  # an empty rejected answer is a real pair
        sample["better"] = True
        return sample


class TRLMessagesDataset(LocalFileDataset):
    NAME = "trl-messages"
    ALIASES = ("trl-sft",)

    def convert(self, record: Record) -> RawSample:
        messages = read_messages(record, "messages")
        if messages[-1]["role"] != "assistant":
            raise record.error("the conversation does not end with an assistant message (the answer)", "messages")
        prompt = messages[:-1]
        if not any(m["role"] == "user" for m in prompt):
            raise record.error("no user message before the final assistant message", "messages")
        return RawSample(input=last_user_text(prompt), prompt_messages=prompt, answer=messages[-1]["content"],
                         answer_messages=messages[-1:])


class TRLPromptDataset(LocalFileDataset):
    NAME = "trl-prompt"
    ALIASES = ("trl-rl",)
    FIELD_ROLES = {"prompt": "prompt", "response": LABEL_FIELDS[0]}  # response_key: the only reference field read

    def convert(self, record: Record) -> RawSample:
        sample = prompt_sample(record)
        for field in LABEL_FIELDS[:1] if record.keys.get(LABEL_FIELDS[0]) else LABEL_FIELDS:
            if record.has(field):
                sample["label"] = record.get_str(field)
                break
        return sample


def apply_template(tokenizer: Any, messages: List[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def continuation(tokenizer: Any, prompt_messages: List[dict], prompt_text: str, answer_messages: List[dict]) -> str:
    """The text the chat template adds after `prompt_text` for prompt + answer messages (TRL's way)."""
    full = apply_template(tokenizer, prompt_messages + answer_messages, add_generation_prompt=False)
    if not full.startswith(prompt_text):
        raise ValueError(
            "the chat template renders prompt + answer messages with a different beginning than the prompt with "
            "add_generation_prompt=True, so the answer cannot be cut off as a continuation"
        )
    return full[len(prompt_text):]


def render_conversational(sample: RawSample, tokenizer: Any, use_chat_template: bool) -> RawSample:
    """A conversational sample (`prompt_messages`) with `prompt_text` (the chat-templated prompt)
    and its answers rendered as continuations; other samples are returned as they are. The
    input is not modified. Conversational samples need `use_chat_template`."""
    if "prompt_messages" not in sample:
        return sample
    from jinja2 import Template

    if not use_chat_template:
        raise ValueError("conversational (TRL messages) data is rendered with the chat template: set use_chat_template true")

    if not isinstance(getattr(tokenizer, "chat_template", None), Template):
        raise ValueError(
            f"conversational (TRL messages) data needs a Jinja chat template in the tokenizer "
            f"({type(tokenizer).__name__}, {getattr(tokenizer, 'name_or_path', '?')}): set 'chat_template' in "
            "tokenizer_config.json"
        )
    rendered: RawSample = dict(sample)
    prompt_text = apply_template(tokenizer, sample["prompt_messages"], add_generation_prompt=True)
    rendered["prompt_text"] = prompt_text
    for key in ("answer", "other_answer"):
        messages: Optional[list] = sample.get(f"{key}_messages")
        if messages:
            rendered[key] = continuation(tokenizer, sample["prompt_messages"], prompt_text, messages)
    return rendered
