"""`encode_text` gives exactly `tokenizer(text)["input_ids"]`, on the fast path (PaddleNLP slow
tokenizers) and on the fallback (any tokenizer that changes the call)."""
import pytest

from conftest_data import tiny_tokenizer  # noqa: F401
from ppo.data.encode import encode_text

TEXTS = [
    "USER: Reverse: 49jc9c ASSISTANT:", "c9cj94", "", " ", "a  b", "USER: </s> x <s> ASSISTANT:",
    "é 中文 ☃", "x" * 3000, "line\nbreak\ttab",
]


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tiny_llama_tokenizer_matches_the_call(tiny_tokenizer, add_special_tokens):  # noqa: F811
    for text in TEXTS:
        expected = list(tiny_tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
        assert encode_text(tiny_tokenizer, text, add_special_tokens) == expected, text
    assert tiny_tokenizer._ppo_plain_encode is True  # the fast path was the one taken
    assert encode_text(tiny_tokenizer, "ab")[0] == tiny_tokenizer.bos_token_id


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_bpe_tokenizers_match_the_call(tmp_path, style):
    from ppo.tiny.bpe_tokenizers import build_tokenizer

    tokenizer = build_tokenizer(style, str(tmp_path), vocab_size=300)
    for add in (True, False):
        for text in TEXTS:
            assert encode_text(tokenizer, text, add) == list(tokenizer(text, add_special_tokens=add)["input_ids"]), text


def test_a_tokenizer_that_overrides_the_call_is_called(tiny_tokenizer):  # noqa: F811
    base = type(tiny_tokenizer)

    class Marked(base):
        def __call__(self, text, **kwargs):
            out = base.__call__(self, text, **kwargs)
            out["input_ids"] = [7] + list(out["input_ids"])
            return out

    marked = Marked.from_pretrained(tiny_tokenizer.name_or_path)
    assert encode_text(marked, "ab", add_special_tokens=False) == [7] + list(tiny_tokenizer("ab", add_special_tokens=False)["input_ids"])
    assert marked._ppo_plain_encode is False


def test_a_plain_callable_is_called():
    class Whitespace:
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": ([0] if add_special_tokens else []) + [len(w) for w in text.split()]}

    assert encode_text(Whitespace(), "ab cde") == [0, 2, 3]
    assert encode_text(Whitespace(), "ab cde", add_special_tokens=False) == [2, 3]
