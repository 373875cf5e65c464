"""The tiny ERNIE 4.5 (`ppo.tiny.factory --arch ernie45`) through the entry points: 2 SFT steps
(sft/run_sft.py) from its Hugging Face export, then 2 GRPO steps with the rule scorer
(ppo/run_ppo.py, the rollout engine generating with its interleaved RoPE reordered), each with
finite metrics and a saved model that reloads as our Ernie4_5ForCausalLM with the trained
weights."""
import json
import os

import numpy as np
import pytest

from tests.hf_weights_helpers import causal_logits

IDS = [[1, 4, 7, 30, 31, 2, 9]]


@pytest.fixture(scope="module")
def tiny_ernie_dir(tmp_path_factory):
    from ppo.tiny.factory import build_tiny

    path = str(tmp_path_factory.mktemp("tiny_ernie45"))
    build_tiny(path, seed=5, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, arch="ernie45")
    return path


def test_the_factory_builds_an_ernie45_shaped_as_ernie_4_5_0_3b(tiny_ernie_dir):
    config = json.load(open(os.path.join(tiny_ernie_dir, "config.json")))
    assert config["model_type"] == "ernie4_5" and config["architectures"] == ["Ernie4_5ForCausalLM"]
    from ppo.models.families import load_config

    loaded = load_config(tiny_ernie_dir)  # (PaddleNLP leaves fields at their defaults out of config.json)
    assert (loaded.head_dim, loaded.num_key_value_heads, loaded.tie_word_embeddings) == (32, 1, True)
    assert (loaded.rope_theta, loaded.rms_norm_eps, loaded.use_bias) == (500000.0, 1e-5, False)
    assert json.load(open(os.path.join(tiny_ernie_dir, "tiny_factory.json")))["arch"] == "ernie45"


def test_sft_then_grpo_train_and_reload(tmp_path, tiny_ernie_dir, tiny_data_dir):
    from ppo.models.loading import load_causal_lm
    from ppo.run_ppo import build_trainer
    from sft.run_sft import main as run_sft
    from tests.test_ppo_trainer import read_metrics

    from ppo.models.hf_convert import export_dir, is_hf_dir

    hf_dir = str(tmp_path / "hf")  # SFT starts from the Hugging Face export (imported in memory)
    export_dir(tiny_ernie_dir, hf_dir)
    assert is_hf_dir(hf_dir) and json.load(open(f"{hf_dir}/config.json"))["architectures"] == ["Ernie4_5ForCausalLM"]
    sft_out = str(tmp_path / "sft")
    run_sft(["config/tiny/sft_argument.json", "--model_name_or_path", hf_dir,
             "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl",
             "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--output_dir", sft_out,
             "--logging_dir", f"{sft_out}/vdl", "--max_steps", "2", "--logging_steps", "1",
             "--per_device_train_batch_size", "8", "--evaluation_strategy", "no", "--do_eval", "false",
             "--save_steps", "0", "--disable_tqdm", "true"])
    losses = [r["loss/sft"] for r in read_metrics(sft_out) if "loss/sft" in r]
    assert len(losses) == 2 and all(np.isfinite(losses)), losses
    base, sft = load_causal_lm(tiny_ernie_dir), load_causal_lm(sft_out)
    np.testing.assert_array_equal(causal_logits(load_causal_lm(hf_dir), IDS), causal_logits(base, IDS))
    assert type(sft).__name__ == "Ernie4_5ForCausalLM" and sft.lm_head.weight is sft.ernie.embed_tokens.weight
    assert not is_hf_dir(sft_out)  # runs save in PaddleNLP's layout
    assert np.abs(causal_logits(sft, IDS) - causal_logits(base, IDS)).max() > 0

    out = str(tmp_path / "grpo")
    trainer = build_trainer([
        "config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", sft_out,
        "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--output_dir", out, "--logging_dir", f"{out}/vdl",
        "--max_steps", "2", "--per_device_prompt_batch_size", "4", "--rollout_n", "4", "--per_device_train_batch_size", "16",
        "--max_dec_len", "6", "--evaluation_strategy", "no", "--save_steps", "0", "--num_sample_generations", "1",
        "--learning_rate", "1e-3", "--disable_tqdm", "true",
        "--rule_reward_scorers", "tests.rule_reward_helpers:_char_recall_scorer"])  # graded: advantages != 0
    trainer.train()
    lines = [r for r in read_metrics(out) if "objective/scores" in r]
    assert len(lines) == 2 and lines[0]["objective/scores"] > 0
    for line in lines:
        for key in ("objective/scores", "loss/policy_avg", "response_length/mean", "perf/tokens_per_s"):
            assert np.isfinite(line[key]), (key, line)
    policy = load_causal_lm(os.path.join(out, "policy"))
    assert type(policy).__name__ == "Ernie4_5ForCausalLM"
    np.testing.assert_array_equal(causal_logits(policy, IDS), causal_logits(trainer.passes.models.actor, IDS))
    assert np.abs(causal_logits(policy, IDS) - causal_logits(sft, IDS)).max() > 0



def test_ppo_with_ernie45_reward_and_critic_models(tmp_path, tiny_ernie_dir, tiny_data_dir):
    """PPO where the policy, the reward model and the critic are all ERNIE 4.5: one step moves the
    actor and the critic, the saved critic reloads as an ERNIE 4.5 score model with the trained head."""
    from ppo.models.loading import load_tokenizer
    from ppo.models.score_model import AutoModelForScore
    from ppo.run_ppo import build_trainer
    from tests.test_ppo_trainer import ppo_argv, read_metrics

    rm_dir = str(tmp_path / "rm")
    reward = AutoModelForScore.from_pretrained(tiny_ernie_dir)
    assert type(reward).__name__ == "Ernie4_5ModelForScore"
    reward.save_pretrained(rm_dir)
    load_tokenizer(tiny_ernie_dir).save_pretrained(rm_dir)
    out = str(tmp_path / "ppo")
    trainer = build_trainer(ppo_argv(tiny_ernie_dir, rm_dir, tiny_data_dir, out, "--max_steps", "1"))
    critic = trainer.passes.models.critic
    head_before = critic.score_head.weight.numpy().copy()
    trainer.train()
    (line,) = [r for r in read_metrics(out) if "objective/scores" in r]
    assert all(np.isfinite(line[k]) for k in ("objective/scores", "loss/policy_avg", "loss/value_avg"))
    saved = AutoModelForScore.from_pretrained(os.path.join(out, "value"))
    assert type(saved).__name__ == "Ernie4_5ModelForScore" and saved.config.score_type == "critic"
    np.testing.assert_array_equal(saved.score_head.weight.numpy(), critic.score_head.weight.numpy())
    assert np.abs(saved.score_head.weight.numpy() - head_before).max() > 0
