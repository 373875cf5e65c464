"""Prompt formatting, padding helpers and the collator base class of the tokenised datasets."""
from __future__ import annotations

import abc
from typing import Any, Iterable, List, Optional, Tuple

import numpy as np
import paddle

from .base import DEFAULT_TEMPLATE

# --------------------------------------------------------------------------- prompts


def _render_template(template: str, text: str) -> str:
    return template.replace("{input}", text)


def chat_template_answer_header(tokenizer: Any) -> str:
    """What the tokenizer's chat template writes between a user turn and the assistant's answer
    (ChatML: `<|im_end|>\n<|im_start|>assistant`), stripped; "" when it writes nothing there."""
    probe = tokenizer.apply_chat_template([["\x00"]], tokenize=False)
    return probe.split("\x00", 1)[1].strip() if "\x00" in probe else ""


def format_prompt(
    input: str,  # noqa: A002 - the PaddleNLP/safe-rlhf name
    tokenizer: Any = None,
    template: str = DEFAULT_TEMPLATE,
    use_chat_template: bool = False,
    history: Optional[Iterable[Tuple[str, str]]] = None,
) -> str:
    """The prompt text for the final user turn `input` after `history` `[(user, assistant), ...]`.

    With a text template (must contain `{input}`; replaced literally, so braces in
    the text are safe): each earlier pair is rendered as
    `template(user) + assistant + " "`, then `template(input)`; e.g. with
    `USER: {input} ASSISTANT:` and history `[("hi", "yo")]`:
    `USER: hi ASSISTANT:yo USER: {input} ASSISTANT:`.

    With `use_chat_template=True`: `tokenizer.apply_chat_template([[u0, a0], ..., [input]], tokenize=False)`
    (PaddleNLP's); raises ValueError if the tokenizer has no chat template.
    """
    if not isinstance(input, str):
        if isinstance(input, (list, tuple)) and len(input) == 1 and isinstance(input[0], str):
            input = input[0]  # noqa: A001
        else:
            raise TypeError(f"format_prompt: `input` must be a str (the final user turn), got {type(input).__name__}")
    pairs = [(str(u), str(a)) for u, a in (history or [])]
    if use_chat_template:
        if tokenizer is None:
            raise ValueError("format_prompt: use_chat_template=True needs the tokenizer")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"use_chat_template=True but the tokenizer ({type(tokenizer).__name__}, "
                f"{getattr(tokenizer, 'name_or_path', '?')}) has no chat template; "
                "set one (tokenizer.init_chat_template(...) or chat_template.json) or use a text template"
            )
        header = chat_template_answer_header(tokenizer)
        if header and header in input:  # e.g. PaddleNLP's ppo-kk prompts, already in ChatML
            raise ValueError(
                f"the prompt is already formatted with a chat template (it contains {header!r}); use_chat_template "
                "would template it twice: set use_chat_template false and prompt_template '{input}' to use it as it is "
                "(as PaddleNLP's RLHFDataset does)"
            )
        conversation = [[u, a] for u, a in pairs] + [[input]]
        return tokenizer.apply_chat_template(conversation, tokenize=False)
    if "{input}" not in template:
        raise ValueError(f"prompt template {template!r} has no '{{input}}' placeholder")
    buffer = [_render_template(template, u) + a + " " for u, a in pairs]
    buffer.append(_render_template(template, input))
    return "".join(buffer)


# --------------------------------------------------------------------------- padding


def right_padding(sequences: List[Any], padding_value: int = 0, dtype: str = "int64", width: Optional[int] = None) -> np.ndarray:
    """Stack 1-D sequences into `[B, T]` (T = `width` or the longest), padding on the right."""
    arrs = [np.asarray(s, dtype=dtype) for s in sequences]
    width = max((len(a) for a in arrs), default=0) if width is None else width
    out = np.full([len(arrs), width], padding_value, dtype=dtype)
    for i, a in enumerate(arrs):
        out[i, : len(a)] = a
    return out


def left_padding(sequences: List[Any], padding_value: int = 0, dtype: str = "int64", width: Optional[int] = None) -> np.ndarray:
    """Stack 1-D sequences into `[B, T]` (T = `width` or the longest), padding on the left."""
    arrs = [np.asarray(s, dtype=dtype) for s in sequences]
    width = max((len(a) for a in arrs), default=0) if width is None else width
    out = np.full([len(arrs), width], padding_value, dtype=dtype)
    for i, a in enumerate(arrs):
        if len(a):
            out[i, width - len(a) :] = a
    return out


def position_ids_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """`cumsum(mask) - 1` clipped at 0: 0, 1, 2, ... over real tokens, 0 on (left) padding."""
    return np.clip(np.cumsum(attention_mask, axis=-1) - 1, 0, None).astype("int64")


class CollatorBase(metaclass=abc.ABCMeta):
    """Pads a list of dataset items into a batch. `return_tensors`: "pd" (int64 paddle tensors) or "np"."""

    def __init__(self, pad_token_id: int, return_tensors: str = "pd") -> None:
        if return_tensors not in ("pd", "np"):
            raise ValueError(f"return_tensors must be 'pd' or 'np', got {return_tensors!r}")
        self.pad_token_id = int(pad_token_id)
        self.return_tensors = return_tensors

    def _tensor(self, array: np.ndarray):
        array = np.asarray(array, dtype="int64")
        return paddle.to_tensor(array, dtype="int64") if self.return_tensors == "pd" else array

    @abc.abstractmethod
    def __call__(self, samples: List[dict]) -> dict:
        raise NotImplementedError
