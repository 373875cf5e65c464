"""Tensor parallel on two CPU processes: a TP=2 run and a TP=1 run from the same checkpoint
give the same per-step losses and the same (merged) weights, for SFT, RM, DPO, PPO and GRPO.

The TP=2 runs go through `paddle.distributed.launch` with the test-only gloo stand-ins of
the model-parallel collectives (`tests/tp_cpu_collectives.py`); the TP=1 reference runs in
this process. The TP=2 runs load the full (TP=1) checkpoint split by PaddleNLP's
tensor-parallel mappings, and save merged checkpoints that the TP=1 side then loads."""
import json
import os

import numpy as np
import paddle
import pytest

from ppo.models.loading import load_tokenizer
from ppo.models.score_model import AutoModelForScore
from tests.demo_config_flags import PPO_AS_BEFORE
from tests.tp_launch import launch_run, read_jsonl, step_values

LOSS_RTOL = 2e-5
WEIGHT_ATOL = 2e-5


def saved_weights(path):
    return {k: v.numpy() for k, v in paddle.load(os.path.join(path, "model_state.pdparams")).items()}


def assert_same_weights(dir_tp1, dir_tp2, atol=WEIGHT_ATOL):
    """Same keys, same full shapes, values within float tolerance; the TP=2 checkpoint is merged."""
    a, b = saved_weights(dir_tp1), saved_weights(dir_tp2)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].shape == b[key].shape, key
        np.testing.assert_allclose(b[key], a[key], atol=atol, rtol=0, err_msg=key)
    config = json.load(open(os.path.join(dir_tp2, "config.json")))
    assert config.get("tensor_parallel_degree", 1) == 1


def assert_same_steps(out1, out2, key, steps):
    v1, v2 = step_values(out1, key), step_values(out2, key)
    assert sorted(v1) == sorted(v2) == list(range(1, steps + 1)), (v1, v2)
    # atol: a first-step KL is float noise around 0 (old and reference log-probs come from
    # different passes: the update's forward and a no-grad one), 1e-7..1e-6 either way
    np.testing.assert_allclose([v2[s] for s in v1], [v1[s] for s in v1], rtol=LOSS_RTOL, atol=1e-6, err_msg=key)


def assert_weights_moved(start_dir, trained_dir):
    a, b = saved_weights(start_dir), saved_weights(trained_dir)
    assert any(not np.allclose(a[k], b[k]) for k in a if k in b)


@pytest.mark.slow
def test_sft_tp2_matches_tp1(tiny_model_dir, tiny_data_dir, tmp_path):
    from sft.run_sft import main as run_sft

    argv = [
        "config/tiny/sft_argument.json", "--model_name_or_path", tiny_model_dir,
        "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl",
        "--max_steps", "3", "--per_device_train_batch_size", "16", "--logging_steps", "1", "--learning_rate", "1e-2",
        "--eval_steps", "3", "--save_steps", "3", "--warmup_steps", "0", "--disable_tqdm", "true",
        "--eval_max_new_tokens", "6",
    ]
    out1, out2 = str(tmp_path / "tp1"), str(tmp_path / "tp2")
    run_sft([*argv, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    launch_run("sft/run_sft.py", [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", "--tensor_parallel_degree", "2"], out2)
    assert_same_steps(out1, out2, "loss/sft", 3)
    assert_same_weights(out1, out2)
    assert_weights_moved(tiny_model_dir, out2)
    s1, s2 = (json.load(open(f"{o}/summary.json"))["final_eval"] for o in (out1, out2))
    np.testing.assert_allclose(s2["eval/loss"], s1["eval/loss"], rtol=LOSS_RTOL)
    assert s2["eval/accuracy"] == s1["eval/accuracy"]  # greedy generation through the gathered engine


@pytest.fixture(scope="module")
def lora_dir(tiny_model_dir, tmp_path_factory):
    """A fresh LoRA adapter on the tiny model, saved: both layouts start from the same adapter
    (a fresh adapter drawn at TP=2 has other random lora_A values than one drawn at TP=1)."""
    from ppo.models.loading import apply_lora, load_causal_lm

    path = str(tmp_path_factory.mktemp("tp_lora"))
    paddle.seed(7)
    apply_lora(load_causal_lm(tiny_model_dir), base_model_name_or_path=tiny_model_dir).save_pretrained(path)
    load_tokenizer(tiny_model_dir).save_pretrained(path)
    return path


@pytest.mark.slow
def test_sft_lora_tp2_matches_tp1(lora_dir, tiny_data_dir, tmp_path):
    """Adapter training under TP=2 (column / row parallel LoRA layers) equals TP=1; the saved
    adapter is merged back into full shapes."""
    from sft.run_sft import main as run_sft

    argv = [
        "config/tiny/sft_argument.json", "--model_name_or_path", lora_dir,
        "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl", "--eval_datasets", "",
        "--max_steps", "3", "--per_device_train_batch_size", "16", "--logging_steps", "1", "--learning_rate", "1e-2",
        "--save_steps", "3", "--warmup_steps", "0", "--disable_tqdm", "true", "--evaluation_strategy", "no",
        "--do_eval", "false",
    ]
    out1, out2 = str(tmp_path / "tp1"), str(tmp_path / "tp2")
    run_sft([*argv, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    launch_run("sft/run_sft.py", [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", "--tensor_parallel_degree", "2"], out2)
    assert_same_steps(out1, out2, "loss/sft", 3)
    a, b = (paddle.load(os.path.join(o, "lora_model_state.pdparams")) for o in (out1, out2))
    assert sorted(a) == sorted(b) and len(a) > 0
    for key in a:
        assert a[key].shape == b[key].shape, key
        np.testing.assert_allclose(b[key].numpy(), a[key].numpy(), atol=WEIGHT_ATOL, rtol=0, err_msg=key)
    start = paddle.load(os.path.join(lora_dir, "lora_model_state.pdparams"))
    assert any(not np.allclose(start[k].numpy(), b[k].numpy()) for k in b)


def test_reward_model_tp2_matches_tp1(tiny_rm_dir, tiny_data_dir, tmp_path):
    from rm.run_reward import main as run_reward

    argv = [
        "config/tiny/rm_argument.json", "--model_name_or_path", tiny_rm_dir,
        "--train_datasets", f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl",
        "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{tiny_data_dir}/preference_eval.jsonl",
        "--max_steps", "3", "--per_device_train_batch_size", "16", "--logging_steps", "1", "--learning_rate", "1e-2",
        "--eval_steps", "3", "--save_steps", "3", "--warmup_steps", "0", "--disable_tqdm", "true",
    ]
    out1, out2 = str(tmp_path / "tp1"), str(tmp_path / "tp2")
    run_reward([*argv, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    launch_run("rm/run_reward.py", [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", "--tensor_parallel_degree", "2"], out2)
    assert_same_steps(out1, out2, "rm/loss", 3)
    assert_same_weights(out1, out2)
    assert_weights_moved(tiny_rm_dir, out2)
    reloaded = AutoModelForScore.from_pretrained(out2)  # the merged TP=2 score model loads at TP=1
    np.testing.assert_allclose(reloaded.score_head.weight.numpy(), saved_weights(out1)["score_head.weight"], atol=WEIGHT_ATOL)


def test_dpo_tp2_matches_tp1(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpo.run_dpo import main as run_dpo

    argv = [
        "config/tiny/dpo_argument.json", "--model_name_or_path", tiny_model_dir,
        "--train_datasets", f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl",
        "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{tiny_data_dir}/preference_eval.jsonl",
        "--eval_generation_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl",
        "--max_steps", "3", "--per_device_train_batch_size", "16", "--logging_steps", "1", "--eval_steps", "3",
        "--warmup_steps", "0", "--learning_rate", "1e-3", "--disable_tqdm", "true", "--eval_max_new_tokens", "6",
    ]
    out1, out2 = str(tmp_path / "tp1"), str(tmp_path / "tp2")
    run_dpo([*argv, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    launch_run("dpo/run_dpo.py", [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", "--tensor_parallel_degree", "2"], out2)
    for key in ("loss/total", "loss/dpo", "logps/chosen", "logps/rejected"):
        assert_same_steps(out1, out2, key, 3)
    assert_same_weights(out1, out2)


def ppo_argv(actor_dir, data_dir, *extra):
    return [
        "--actor_model_name_or_path", actor_dir,
        "--train_datasets", f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
        "--max_steps", "2", "--max_dec_len", "6", "--eval_steps", "2", "--save_steps", "0",
        "--num_sample_generations", "1", "--disable_tqdm", "true", *extra,
    ]


def compare_rl_runs(run, argv, tmp_path, keys, models, out1=None):
    """A TP=2 launch of `argv` against the TP=1 run of `argv` in `out1` (run here when None)."""
    out2 = str(tmp_path / "tp2")
    if out1 is None:
        out1 = str(tmp_path / "tp1")
        run([*argv, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    launch_run("ppo/run_ppo.py", [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", "--tensor_parallel_degree", "2"], out2)
    for key in keys:
        assert_same_steps(out1, out2, key, 2)
    for name in models:
        assert_same_weights(os.path.join(out1, name), os.path.join(out2, name))
    assert_weights_moved(argv[argv.index("--actor_model_name_or_path") + 1], os.path.join(out2, "policy"))
    s1, s2 = (json.load(open(f"{o}/summary.json")) for o in (out1, out2))
    fp1, fp2 = s1["actor_fingerprints"], s2["actor_fingerprints"]
    assert len(fp2) == 2 and fp2[0] == fp2[1]  # whole-model fingerprints agree across the two ranks
    np.testing.assert_allclose(fp2[0], fp1[0], rtol=1e-5)
    samples1, samples2 = read_jsonl(f"{out1}/samples.jsonl"), read_jsonl(f"{out2}/samples.jsonl")
    # same rollouts: the engine ran on the gathered TP=2 weights (PaddleNLP generate samples differently)
    assert [s["response"] for s in samples2] == [s["response"] for s in samples1]
    e1, e2 = s1["final"], s2["final"]
    assert e2["eval/accuracy"] == e1["eval/accuracy"] and e2["eval/response_length"] == e1["eval/response_length"]
    return out1, out2


@pytest.mark.slow
def test_ppo_lagrangian_tp2_matches_tp1(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, tmp_path):
    """Safe RLHF with every model split (the cost model and cost critic too): the multiplier, the
    cost metrics and the three trained models equal the one-process run's."""
    from ppo.run_ppo import main as run_ppo

    argv = ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        tiny_model_dir, tiny_data_dir, "--reward_model_name_or_path", tiny_rm_dir, "--cost_model_name_or_path",
        tiny_rm_dir_cost, "--lambda_lr", "0.5", "--threshold", "0.0", "--per_device_prompt_batch_size", "8",
        "--per_device_train_batch_size", "4", "--learning_rate", "1e-3", "--critic_learning_rate", "1e-3", "--kl_coeff", "0.1",
    )]
    keys = ("loss/policy_avg", "loss/cost_value_avg", "objective/cost", "lagrange/lambda", "lagrange/episode_cost",
            "train/cost_critic_grad_norm")
    compare_rl_runs(run_ppo, argv, tmp_path, keys, ("policy", "value", "cost_value"))


def test_ppo_tp2_matches_tp1(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """Actor, reference, reward model and critic all split; the rollout engine gathers."""
    from ppo.run_ppo import main as run_ppo

    argv = ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        tiny_model_dir, tiny_data_dir, "--reward_model_name_or_path", tiny_rm_dir, "--per_device_prompt_batch_size", "8",
        "--per_device_train_batch_size", "4", "--learning_rate", "1e-3", "--critic_learning_rate", "1e-3",
        "--kl_coeff", "0.1", "--entropy_coeff", "0.01",
    )]
    keys = ("loss/policy_avg", "loss/value_avg", "objective/scores", "objective/kl", "policy/entropy_avg",
            "train/actor_grad_norm", "train/critic_grad_norm")
    compare_rl_runs(run_ppo, argv, tmp_path, keys, ("policy", "value"))


GRPO_KEYS = ("loss/policy_avg", "objective/scores", "loss/kl", "policy/entropy_avg", "train/actor_grad_norm")


def grpo_argv(model_dir, data_dir, *extra):
    return ["config/tiny/grpo_rule_argument.json", *ppo_argv(
        model_dir, data_dir, "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
        "--per_device_train_batch_size", "8", "--learning_rate", "1e-3", "--kl_loss_coeff", "0.05",
        "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer", *extra,  # response length: groups vary
    )]


@pytest.fixture(scope="module")
def grpo_tp1_run(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """The TP=1 GRPO run the three GRPO tests below are held to (run once: eval_mode, the one
    argument the two comparisons differ in, has no effect without tensor parallel; the resume
    test's `--eval_steps 0` only drops evaluations, see there)."""
    from ppo.run_ppo import main as run_ppo

    out1 = str(tmp_path_factory.mktemp("grpo_tp1"))
    run_ppo([*grpo_argv(tiny_model_dir, tiny_data_dir), "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    return out1


def test_grpo_tp2_matches_tp1(tiny_model_dir, tiny_data_dir, grpo_tp1_run, tmp_path):
    """Critic-free, rule rewards in process (response length, so advantages are not all zero),
    a k3 KL loss against the split reference."""
    compare_rl_runs(None, grpo_argv(tiny_model_dir, tiny_data_dir), tmp_path, GRPO_KEYS, ("policy",), out1=grpo_tp1_run)


@pytest.mark.slow
def test_grpo_tp2_with_sharded_rollout_matches_tp1(tiny_model_dir, tiny_data_dir, grpo_tp1_run, tmp_path):
    """eval_mode tensor_parallel: each rank generates from its own slices; same rollouts,
    metrics and weights as the TP=1 run."""
    argv = grpo_argv(tiny_model_dir, tiny_data_dir, "--eval_mode", "tensor_parallel")
    compare_rl_runs(None, argv, tmp_path, GRPO_KEYS, ("policy",), out1=grpo_tp1_run)


@pytest.mark.slow
def test_grpo_tp2_resumes_from_its_merged_checkpoint(tiny_model_dir, tiny_data_dir, grpo_tp1_run, tmp_path):
    """A TP=2 run stopped after step 1 saves a merged checkpoint; resuming it at TP=2 splits the
    weights again and step 2 is the step an uninterrupted TP=1 run takes.

    The uninterrupted run is `grpo_tp1_run`: the same arguments but for `--eval_steps 0` here,
    and its evaluations (before step 1 and after step 2) leave the training steps alone (each
    rollout's seed comes from the run seed and the generation count, not from a shared stream)."""
    argv = grpo_argv(tiny_model_dir, tiny_data_dir, "--eval_steps", "0")
    out1, out2 = grpo_tp1_run, str(tmp_path / "tp2")
    tp2 = [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", "--tensor_parallel_degree", "2"]
    launch_run("ppo/run_ppo.py", [*tp2, "--max_steps", "1"], out2)
    assert os.path.isdir(os.path.join(out2, "checkpoint-1", "policy"))
    assert json.load(open(os.path.join(out2, "checkpoint-1", "policy", "config.json"))).get("tensor_parallel_degree", 1) == 1
    launch_run("ppo/run_ppo.py", [*tp2, "--overwrite_output_dir", "false"], out2)
    for key in ("loss/policy_avg", "objective/scores", "loss/kl", "train/actor_grad_norm"):
        assert_same_steps(out1, out2, key, 2)
    assert_same_weights(os.path.join(out1, "policy"), os.path.join(out2, "policy"))
