"""PPO and GRPO under pipeline parallel: a pipeline_parallel_degree 2 run on two CPU processes
(actor, reference, reward model and critic each split into two stages; the rollout engine
generates with the stages gathered on every rank) and a plain one-process run from the same
checkpoints give the same per-step metrics, samples, evaluation and saved weights. The stand-ins
that let fleet's pipeline schedule run on CPU processes are in `tests/tp_cpu_collectives.py`."""
import json
import os

import paddle
import pytest

from tests.test_tensor_parallel import assert_same_steps, assert_same_weights, assert_weights_moved, ppo_argv
from tests.test_pipeline_entry import LAYOUTS, PP_ARGS
from tests.tp_launch import launch_run, read_jsonl
from tests.demo_config_flags import PPO_AS_BEFORE



def compare_pipeline_rl_runs(argv, tmp_path, keys, models, steps=2, layout="pp2"):
    from ppo.run_ppo import main as run_ppo

    parallel, nproc = LAYOUTS[layout]
    out1, out2 = str(tmp_path / "pp1"), str(tmp_path / "pp2")
    run_ppo([*argv, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    launch_run("ppo/run_ppo.py", [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", *parallel], out2, nproc=nproc)
    for key in keys:
        assert_same_steps(out1, out2, key, steps)
    for name in models:
        assert_same_weights(os.path.join(out1, name), os.path.join(out2, name))
        assert not any(f.startswith("model_state.pp") for f in os.listdir(os.path.join(out2, name)))
    assert_weights_moved(argv[argv.index("--actor_model_name_or_path") + 1], os.path.join(out2, "policy"))
    s1, s2 = (json.load(open(f"{o}/summary.json")) for o in (out1, out2))
    fp2 = s2["actor_fingerprints"]
    assert len(fp2) == nproc and len(set(fp2)) == 1  # the stages' (and slices') numbers summed: the same on every rank
    samples1, samples2 = read_jsonl(f"{out1}/samples.jsonl"), read_jsonl(f"{out2}/samples.jsonl")
    # same rollouts: the engine generated with the gathered stages
    assert [s["response"] for s in samples2] == [s["response"] for s in samples1]
    e1, e2 = s1["final"], s2["final"]
    assert e2["eval/accuracy"] == e1["eval/accuracy"] and e2["eval/response_length"] == e1["eval/response_length"]
    return out1, out2


@pytest.mark.slow
def test_grpo_pp2_matches_pp1(two_layer_model_dir, tiny_data_dir, tmp_path):
    """Critic-free, rule rewards (response length), a k3 KL loss against the reference pipe,
    an entropy bonus and a ptx loss on supervised data (its batches join the actor's schedule);
    two micro-batches per optimiser step through the schedule. The schedule's micro-batches
    share one shape: the rollout rows and the supervised batches are padded to one width."""
    argv = ["config/tiny/grpo_rule_argument.json", *ppo_argv(
        two_layer_model_dir, tiny_data_dir, "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--learning_rate", "1e-3",
        "--kl_loss_coeff", "0.05", "--entropy_coeff", "0.01", "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer",
        "--ptx_coeff", "0.5", "--ptx_datasets", f"Jsonfile:1.0:{tiny_data_dir}/sft.jsonl",
    )]
    keys = ("loss/policy_avg", "objective/scores", "loss/kl", "policy/entropy_avg", "train/actor_grad_norm",
            "policy/clipfrac_avg", "loss/ptx")
    compare_pipeline_rl_runs(argv, tmp_path, keys, ("policy",))


@pytest.mark.slow
def test_grpo_tp2_pp2_with_sharded_rollout_matches_pp1(two_layer_model_dir, tiny_data_dir, tmp_path):
    """eval_mode tensor_parallel under TP=2 x PP=2 (four processes): the generation copy holds
    this rank's tensor-parallel slices of both stages and the engine generates from them without
    merging; rollouts, metrics, evaluation and weights equal the one-process run's."""
    argv = ["config/tiny/grpo_rule_argument.json", *ppo_argv(
        two_layer_model_dir, tiny_data_dir, "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--learning_rate", "1e-3",
        "--kl_loss_coeff", "0.05", "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer",
        "--eval_mode", "tensor_parallel",
    )]
    keys = ("loss/policy_avg", "objective/scores", "loss/kl", "policy/entropy_avg", "train/actor_grad_norm")
    out1, out2 = compare_pipeline_rl_runs(argv, tmp_path, keys, ("policy",), layout="tp2_pp2")
    assert "each rank keeping its tensor-parallel slices" in open(os.path.join(out2, "launch", "workerlog.0")).read()


@pytest.mark.parametrize("layout", ["pp2", pytest.param("tp2_pp2", marks=pytest.mark.slow)])
def test_ppo_pp2_matches_pp1(two_layer_model_dir, two_layer_score_dir, tiny_data_dir, tmp_path, layout):
    """Actor, reference, reward model and critic all pipelines: reward end scores and critic
    values from the score-model pipes, the GAE critic trained through its own schedule, a KL
    penalty in the rewards against the reference pipe. `tp2_pp2`: every stage also split over
    two tensor-parallel ranks (four processes); the rollout copy and checkpoints merge them."""
    argv = ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        two_layer_model_dir, tiny_data_dir, "--reward_model_name_or_path", two_layer_score_dir,
        "--per_device_prompt_batch_size", "8", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
        "--learning_rate", "1e-3", "--critic_learning_rate", "1e-3", "--kl_coeff", "0.1", "--entropy_coeff", "0.01",
    )]
    keys = ("loss/policy_avg", "loss/value_avg", "objective/scores", "objective/kl", "policy/entropy_avg",
            "train/actor_grad_norm", "train/critic_grad_norm")
    compare_pipeline_rl_runs(argv, tmp_path, keys, ("policy", "value"), layout=layout)


@pytest.mark.slow
def test_ppo_lagrangian_pp2_matches_pp1(two_layer_model_dir, two_layer_score_dir, two_layer_cost_dir, tiny_data_dir,
                                       tmp_path):
    """Safe RLHF under pipeline parallel: the cost model and the cost critic are pipes too (the
    cost objective's score and critic passes, and the cost critic's own schedule in the update),
    and the multiplier, the cost metrics and all three trained models equal the one-process run's."""
    argv = ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        two_layer_model_dir, tiny_data_dir, "--reward_model_name_or_path", two_layer_score_dir,
        "--cost_model_name_or_path", two_layer_cost_dir, "--lambda_lr", "0.5", "--threshold", "0.0",
        "--per_device_prompt_batch_size", "8", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
        "--learning_rate", "1e-3", "--critic_learning_rate", "1e-3", "--kl_coeff", "0.1",
    )]
    keys = ("loss/policy_avg", "loss/value_avg", "loss/cost_value_avg", "objective/cost", "lagrange/lambda",
            "lagrange/episode_cost", "train/cost_critic_grad_norm")
    compare_pipeline_rl_runs(argv, tmp_path, keys, ("policy", "value", "cost_value"))


@pytest.mark.slow
def test_ppo_pp2_resumes_from_its_merged_checkpoint(two_layer_model_dir, two_layer_score_dir, tiny_data_dir, tmp_path):
    """A PP=2 run stopped after step 1 saves merged policy/value checkpoints and each rank's
    optimiser states; resuming at PP=2 loads every stage's weights and AdamW moments back, and
    step 2 is the step an uninterrupted one-process run takes."""
    from ppo.run_ppo import main as run_ppo

    argv = ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        two_layer_model_dir, tiny_data_dir, "--reward_model_name_or_path", two_layer_score_dir,
        "--per_device_prompt_batch_size", "8", "--per_device_train_batch_size", "4", "--learning_rate", "1e-3",
        "--critic_learning_rate", "1e-3", "--kl_coeff", "0.1", "--eval_steps", "0",
        "--lr_scheduler_type", "constant",  # the stopped run plans 1 step: a decaying schedule would differ
    )]
    out1, out2 = str(tmp_path / "pp1"), str(tmp_path / "pp2")
    run_ppo([*argv, "--output_dir", out1, "--logging_dir", f"{out1}/vdl"])
    pp2 = [*argv, "--output_dir", out2, "--logging_dir", f"{out2}/vdl", *PP_ARGS]
    launch_run("ppo/run_ppo.py", [*pp2, "--max_steps", "1"], out2)
    for name in ("policy", "value"):
        saved = paddle.load(os.path.join(out2, "checkpoint-1", name, "model_state.pdparams"))
        assert any(k.startswith("llama.layers.1.") for k in saved)  # both stages in one plain checkpoint
    assert sorted(f for f in os.listdir(os.path.join(out2, "checkpoint-1")) if f.endswith(".pdopt")) == [
        f"{name}_optimizer.rank{r}.pdopt" for name in ("policy", "value") for r in (0, 1)
    ]
    launch_run("ppo/run_ppo.py", [*pp2, "--overwrite_output_dir", "false"], out2)
    assert "resumed from" in open(os.path.join(out2, "launch", "workerlog.0")).read()
    for key in ("loss/policy_avg", "loss/value_avg", "objective/scores", "train/actor_grad_norm", "train/critic_grad_norm"):
        assert_same_steps(out1, out2, key, 2)
    for name in ("policy", "value"):
        assert_same_weights(os.path.join(out1, name), os.path.join(out2, name))
