"""Shared by the chat-template pipeline tests: run SFT, RM, DPO, PPO and GRPO for 2 steps each
through the real entry points on multi-turn chat data (`ppo.tiny.chat_data`) with
`use_chat_template`, and read back what each run wrote."""
import json
import math
import os

import numpy as np
from tests.demo_config_flags import GRPO_AS_BEFORE, PPO_AS_BEFORE

STEPS = 2


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def train_records(out, key):
    """Logged training steps of a run (records carrying `key`), checked finite."""
    records = [r for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if key in r and "step" in r]
    for r in records:
        assert math.isfinite(r[key]), (out, r)
    return records


def common_flags(out, max_length):
    return [
        "--use_chat_template", "true", "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", str(STEPS), "--logging_steps", "1", "--warmup_steps", "0", "--disable_tqdm", "true",
        "--report_to", "none", "--eval_datasets", "", "--save_strategy", "no", "--evaluation_strategy", "no",
        "--max_length", str(max_length),
    ]


def run_sft(model_dir, data, out, max_length):
    from sft.run_sft import main

    main(["config/tiny/sft_argument.json", "--model_name_or_path", model_dir,
          "--train_datasets", f"Jsonfile:1.0:{data['sft']}", "--per_device_train_batch_size", "1",
          *common_flags(out, max_length)])
    return train_records(out, "loss/sft")


def run_rm(model_dir, data, out, max_length):
    from rm.run_reward import main

    main(["config/tiny/rm_argument.json", "--model_name_or_path", model_dir,
          "--train_datasets", f"json:1.0:{data['preference']}", "--per_device_train_batch_size", "1",
          *common_flags(out, max_length)])
    return train_records(out, "rm/loss")


def run_dpo(model_dir, data, out, max_length):
    from dpo.run_dpo import main

    main(["config/tiny/dpo_argument.json", "--model_name_or_path", model_dir,
          "--train_datasets", f"json:1.0:{data['preference']}", "--eval_generation_datasets", "",
          "--per_device_train_batch_size", "1", *common_flags(out, max_length)])
    return train_records(out, "loss/dpo")


def rl_flags(data, out, max_prompt_len, max_dec_len):
    return [
        "--train_datasets", f"Jsonfile:1.0:{data['prompts']}", "--eval_datasets", "",
        "--use_chat_template", "true", "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", str(STEPS), "--max_prompt_len", str(max_prompt_len),
        "--max_length", str(max_prompt_len + max_dec_len), "--max_dec_len", str(max_dec_len), "--min_dec_len", "1",
        "--evaluation_strategy", "no", "--save_steps", "0", "--num_sample_generations", "1", "--disable_tqdm", "true",
        "--update_iters", "1",
    ]


def run_ppo(model_dir, rm_dir, data, out, max_prompt_len, max_dec_len=4):
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, "--actor_model_name_or_path", model_dir,
                             "--reward_model_name_or_path", rm_dir, "--per_device_prompt_batch_size", "1",
                             "--per_device_train_batch_size", "1", *rl_flags(data, out, max_prompt_len, max_dec_len)])
    trainer.train()
    return trainer, train_records(out, "objective/scores")


def run_grpo(model_dir, url, data, out, max_prompt_len, max_dec_len=4):
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(["config/tiny/grpo_argument.json", *GRPO_AS_BEFORE, "--actor_model_name_or_path", model_dir,
                             "--reward_server", url, "--per_device_prompt_batch_size", "1", "--rollout_n", "2",
                             "--per_device_train_batch_size", "2", "--reward_server_retries", "1",
                             *rl_flags(data, out, max_prompt_len, max_dec_len)])
    trainer.train()
    return trainer, train_records(out, "objective/scores")


def assert_rl_run(records, out, opener, max_dec_len):
    """Two logged steps, finite losses, prompts that end with the template's generation prompt `opener`."""
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert np.isfinite(r["loss/policy_avg"]) and 1 <= r["response_length/mean"] <= max_dec_len
    samples = read_jsonl(os.path.join(out, "samples.jsonl"))
    assert samples
    for s in samples:
        assert s["prompt"].endswith(opener), s["prompt"][-80:]
