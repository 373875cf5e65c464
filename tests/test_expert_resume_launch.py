"""Resuming expert-parallel runs from a checkpoint, from a cold `python -m paddle.distributed.launch`
on CPU processes (gloo): a run stopped after a checkpoint and started again from it alone ends
where the uninterrupted run ends, bit for bit (losses and every saved weight). Expert parallel 2 x
tensor parallel 2 (four processes): GRPO on the tiny Qwen3-MoE and ERNIE 4.5 MoE, PPO with a
critic and SFT on Qwen3-MoE; expert parallel 2 x sharding stage 1 (two processes): GRPO on both,
PPO with a critic and SFT on Qwen3-MoE. The tiny models of tests/test_expert_tensor_parallel_launch.py.

PPO/GRPO checkpoints hold the one-process model layout (experts gathered over the expert group,
slices merged over the tensor group) and one optimiser file per rank, each with the AdamW moments
of that rank's own experts (slices), checked below for the actor and the critic; under sharding
stage 1 also its part of the other parameters' moments. SFT's (PaddleNLP's Trainer) hold one
model file per tensor slice, each with every expert's slice, and each rank's expert moments in
``expert_optimizer.rank{r}.pdopt``.

Two bugs these tests found: an SFT resume under EP x TP looked for ``model_state.pdparams`` and
stopped (`ppo.strategy.expert.trainer` now reads the slice's ``model_state.tp0{m}.pdparams``);
an SFT resume under EP x sharding stage 1 skipped an expert that no token reached in step 3,
where the uninterrupted run steps it from its zeroed gradient, and ended 1.3e-4 away
(`ppo.optimization.stepped` now applies its rule to the experts a sharding optimiser keeps local).
Zeroing the experts' moments in a checkpoint moves the resumed EP x sharding GRPO run's step-2
policy loss by 4.6e-3 relative and its experts by 2.8e-3: the comparison sees lost moments."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from tests.test_expert_critic_launch import ppo_critic_argv, ppo_sizes, score_dir
from tests.test_expert_parallel_launch import GRPO_KEYS, grpo_argv, grpo_sizes, saved_weights
from tests.test_expert_tensor_parallel_launch import HEADS
from tests.tp_launch import cold_launch_run, read_jsonl, step_values, worker_logs

pytestmark = pytest.mark.slow

EP_TP = ["--tensor_parallel_degree", "2", "--expert_parallel_degree", "2"]
EP_SHARDING = ["--expert_parallel_degree", "2", "--sharding", "stage1", "--sharding_parallel_degree", "2"]
PPO_KEYS = ("loss/policy_avg", "loss/value_avg", "loss/kl", "objective/scores", "policy/entropy_avg",
            "train/actor_grad_norm", "train/critic_grad_norm")


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    from tests.test_expert_parallel_launch import moe_dir_getter

    return moe_dir_getter(tmp_path_factory, HEADS)


def launch(argv, out, nproc):
    return cold_launch_run("ppo/run_ppo.py", [*argv, "--output_dir", out, "--logging_dir", f"{out}/vdl"], out,
                           nproc=nproc, cpu_tp_standins=nproc > 1)


def straight_and_resumed(argv, tmp_path, nproc):
    """The uninterrupted 2-step run of `argv` (a checkpoint after every step) and the run started
    again from its step-1 checkpoint alone (what a kill after step 1's save leaves)."""
    argv = [*argv, "--save_steps", "1", "--save_total_limit", "3", "--overwrite_output_dir", "true"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    launch(argv, straight, nproc)
    os.makedirs(resumed)
    shutil.copytree(f"{straight}/checkpoint-1", f"{resumed}/checkpoint-1")
    with open(f"{resumed}/metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in read_jsonl(f"{straight}/metrics.jsonl") if r.get("step", 0) <= 1)
    launch([*argv, "--overwrite_output_dir", "false"], resumed, nproc)
    assert f"resumed from {resumed}/checkpoint-1 at step 1" in worker_logs(f"{resumed}/launch", tail=10**7)
    return straight, resumed


def assert_expert_moments_per_rank(checkpoint, name, holders):
    """`{rank: experts}`: each rank's optimiser file holds moments of its own experts, no other's."""
    for rank, experts in holders.items():
        state = json.dumps(sorted(paddle.load(f"{checkpoint}/{name}_optimizer.rank{rank}.pdopt")))
        for e in range(4):
            assert (f"experts.{e}.up_proj.weight_moment1" in state) == (e in experts), (rank, e)


def assert_resumed_equal(straight, resumed, keys, models):
    for key in keys:
        assert step_values(resumed, key) == step_values(straight, key), key
    for sub in models:
        a, b = saved_weights(f"{straight}/{sub}"), saved_weights(f"{resumed}/{sub}")
        assert sorted(a) == sorted(b) and any("experts.3." in k for k in a)
        for key in a:
            np.testing.assert_array_equal(b[key], a[key], err_msg=f"{sub}: {key}")


@pytest.mark.parametrize("arch", ["qwen3_moe", "ernie45_moe"])
def test_grpo_expert_parallel_with_tensor_parallel_resumes_exactly(arch, moe_dirs, tiny_data_dir, tmp_path):
    straight, resumed = straight_and_resumed([*grpo_argv(moe_dirs(arch), tiny_data_dir, *grpo_sizes(2)), *EP_TP],
                                             tmp_path, 4)
    assert_expert_moments_per_rank(f"{straight}/checkpoint-1", "policy", {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)})
    assert_resumed_equal(straight, resumed, GRPO_KEYS, ("policy",))


@pytest.mark.parametrize("layout", ["ep2_tp2", "ep2_sharding2"])
def test_ppo_with_a_critic_resumes_exactly_with_tensor_parallel_or_sharding(layout, moe_dirs, tiny_data_dir, tmp_path):
    """The critic's experts' moments are saved and restored per rank too (Qwen3-MoE)."""
    model_dir = moe_dirs("qwen3_moe")
    rm_dir = score_dir(model_dir, str(tmp_path / "rm"))
    nproc, extra, holders = (4, EP_TP, {0: (0, 1), 2: (2, 3)}) if layout == "ep2_tp2" else (
        2, EP_SHARDING, {0: (0, 1), 1: (2, 3)})
    argv = [*ppo_critic_argv(model_dir, rm_dir, tiny_data_dir), *ppo_sizes(2), *extra]  # two data ranks in both
    straight, resumed = straight_and_resumed(argv, tmp_path, nproc)
    for name in ("policy", "value"):
        assert_expert_moments_per_rank(f"{straight}/checkpoint-1", name, holders)
    assert_resumed_equal(straight, resumed, PPO_KEYS, ("policy", "value"))


@pytest.mark.parametrize("arch", ["qwen3_moe", "ernie45_moe"])
def test_grpo_expert_parallel_with_sharding_stage1_resumes_exactly(arch, moe_dirs, tiny_data_dir, tmp_path):
    straight, resumed = straight_and_resumed([*grpo_argv(moe_dirs(arch), tiny_data_dir, *grpo_sizes(2)), *EP_SHARDING],
                                             tmp_path, 2)
    assert "init DygraphShardingOptimizer" in worker_logs(f"{straight}/launch", tail=10**7)
    assert_expert_moments_per_rank(f"{straight}/checkpoint-1", "policy", {0: (0, 1), 1: (2, 3)})
    assert_resumed_equal(straight, resumed, GRPO_KEYS, ("policy",))


@pytest.mark.parametrize("layout", ["ep2_tp2", "ep2_sharding2"])
def test_sft_expert_parallel_resumes_exactly_with_tensor_parallel_or_sharding(layout, moe_dirs, tiny_data_dir,
                                                                             tmp_path):
    """SFT through PaddleNLP's Trainer under EP 2 x TP 2 and EP 2 x sharding stage 1 (Qwen3-MoE):
    resumed from checkpoint-2, each rank takes its experts (their slices under TP, from the
    slice's ``model_state.tp0{m}.pdparams``) and their AdamW states
    (``expert_optimizer.rank{r}.pdopt``) back, and step 3 ends with the uninterrupted run's
    weights, bit for bit."""
    from tests.test_expert_parallel_launch import sft_argv

    nproc, extra = (4, EP_TP) if layout == "ep2_tp2" else (2, EP_SHARDING)
    argv = [*sft_argv(moe_dirs("qwen3_moe"), tiny_data_dir), "--per_device_train_batch_size", "4", "--save_steps", "1",
            "--save_total_limit", "5", "--learning_rate", "1e-3", *extra]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    for out, again in ((straight, []), (resumed, ["--overwrite_output_dir", "false"])):
        if again:
            os.makedirs(resumed)
            shutil.copytree(f"{straight}/checkpoint-2", f"{resumed}/checkpoint-2")
        cold_launch_run("sft/run_sft.py", [*argv, *again, "--output_dir", out, "--logging_dir", f"{out}/vdl"], out,
                        nproc=nproc, cpu_tp_standins=True)
    assert sorted(f for f in os.listdir(f"{straight}/checkpoint-2") if f.startswith("expert_optimizer")) == [
        f"expert_optimizer.rank{r}.pdopt" for r in range(nproc)]
    assert "Starting training from resume_from_checkpoint" in worker_logs(f"{resumed}/launch", tail=10**7)
    assert step_values(resumed, "loss/sft") == {3: step_values(straight, "loss/sft")[3]}
    assert_resumed_equal(straight, resumed, (), ("",))
