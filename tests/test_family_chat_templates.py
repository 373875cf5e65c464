"""Chat templates from the checkpoint's files, rendered as transformers renders them
(ppo/data/chat_templates.py): Qwen3's template (think blocks, `enable_thinking`, tools) and ERNIE
4.5's give the strings written out here; `chat_template.jinja` wins over `tokenizer_config.json`;
the run's `chat_template_kwargs` reach the data layer, the agent format and a bad one is refused
by name; the tiny Qwen3 / ERNIE 4.5 tokenizers carry their family's template and tokens."""
import json

import pytest

from ppo.common.argument_problems import ArgumentError
from ppo.data.chat_templates import compile_chat_template
from ppo.tiny.family_chat import ERNIE45_TEMPLATE, QWEN3_TEMPLATE

TOOL = {"type": "function", "function": {"name": "calc", "description": "a < b & c",
                                         "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
SYSTEM = [{"role": "system", "content": "Be brief."}]
USER = [{"role": "user", "content": "hi"}]
HISTORY = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nwhy\n</think>\n\nA"},
           {"role": "user", "content": "b"}]


def qwen3(messages, tools=None, prompt=True, **kwargs):
    return compile_chat_template(QWEN3_TEMPLATE, "qwen3", kwargs).render(
        messages=messages, tools=tools, add_generation_prompt=prompt)


def test_qwen3_plain_prompt_and_enable_thinking():
    assert qwen3(SYSTEM + USER) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert qwen3(USER, enable_thinking=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert qwen3(USER, enable_thinking=False) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_qwen3_multi_turn_drops_old_reasoning_and_keeps_the_last():
    """An assistant turn before the last user query loses its think block; the final one after it
    keeps it (from `</think>` in its content or `reasoning_content`), an empty one when it has none."""
    assert qwen3(HISTORY) == ("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                              "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n")
    last = HISTORY + [{"role": "assistant", "content": "B", "reasoning_content": "\nr\n"}]
    assert qwen3(last, prompt=False).endswith("<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nB<|im_end|>\n")
    plain = HISTORY + [{"role": "assistant", "content": "B"}]
    assert qwen3(plain, prompt=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nB<|im_end|>\n")


def test_qwen3_tools_calls_and_answers():
    """Tools in the system turn as `json.dumps` writes them (keys in order, `<` and `&` as they
    are: transformers' `tojson`, not Jinja's); a call in `<tool_call>` tags; consecutive tool
    answers in one user turn; the calling turn (not the last, no reasoning) gets no think block."""
    messages = USER + [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": {"x": 1}}}]},
                       {"role": "tool", "content": "2"}, {"role": "tool", "content": "3"}]
    text = qwen3(messages, tools=[TOOL], enable_thinking=False)
    head = ("<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
            "provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + json.dumps(TOOL) + "\n</tools>")
    assert text.startswith(head) and '"description": "a < b & c"' in text
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                         '{"name": "calc", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n2\n'
                         "</tool_response>\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_ernie45_template():
    template = compile_chat_template(ERNIE45_TEMPLATE, "ernie45")
    specials = {"cls_token": "<|begin_of_sentence|>", "sep_token": "<|end_of_sentence|>"}
    turns = SYSTEM + [{"role": "user", "content": "a"}, {"role": "assistant", "content": "A"}, {"role": "user", "content": "b"}]
    assert template.render(messages=turns, add_generation_prompt=True, **specials) == (
        "<|begin_of_sentence|>Be brief.\nUser: a\nAssistant: A<|end_of_sentence|>User: b\nAssistant: ")
    assert template.render(messages=USER, add_generation_prompt=False, **specials) == "<|begin_of_sentence|>User: hi\n"


def test_template_kwargs_the_template_does_not_read_are_refused_by_name():
    with pytest.raises(ArgumentError, match="'enable_thinkin' is not read by ernie45"):
        compile_chat_template(ERNIE45_TEMPLATE, "ernie45", {"enable_thinkin": False})
    with pytest.raises(ArgumentError, match="'add_generation_prompt' is set by each render"):
        compile_chat_template(QWEN3_TEMPLATE, "qwen3", {"add_generation_prompt": True})


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    from ppo.tiny.factory import build_tokenizer

    path = str(tmp_path_factory.mktemp("tiny_qwen3_tok"))
    build_tokenizer(path, arch="qwen3")
    return path


def test_tiny_qwen3_tokenizer_has_the_template_and_whole_tokens(qwen3_dir, tmp_path):
    from ppo.models.basics import load_tokenizer

    tok = load_tokenizer(qwen3_dir)
    assert tok.chat_template.source == QWEN3_TEMPLATE
    ids = tok("<think>\n\n</think><|im_end|><tool_call>", add_special_tokens=False)["input_ids"]
    assert [tok.convert_ids_to_tokens(i) for i in ids] == ["<think>", "\n", "\n", "</think>", "<|im_end|>", "<tool_call>"]
    assert "<|im_end|>" in tok.all_special_tokens and "<think>" not in tok.all_special_tokens  # as Qwen3's
    tok.save_pretrained(str(tmp_path))  # a checkpoint keeps the template
    assert load_tokenizer(str(tmp_path)).chat_template.source == QWEN3_TEMPLATE


def test_chat_template_jinja_wins_over_tokenizer_config(qwen3_dir, tmp_path):
    import shutil

    from ppo.models.basics import load_tokenizer

    shutil.copytree(qwen3_dir, tmp_path / "m")
    (tmp_path / "m" / "chat_template.jinja").write_text("J{{ messages[0].content }}")
    assert load_tokenizer(str(tmp_path / "m")).apply_chat_template(USER, tokenize=False) == "Jhi"
    (tmp_path / "m" / "chat_template.jinja").unlink()
    config = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ 1 }}"}]
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(str(tmp_path / "m")).apply_chat_template(USER, tokenize=False) == "D1"


def test_a_bad_template_file_is_one_error_naming_it(qwen3_dir, tmp_path):
    from ppo.data.chat_template_file import apply_chat_template_setting
    from ppo.models.basics import load_tokenizer

    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(ArgumentError, match=rf"^{bad}: not a Jinja chat template \(line 1: "):
        apply_chat_template_setting(load_tokenizer(qwen3_dir), str(bad))


def test_enable_thinking_reaches_the_prompt_data_and_the_agent_format(qwen3_dir, tmp_path):
    """With `chat_template_kwargs {"enable_thinking": false}` the RL prompt ends where Qwen3
    generates (after the empty think block), in the datasets and the agent rollout alike."""
    from ppo.agents.formats import turn_format_for
    from ppo.common.argument_parsing import parse_arguments
    from ppo.data import PromptOnlyDataset
    from ppo.models.basics import load_tokenizer
    from tests.test_paddlenlp_dropin import entry_classes

    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"src": "hi", "tgt": "ih"}) + "\n")
    argv = ["--output_dir", str(tmp_path / "o"), "--use_chat_template", "true", "--chat_template_kwargs",
            '{"enable_thinking": false}']
    _, data_args, _ = parse_arguments(entry_classes("sft"), argv)
    tok = load_tokenizer(qwen3_dir)
    ds = PromptOnlyDataset(f"Jsonfile:1:{data}", max_prompt_len=64, **data_args.dataset_kwargs(tok, 1))
    expected = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = list(ds[0]["input_ids"])
    pieces = ["<|im_start|>", "user", "\n", "hi", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n", "<think>", "\n\n",
              "</think>", "\n\n"]  # every newline kept, as transformers tokenises the text
    assert ids == [i for p in pieces for i in tok.convert_tokens_to_ids(tok.tokenize(p))]
    assert tok.decode(ids, spaces_between_special_tokens=False) == expected
    fmt = turn_format_for(tok, use_chat_template=True)
    prompt = fmt.prompt_segments("hi", tools=[TOOL])[0].text
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert fmt.turn_end_text == "<|im_end|>"
    assert fmt.glue_between(("tool",), [TOOL]) == ["\n<|im_start|>user\n<tool_response>\n",
                                                    "\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"]
    with pytest.raises(ArgumentError, match="use_chat_template is false"):
        parse_arguments(entry_classes("sft"), argv[:2] + argv[4:])


def test_scorers_see_the_think_block_as_generated(qwen3_dir):
    """A Qwen3 response with its reasoning decodes for the scorers with `<think>...</think>` as
    written (not special: kept, as verl and TRL pass it to reward functions), `<|im_end|>` dropped."""
    import paddle

    from ppo.evaluation import decode_responses
    from ppo.models.basics import load_tokenizer

    tok = load_tokenizer(qwen3_dir)
    ids = tok("<think>\nr\n</think>\n\nA b<|im_end|>", add_special_tokens=False)["input_ids"]
    texts = decode_responses(tok, paddle.to_tensor([ids + [0]]), paddle.to_tensor([[1] * len(ids) + [0]]))
    assert texts == ["<think>\nr\n</think>\n\nA b"]


def test_ids_past_a_sentencepiece_tokenizer_decode_as_nothing(tmp_path):
    """A model whose vocabulary is padded past its tokenizer (ERNIE-4.5-0.3B: 103,424 rows) can
    sample a padded row; decoding the response drops it instead of raising SentencePiece's
    OUT_OF_RANGE (before, the PPO / GRPO sample trace of a real-shaped ERNIE run died on it)."""
    import paddle

    from ppo.evaluation import decode_responses
    from ppo.tiny.factory import build_tokenizer

    tok = build_tokenizer(str(tmp_path / "ernie"), arch="ernie45")
    ids = tok("ab", add_special_tokens=False)["input_ids"]
    row = ids[:1] + [len(tok), len(tok) + 5000] + ids[1:]
    assert decode_responses(tok, paddle.to_tensor([row]), paddle.ones([1, len(row)], "int64")) == ["ab"]


def test_an_unread_template_argument_stops_sft_before_the_model_loads(tmp_path):
    from ppo.tiny.factory import build_tiny
    from sft.run_sft import start_up

    model = str(tmp_path / "qwen3")
    build_tiny(model, seed=1, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, arch="qwen3")
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"src": "hi", "tgt": "ih"}) + "\n")
    argv = ["--model_name_or_path", model, "--train_datasets", f"Jsonfile:1:{data}", "--output_dir", str(tmp_path / "o"),
            "--use_chat_template", "true", "--chat_template_kwargs", '{"enable_thinkin": false}']
    with pytest.raises(ArgumentError, match=r"^chat_template_kwargs: 'enable_thinkin' is not read by .*tokenizer_config.json"):
        start_up(argv)
    assert not (tmp_path / "o").exists()
