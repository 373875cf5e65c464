"""TRL's dataset formats: `prompt`/`chosen`/`rejected` (strings or messages), `messages` for SFT and
`prompt` for RL, read with file/line/field errors, rendered with the chat template the way TRL's
`maybe_apply_chat_template` does, and trained unchanged by SFT, RM, DPO and GRPO (short runs, their
metrics at recorded values: tests/pinned_metrics.py)."""
import json
import os
import shutil

import numpy as np
import pytest

from ppo.data import PreferenceDataset, PromptOnlyDataset, RawDataset, SupervisedDataset
from ppo.data.base import DataError, IGNORE_INDEX
from tests.pinned_metrics import assert_pinned

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}USER: {{ m['content'] }} ASSISTANT:"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
)
# Each stage's metrics at its first and last step are pinned (tests/fixtures/pinned_metrics.json,
# as trl-sft, trl-rm, trl-dpo, trl-grpo). Measured spread: repeated runs bit for bit equal; 2
# threads or MKL's generic code path move them by at most 1.2e-7.
PIN_TOLERANCE = dict(rtol=3e-5, atol=1e-6)


@pytest.fixture(scope="module")
def chat_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with a Jinja chat template in its tokenizer config."""
    path = str(tmp_path_factory.mktemp("tiny_chat"))
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    config_file = os.path.join(path, "tokenizer_config.json")
    config = json.load(open(config_file))
    config["chat_template"] = CHAT_TEMPLATE
    json.dump(config, open(config_file, "w"))
    return path


@pytest.fixture(scope="module")
def tokenizer(chat_model_dir):
    from ppo.models.loading import load_tokenizer

    return load_tokenizer(chat_model_dir)


def user(text):
    return [{"role": "user", "content": text}]


def assistant(text):
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def trl_data(tiny_data_dir, tmp_path_factory):
    """The fixture's demo data rewritten in TRL's formats (standard and conversational)."""
    root = tmp_path_factory.mktemp("trl_data")
    sft = [json.loads(ln) for ln in open(f"{tiny_data_dir}/sft.jsonl")]
    pairs = [json.loads(ln) for ln in open(f"{tiny_data_dir}/preference.jsonl")]
    prompts = [json.loads(ln) for ln in open(f"{tiny_data_dir}/prompts.jsonl")]
    files = {
        "messages": [{"messages": user(r["src"][0]) + assistant(r["tgt"][0])} for r in sft],
        "pairs": [{"prompt": p["prompt"], "chosen": p[f"response_{p['better_response_id']}"],
                   "rejected": p[f"response_{1 - p['better_response_id']}"]} for p in pairs],
        "pairs_chat": [{"prompt": user(p["prompt"]), "chosen": assistant(p[f"response_{p['better_response_id']}"]),
                        "rejected": assistant(p[f"response_{1 - p['better_response_id']}"])} for p in pairs],
        "prompts_chat": [{"prompt": user(r["src"][0]), "solution": r["tgt"][0]} for r in prompts],
    }
    for name, rows in files.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {name: str(root / f"{name}.jsonl") for name in files}


def test_registry_names_and_raw_samples(trl_data):
    pair = RawDataset.load("trl-preference", trl_data['pairs'])[0]
    assert pair["better"] and pair["answer"] != pair["other_answer"] and "prompt_messages" not in pair
    chat = RawDataset.load("trl-dpo", trl_data['pairs_chat'])[0]
    assert chat["prompt_messages"][0]["role"] == "user" and chat["answer_messages"][0]["role"] == "assistant"
    sft = RawDataset.load("trl-messages", trl_data['messages'])[0]
    assert sft["input"].startswith("Reverse: ") and sft["answer"] == sft["answer_messages"][0]["content"]
    prompt = RawDataset.load("trl-prompt", trl_data['prompts_chat'])[0]
    assert prompt["label"] and prompt["input"].startswith("Reverse: ")


@pytest.mark.parametrize("row,field,reason", [
    ({"prompt": "p", "chosen": "a"}, "rejected", "missing field"),
    ({"chosen": "a", "rejected": "b"}, "prompt", "implicit-prompt"),
    ({"prompt": [{"role": "user", "content": "p"}], "chosen": [{"role": "user", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "chosen", "assistant messages only"),
    ({"prompt": [{"role": "robot", "content": "p"}], "chosen": "a", "rejected": "b"}, "prompt", "role 'robot'"),
])
def test_bad_preference_records_name_file_line_and_field(tmp_path, row, field, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "chosen": "a", "rejected": "b"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"{path}, line 2, field '{field}': .*{reason}"):
        RawDataset.load("trl-preference", path)


def test_messages_without_final_answer_are_refused(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"messages": user("hi")}) + "\n")
    with pytest.raises(DataError, match="line 1, field 'messages': .*does not end with an assistant message"):
        RawDataset.load("trl-messages", path)


def test_chat_template_applied_as_trl_does(trl_data, tokenizer):
    data = SupervisedDataset([f"trl-messages:1.0:{trl_data['messages']}"], tokenizer, max_length=40, use_chat_template=True)
    raw = RawDataset.load("trl-messages", trl_data['messages'])[0]
    prompt_text = tokenizer.apply_chat_template(raw["prompt_messages"], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(raw["prompt_messages"] + raw["answer_messages"], tokenize=False, add_generation_prompt=False)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(full[len(prompt_text):], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    item = data[0]
    np.testing.assert_array_equal(item["input_ids"], prompt_ids + answer_ids)
    np.testing.assert_array_equal(item["labels"], [IGNORE_INDEX] * len(prompt_ids) + answer_ids)
    assert prompt_ids[0] == tokenizer.bos_token_id  # from the template, not added twice
    # the same conversation as plain text through prompt_template gives the same ids
    text = PreferenceDataset([f"trl-preference:1.0:{trl_data['pairs']}"], tokenizer, max_length=40,
                             prompt_template="USER: {input} ASSISTANT:")
    chat = PreferenceDataset([f"trl-preference:1.0:{trl_data['pairs_chat']}"], tokenizer, max_length=40, use_chat_template=True)
    np.testing.assert_array_equal(text[0]["better_input_ids"], chat[0]["better_input_ids"])
    with pytest.raises(ValueError, match="set use_chat_template true"):
        PromptOnlyDataset([f"trl-prompt:1.0:{trl_data['prompts_chat']}"], tokenizer)


def read_metrics(out):
    return [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]


def short_run_flags(out, steps=3):
    return ["--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", str(steps), "--logging_steps", "1",
            "--evaluation_strategy", "no", "--do_eval", "false", "--save_steps", str(steps), "--warmup_steps", "0",
            "--per_device_train_batch_size", "8", "--disable_tqdm", "true", "--use_chat_template", "true"]


def test_trl_files_train_sft_rm_dpo_and_grpo(chat_model_dir, trl_data, tmp_path):
    from dpo.run_dpo import main as run_dpo
    from ppo.run_ppo import main as run_ppo
    from rm.run_reward import main as run_reward
    from sft.run_sft import main as run_sft

    out = {k: str(tmp_path / k) for k in ("sft", "rm", "dpo", "grpo")}
    run_sft(["config/tiny/sft_argument.json", "--model_name_or_path", chat_model_dir, "--train_datasets",
             f"trl-messages:1.0:{trl_data['messages']}", "--eval_datasets", "", *short_run_flags(out["sft"])])
    run_reward(["config/tiny/rm_argument.json", "--model_name_or_path", chat_model_dir, "--train_datasets",
                f"trl-rm:1.0:{trl_data['pairs']}", "--eval_datasets", "", *short_run_flags(out["rm"])])
    run_dpo(["config/tiny/dpo_argument.json", "--model_name_or_path", chat_model_dir, "--train_datasets",
             f"trl-dpo:1.0:{trl_data['pairs_chat']}", "--eval_datasets", "", "--eval_generation_datasets", "",
             *short_run_flags(out["dpo"])])
    run_ppo(["config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", chat_model_dir, "--train_datasets",
             f"trl-prompt:1.0:{trl_data['prompts_chat']}", "--eval_datasets", "", "--rollout_n", "4",
             "--per_device_prompt_batch_size", "4", "--max_dec_len", "6", "--num_sample_generations", "0",
             "--rule_reward_scorers", "tests.rule_reward_helpers:_char_recall_scorer", "--learning_rate", "1e-3",
             *short_run_flags(out["grpo"], steps=2)])
    for stage, loss in (("sft", "loss/sft"), ("rm", "rm/loss"), ("dpo", "loss/dpo"), ("grpo", "loss/policy_avg")):
        values = [r[loss] for r in read_metrics(out[stage]) if loss in r]
        assert values and all(np.isfinite(values)), (stage, values)
    grpo = [r for r in read_metrics(out["grpo"]) if "objective/scores" in r]
    # the graded rule (it refuses an answer without its label) saw the solutions
    assert len(grpo) == 2 and all(0.0 < r["objective/scores"] <= 1.0 for r in grpo)
    for stage in out:
        assert_pinned(f"trl-{stage}", read_metrics(out[stage]), **PIN_TOLERANCE)
