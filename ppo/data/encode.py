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


def encode_exact(tokenizer: Any, text: str) -> List[int]:
    """The ids of `text` (no special tokens added) as a Hugging Face tokenizer gives them when its
    added tokens keep the whitespace next to them (``lstrip``/``rstrip`` false, as Qwen2's and
    Llama 3's do; what an inference server sees): the text split at the added tokens, each piece
    between them tokenised whole. PaddleNLP's `tokenize` strips the whitespace on both sides of a
    special token unless it was added as an `AddedToken` saying otherwise (`<|im_end|>\\n<|im_start|>`
    loses its newline); here only an explicit ``lstrip``/``rstrip`` strips. Tokenizers that do not
    use that `tokenize` (e.g. PaddleNLP's tiktoken-based Llama 3 one, which keeps the whitespace)
    are called as usual. Added tokens that are not special stay whole when the tokenizer was
    loaded with `ppo.models.basics.load_tokenizer` (its `tokenize` an `AddedTokensWhole`)."""
    whole = getattr(tokenizer.tokenize, "added", None)
    if whole:
        pieces = [p for p in tokenizer.tokenize.pattern.split(text) if p]
        return [i for p in pieces for i in (tokenizer.convert_tokens_to_ids([p]) if p in whole else _encode_exact(tokenizer, p))]
    return _encode_exact(tokenizer, text)


def _encode_exact(tokenizer: Any, text: str) -> List[int]:
    if not _base_tokenize(tokenizer):
        return encode_text(tokenizer, text, add_special_tokens=False)
    from paddlenlp.transformers.tokenizer_utils_base import AddedToken

    trie = tokenizer.tokens_trie

    text, _ = tokenizer.prepare_for_tokenization(text)
    no_split = set(tokenizer.unique_no_split_tokens)
    flagged = {str(t): t for t in tokenizer.all_special_tokens_extended if isinstance(t, AddedToken)}
    pieces = trie.split(text)
    for i, piece in enumerate(pieces):
        token = flagged.get(piece) if piece in no_split else None
        if token is not None and token.rstrip and i + 1 < len(pieces):
            pieces[i + 1] = pieces[i + 1].lstrip()
        if token is not None and token.lstrip and i > 0:
            pieces[i - 1] = pieces[i - 1].rstrip()
    tokens = []
    for piece in pieces:
        if piece:
            tokens.extend([piece] if piece in no_split else tokenizer._tokenize(piece))
    return list(tokenizer.convert_tokens_to_ids(tokens))


def _base_tokenize(tokenizer: Any) -> bool:
    """True when `tokenizer` is a PaddleNLP slow tokenizer whose `tokenize` is the library's own
    (the one that strips whitespace next to special tokens) over a `_tokenize` of its own."""
    if not _plain_encode(tokenizer) or getattr(tokenizer, "tokens_trie", None) is None:
        return False
    from paddlenlp.transformers.tokenizer_utils import PretrainedTokenizer

    cls = type(tokenizer)
    return cls.tokenize is PretrainedTokenizer.tokenize and cls._tokenize is not PretrainedTokenizer._tokenize
