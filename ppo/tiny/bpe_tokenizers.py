"""Qwen2- and Llama-3-style byte-level BPE tokenizers trained locally, with no download.

Both are trained with the `tokenizers` library on text this package ships (a short
English passage, chat-template words, and seeded demo-task strings from
`ppo.tiny.demo_data`), pre-tokenised with the same regular expression the real
tokenizer uses, and saved in the layout PaddleNLP's `AutoTokenizer.from_pretrained`
loads:

- Qwen2 style (`build_qwen2_tokenizer`): `vocab.json` + `merges.txt` +
  `tokenizer_config.json` (`"tokenizer_class": "Qwen2Tokenizer"`, the ChatML chat
  template), loaded as `paddlenlp.transformers.Qwen2Tokenizer`. Special tokens follow
  the BPE vocabulary as in Qwen2.5: `<|endoftext|>` (pad), `<|im_start|>`,
  `<|im_end|>` (EOS, ends every assistant turn).
- Llama-3 style (`build_llama3_tokenizer`): the tiktoken rank file `tokenizer.model`
  (base64 token, rank per line) + `tokenizer_config.json`
  (`"tokenizer_class": "Llama3Tokenizer"`, the Llama-3 chat template), loaded as
  `paddlenlp.transformers.Llama3Tokenizer`, which appends Llama 3's 256 special tokens
  (`<|begin_of_text|>`, `<|end_of_text|>`, `<|start_header_id|>`, `<|end_header_id|>`,
  `<|eot_id|>`, reserved ones) after the ranks. EOS is `<|eot_id|>` (ends every
  assistant turn, as Llama-3-Instruct), pad `<|end_of_text|>`.

The vocabulary is small (at most `vocab_size` BPE tokens); a model built for it keeps the
real embedding size (151,936 / 128,256) with the tokenizer's ids as a prefix, as
Qwen pads its embedding (`ppo.tiny.factory`).

CLI: `python -m ppo.tiny.bpe_tokenizers --style qwen2 --output_dir models/qwen2_tok`
"""
import argparse
import base64
import json
import os

from . import demo_data
from .family_chat import FAMILY_CHAT, QWEN3_ADDED, QWEN3_TEMPLATE, add_family_chat, write_chat_template

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

QWEN2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Qwen2.5-Instruct's template, without tool calls: a default system turn, then
# `<|im_start|>{role}\n{content}<|im_end|>\n` per message.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2.5-Instruct's template with its tool slot (`tools`: function schemas listed in the system
# turn; a "tool" message rendered as a user turn in <tool_response> tags). Without tools it
# renders exactly as CHATML_TEMPLATE.
QWEN25_TOOL_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN25_TOOL_TOKENS = ("<tool_call>", "</tool_call>")

# Llama-3-Instruct's template: `<|begin_of_text|>` once, then
# `<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>` per message.
LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

ENGLISH_TEXT = """\
The toolkit trains language models to follow instructions. First a model learns from
demonstrations, then a reward model learns which of two answers people prefer, and
finally reinforcement learning moves the policy towards answers with higher reward.
A reward that cannot be computed is an error, never a silent zero. Every run writes
its metrics, its resolved arguments and its checkpoints into the output directory.
You are a helpful assistant. Please answer the question below in one sentence.
What is the capital of France? The capital of France is Paris. How many days are in
a week? There are seven days in a week. Write the numbers from one to ten: 1 2 3 4 5
6 7 8 9 10. Reverse the string and answer with the reversed string only.
The system, the user and the assistant take turns; each message ends with a marker.
It's a test, isn't it? We'll see, they've said, I'd think, you're right, I'm here.
Symbols: ( ) [ ] { } < > / + - * = _ ' " # @ % & | ~ ^ $ ; : , . ! ?
"""


def training_corpus(seed=0, num_demo=400):
    """Lines the tokenizers are trained on: the English passage, chat-template words and
    `num_demo` seeded reversal prompts with their answers (deterministic for a seed)."""
    import random

    rng = random.Random(seed)
    lines = ENGLISH_TEXT.splitlines()
    lines += ["system user assistant", "USER: ASSISTANT: Reverse:"]
    for s in demo_data.sample_unique_strings(rng, num_demo):
        lines.append(demo_data.reverse_prompt(s) + " " + demo_data.correct_answer(s))
    return lines


def train_byte_level_bpe(lines, vocab_size, pattern):
    """Train a byte-level BPE on `lines`; returns `(vocab {token: id}, merges [(a, b)])`.

    The 256 byte symbols come first, then one token per merge in merge order, so the
    ids are ranks (what tiktoken's rank file needs). No special tokens are included.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
        min_frequency=1,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    state = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    vocab = dict(sorted(state["vocab"].items(), key=lambda kv: kv[1]))
    return vocab, merges


def _byte_decoder():
    """GPT-2's printable-unicode -> byte map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)


def build_qwen2_tokenizer(output_dir, vocab_size=1024, seed=0, tool_calls=False, qwen3=False):
    """Write a Qwen2-style tokenizer into `output_dir`; returns it loaded by `AutoTokenizer`.

    Ids: BPE tokens `0 .. V-1`, then `<|endoftext|>` = V, `<|im_start|>` = V+1,
    `<|im_end|>` = V+2 (as Qwen2.5: 151,643 / 151,644 / 151,645). `tool_calls`: Qwen2.5's
    template with its tool slot (QWEN25_TOOL_TEMPLATE) and `<tool_call>` = V+3, `</tool_call>`
    = V+4 as added, non-special tokens (Qwen2.5's 151,657 / 151,658). `qwen3`: Qwen3's tokenizer
    (Qwen3-0.6B / Qwen3-30B-A3B: the same BPE pattern and special tokens) with its template
    (`ppo.tiny.family_chat.QWEN3_TEMPLATE`) and its non-special added tokens `<think>`, `</think>`,
    `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` from V+3 on.
    """
    from paddlenlp.transformers import AutoTokenizer

    os.makedirs(output_dir, exist_ok=True)
    vocab, merges = train_byte_level_bpe(training_corpus(seed), vocab_size, QWEN2_PATTERN)
    _write_json(os.path.join(output_dir, "vocab.json"), vocab)
    with open(os.path.join(output_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    n = len(vocab)
    if qwen3 and tool_calls:
        raise ValueError("build_qwen2_tokenizer: qwen3 has its own tool tokens; tool_calls is for Qwen2.5's")
    added_plain = QWEN3_ADDED if qwen3 else QWEN25_TOOL_TOKENS if tool_calls else ()
    tokens = [(t, True) for t in QWEN2_SPECIALS] + [(t, False) for t in added_plain]
    added = {
        str(n + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": sp}
        for i, (t, sp) in enumerate(tokens)
    }
    _write_json(
        os.path.join(output_dir, "tokenizer_config.json"),
        {
            "tokenizer_class": "Qwen2Tokenizer",
            "added_tokens_decoder": added,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"] + (list(QWEN25_TOOL_TOKENS) if tool_calls else []),
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "errors": "replace",
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
            "model_max_length": 32768,
            "padding_side": "left",
            "chat_template": QWEN3_TEMPLATE if qwen3 else QWEN25_TOOL_TEMPLATE if tool_calls else CHATML_TEMPLATE,
        },
    )
    return AutoTokenizer.from_pretrained(output_dir)


def build_llama3_tokenizer(output_dir, vocab_size=1024, seed=0):
    """Write a Llama-3-style tokenizer into `output_dir`; returns it loaded by `AutoTokenizer`.

    Ids: ranks `0 .. V-1` of `tokenizer.model`, then Llama 3's 256 special tokens in
    their order (`<|begin_of_text|>` = V, `<|end_of_text|>` = V+1, ...,
    `<|eot_id|>` = V+9), as Llama 3's 128,000 ranks + 256 specials = 128,256.
    """
    from paddlenlp.transformers import AutoTokenizer

    os.makedirs(output_dir, exist_ok=True)
    vocab, _ = train_byte_level_bpe(training_corpus(seed), vocab_size, LLAMA3_PATTERN)
    byte_of = _byte_decoder()
    with open(os.path.join(output_dir, "tokenizer.model"), "w", encoding="utf-8") as f:
        for token, rank in vocab.items():
            raw = bytes(byte_of[c] for c in token)
            f.write(base64.b64encode(raw).decode("ascii") + f" {rank}\n")
    _write_json(
        os.path.join(output_dir, "tokenizer_config.json"),
        {
            "tokenizer_class": "Llama3Tokenizer",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "pad_token": "<|end_of_text|>",
            "add_bos_token": False,
            "add_eos_token": False,
            "model_max_length": 8192,
            "padding_side": "left",
            "chat_template": LLAMA3_TEMPLATE,
        },
    )
    return AutoTokenizer.from_pretrained(output_dir)


def build_ernie45_tokenizer(output_dir, vocab_size=1024, seed=0):
    """Write an ERNIE-4.5-style tokenizer into `output_dir`; returns it loaded by `AutoTokenizer`.

    ERNIE 4.5's tokenizer is a SentencePiece BPE model (``tokenizer.model``) with byte fallback:
    here one of at most `vocab_size` pieces trained on `training_corpus`, ``\\n`` one piece, wrapped
    as PaddleNLP's `LlamaTokenizer` (PaddleNLP 3.0.0b4 has no ERNIE 4.5 tokenizer class). Ids
    ``<unk>`` 0 (also the pad token, as ERNIE-4.5-0.3B's ``pad_token_id`` 0), ``<s>`` 1, ``</s>``
    2 (EOS), then the pieces, then ``<|begin_of_sentence|>`` / ``<|end_of_sentence|>`` (its
    ``cls_token`` / ``sep_token``) and its chat template (`ppo.tiny.family_chat`).
    """
    import io
    import tempfile

    import sentencepiece as spm
    from paddlenlp.transformers import AutoTokenizer, LlamaTokenizer

    os.makedirs(output_dir, exist_ok=True)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_corpus(seed)), model_writer=buf, model_type="bpe", vocab_size=vocab_size,
        hard_vocab_limit=False, byte_fallback=True, user_defined_symbols=["\n"], unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, add_dummy_prefix=False, remove_extra_whitespaces=False, normalization_rule_name="identity",
        character_coverage=1.0, minloglevel=2, num_threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = os.path.join(tmp, "tokenizer.model")
        with open(vocab_file, "wb") as f:
            f.write(buf.getvalue())
        tokenizer = LlamaTokenizer(vocab_file=vocab_file, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<unk>", add_bos_token=False, add_eos_token=False, padding_side="left")
        add_family_chat(tokenizer, "ernie45")
        tokenizer.save_pretrained(output_dir)
    write_chat_template(output_dir, FAMILY_CHAT["ernie45"][0])
    return AutoTokenizer.from_pretrained(output_dir)


BUILDERS = {"qwen2": build_qwen2_tokenizer, "llama3": build_llama3_tokenizer, "ernie45": build_ernie45_tokenizer,
            "qwen3": lambda output_dir, **kw: build_qwen2_tokenizer(output_dir, qwen3=True, **kw)}


def build_tokenizer(style, output_dir, vocab_size=1024, seed=0):
    """The builder of `style` (`BUILDERS`): qwen2, qwen3 (`build_qwen2_tokenizer` with ``qwen3``),
    llama3 or ernie45."""
    if style not in BUILDERS:
        raise ValueError(f"unknown tokenizer style {style!r}; choose one of {sorted(BUILDERS)}")
    return BUILDERS[style](output_dir, vocab_size=vocab_size, seed=seed)


def main(argv=None):
    from ..common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--style", required=True, choices=sorted(BUILDERS))
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--vocab_size", type=int, default=1024, help="most BPE tokens (bytes + merges) before the special tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tok = build_tokenizer(args.style, args.output_dir, args.vocab_size, args.seed)
    print(json.dumps({"output_dir": args.output_dir, "class": type(tok).__name__, "len": len(tok)}))


if __name__ == "__main__":
    main()
