"""PaddleNLP's ppo-kk prompts (`src`) come already formatted with Qwen's chat template, and
PaddleNLP's `RLHFDataset` uses them as they are (`apply_chat_template` off). The shipped GRPO
and online-DPO configs on that data read them as they are too (`prompt_template "{input}"`),
and a chat template over a prompt that already carries one is refused by name."""
import json

import numpy as np
import pytest

from ppo.common.argument_parsing import parse_arguments
from ppo.tiny.bpe_tokenizers import build_qwen2_tokenizer

KK_SRC = ("<|im_start|>system\nYou are a helpful assistant.\n<|im_end|>\n<|im_start|>user\nA very special island is "
          "inhabited only by knights and knaves. Zoey says Ethan is a knave. Who is a knight?\n<|im_end|>\n"
          "<|im_start|>assistant\n<think>")


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory):
    return build_qwen2_tokenizer(str(tmp_path_factory.mktemp("qwen_tok")), vocab_size=300)


def kk_file(tmp_path):
    path = tmp_path / "kk.jsonl"
    path.write_text(json.dumps({"src": [KK_SRC], "tgt": ["(1) Zoey is a knave\n(2) Ethan is a knight"]}) + "\n")
    return str(path)


def entry(config):
    if "online_dpo" in config:
        from dpo.online_dpo_arguments import DataArgument, ModelArgument, OnlineDPOTrainingArguments

        return ModelArgument, DataArgument, OnlineDPOTrainingArguments
    from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments

    return ModelArgument, DataArgument, PPOTrainingArguments


def kk_prompts(config, tokenizer, tmp_path, *flags):
    from ppo.data import PromptOnlyDataset

    _, data, _ = parse_arguments(entry(config), [
        config, "--train_datasets", f"Jsonfile:1.0:{kk_file(tmp_path)}", "--output_dir", str(tmp_path / "out"), *flags,
    ])
    return PromptOnlyDataset(data.train_datasets, tokenizer, prompt_template=data.prompt_template,
                             use_chat_template=data.use_chat_template, max_prompt_len=512)


@pytest.mark.parametrize("config", ["config/qwen/grpo_argument.json", "config/llama/grpo_argument.json",
                                    "config/qwen/online_dpo_argument.json", "config/llama/online_dpo_argument.json"])
def test_shipped_kk_configs_template_the_prompts_once(config, qwen_tokenizer, tmp_path):
    (item,) = list(kk_prompts(config, qwen_tokenizer, tmp_path))
    assert item["prompt"] == KK_SRC  # used as it is: one system turn, one assistant header
    np.testing.assert_array_equal(item["input_ids"], qwen_tokenizer(KK_SRC)["input_ids"])
    text = qwen_tokenizer.decode(item["input_ids"].tolist())
    assert text.count("<|im_start|>assistant") == 1 and text.count("<|im_start|>system") == 1


def test_a_chat_template_over_a_templated_prompt_is_refused(qwen_tokenizer, tmp_path):
    with pytest.raises(ValueError) as info:
        kk_prompts("config/qwen/grpo_argument.json", qwen_tokenizer, tmp_path, "--use_chat_template", "true")
    message = str(info.value)
    assert "sample 0 of dataset 'Jsonfile'" in message
    assert "already formatted with a chat template (it contains '<|im_end|>\\n<|im_start|>assistant')" in message
    assert "set use_chat_template false and prompt_template '{input}'" in message


def test_plain_prompts_still_get_the_chat_template(qwen_tokenizer, tmp_path):
    from ppo.data import format_prompt

    text = format_prompt("Who is a knight?", qwen_tokenizer, use_chat_template=True)
    assert text.count("<|im_start|>assistant") == 1 and "Who is a knight?" in text
