"""Data parallel equals one process: two CPU processes with `per_device_train_batch_size B`
give the per-step losses and the final weights of one process with `2 B` (the same global
batch), from the same checkpoint and data.

The one-process runs go through the same launcher with one process, so both sides build
their models, samplers and seeds the same way; only the data-parallel split differs."""
import json

import numpy as np
import pytest

from tests.test_tensor_parallel import assert_same_steps, assert_same_weights, assert_weights_moved, ppo_argv
from tests.tp_launch import launch_run, read_jsonl
from tests.demo_config_flags import PPO_AS_BEFORE


def one_and_two_process_runs(script, argv, tmp_path, per_process_sizes):
    """`script` on one process with the sizes `{flag: global value}` and on two with half each."""
    out1, out2 = str(tmp_path / "one"), str(tmp_path / "dp2")
    sizes1 = [x for flag, value in per_process_sizes.items() for x in (flag, str(value))]
    sizes2 = [x for flag, value in per_process_sizes.items() for x in (flag, str(value // 2))]
    launch_run(script, [*argv, *sizes1, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"], out1, nproc=1)
    launch_run(script, [*argv, *sizes2, "--output_dir", out2, "--logging_dir", f"{out2}/vdl"], out2, nproc=2)
    return out1, out2


def test_sft_dp2_matches_one_process(tiny_model_dir, tiny_data_dir, tmp_path):
    """SFT through PaddleNLP's Trainer: the answer-token NLL is a mean over the global batch's
    tokens whichever way its rows are spread over ranks (gradient accumulation included)."""
    argv = [
        "config/tiny/sft_argument.json", "--model_name_or_path", tiny_model_dir,
        "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl",
        "--max_steps", "3", "--gradient_accumulation_steps", "2", "--overwrite_output_dir", "true",
        "--per_device_eval_batch_size", "8", "--logging_steps", "1", "--learning_rate", "1e-2",
        "--eval_steps", "3", "--save_steps", "3", "--warmup_steps", "0", "--disable_tqdm", "true",
        "--eval_max_new_tokens", "6",
    ]
    out1, out2 = one_and_two_process_runs("sft/run_sft.py", argv, tmp_path, {"--per_device_train_batch_size": 8})
    assert_same_steps(out1, out2, "loss/sft", 3)
    assert_same_weights(out1, out2)
    assert_weights_moved(tiny_model_dir, out2)
    s1, s2 = (json.load(open(f"{o}/summary.json"))["final_eval"] for o in (out1, out2))
    np.testing.assert_allclose(s2["eval/loss"], s1["eval/loss"], rtol=2e-5)
    assert s2["eval/accuracy"] == s1["eval/accuracy"]


@pytest.mark.slow
def test_ppo_dp2_matches_one_process(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """PPO with a reward model and a critic: each data rank rolls out its half of the global
    prompt batch (the prompt order is shared, and each row draws its own columns of one set of
    uniforms), advantages are whitened with statistics over both ranks, and the update's
    token-mean losses are taken over the global token count, so the two layouts give the same
    samples, losses, gradient norms and weights."""
    argv = ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        tiny_model_dir, tiny_data_dir, "--reward_model_name_or_path", tiny_rm_dir, "--temperature", "1.5",
        "--normalize_advantage", "true", "--overwrite_output_dir", "true",
        "--update_iters", "2", "--gradient_accumulation_steps", "1",
        "--learning_rate", "1e-3", "--critic_learning_rate", "1e-3", "--kl_coeff", "0.1", "--entropy_coeff", "0.01",
    )]
    out1, out2 = one_and_two_process_runs(  # one micro-batch per optimiser step in both layouts
        "ppo/run_ppo.py", argv, tmp_path, {"--per_device_prompt_batch_size": 8, "--per_device_train_batch_size": 8})
    assert_same_rl_runs(out1, out2, ("loss/value_avg", "train/critic_grad_norm"), ("policy", "value"), tiny_model_dir)


def test_grpo_dp2_matches_one_process(tiny_model_dir, tiny_data_dir, tmp_path):
    """GRPO (rule rewards on the response length, so groups differ; a k3 KL loss): groups stay
    on their rank, and the same samples give the same losses and weights."""
    argv = ["config/tiny/grpo_rule_argument.json", *ppo_argv(
        tiny_model_dir, tiny_data_dir, "--rollout_n", "4", "--gradient_accumulation_steps", "1", "--learning_rate", "1e-3",
        "--kl_loss_coeff", "0.05", "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer",
        "--overwrite_output_dir", "true",
    )]
    out1, out2 = one_and_two_process_runs(
        "ppo/run_ppo.py", argv, tmp_path, {"--per_device_prompt_batch_size": 4, "--per_device_train_batch_size": 16})
    assert_same_rl_runs(out1, out2, ("loss/kl",), ("policy",), tiny_model_dir)


@pytest.mark.slow
def test_ppo_lagrangian_dp2_matches_one_process(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, tmp_path):
    """PPO-Lagrangian with a cost model whose costs vary by response: each data rank scores its
    half of the prompts, the episode costs of both ranks are gathered in data-rank order into
    one window, and every rank moves lambda by the same step. The window (12) is shorter than a
    step's 16 episodes, so it keeps the last 12 of the global batch in order: a rank using its own
    costs, or the ranks in another order, would move lambda differently from one process."""
    argv = ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        tiny_model_dir, tiny_data_dir, "--reward_model_name_or_path", tiny_rm_dir, "--cost_model_name_or_path", tiny_rm_dir_cost,
        "--lambda_lr", "0.5", "--episode_cost_window_size", "12", "--threshold", "0.0", "--temperature", "1.5",
        "--normalize_advantage", "true", "--overwrite_output_dir", "true", "--update_iters", "1",
        "--gradient_accumulation_steps", "1", "--learning_rate", "1e-3", "--critic_learning_rate", "1e-3", "--kl_coeff", "0.1",
    )]
    out1, out2 = one_and_two_process_runs(
        "ppo/run_ppo.py", argv, tmp_path, {"--per_device_prompt_batch_size": 16, "--per_device_train_batch_size": 16})
    keys = ("lagrange/lambda", "lagrange/episode_cost", "objective/cost", "loss/cost_value_avg", "train/cost_critic_grad_norm")
    assert_same_rl_runs(out1, out2, keys, ("policy", "value", "cost_value"), tiny_model_dir)
    rows = [r for r in read_jsonl(f"{out2}/metrics.jsonl") if "lagrange/lambda" in r]
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["lagrange/lambda"] != rows[0]["lagrange/lambda"] != 1.0
    # step 1: the window's 12 costs are not the batch's 16, so its mean differs from objective/cost
    assert abs(rows[0]["lagrange/episode_cost"] - rows[0]["objective/cost"]) > 1e-4


def assert_same_rl_runs(out1, out2, extra_keys, models, start_dir):
    """Same per-step metrics and saved models; rank 0's logged samples are the first rows of the
    one-process run's samples of the same step (the global batch in order)."""
    for key in ("loss/policy_avg", "objective/scores", "objective/kl", "policy/entropy_avg", "train/actor_grad_norm",
                *extra_keys):
        assert_same_steps(out1, out2, key, 2)
    for name in models:
        assert_same_weights(f"{out1}/{name}", f"{out2}/{name}")
    assert_weights_moved(start_dir, f"{out2}/policy")
    one, dp = ({}, {})
    for rows, out in ((one, out1), (dp, out2)):
        for r in read_jsonl(f"{out}/samples.jsonl"):
            rows.setdefault(r["step"], []).append(r["response"])
    assert sorted(dp) == sorted(one) and dp
    for step, responses in dp.items():
        assert responses == one[step][: len(responses)], step
