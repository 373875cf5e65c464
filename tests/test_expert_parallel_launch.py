"""Expert parallelism from a cold `python -m paddle.distributed.launch` on CPU processes (gloo),
against one process with the same global batch, on the tiny Qwen3-MoE, ERNIE 4.5 MoE (a shared
expert, a non-zero selection bias, the float32 router), Qwen2-MoE (a gated shared expert) and
Mixtral (every layer sparse), all 4 experts, top-2:
expert parallel 2 (two processes, two experts each, each reading half of every batch) and
expert parallel 2 x data parallel 2 (four processes: expert groups [0, 1] and [2, 3] carved out
of the data ranks). SFT and GRPO; the saved models are the one-process layout.

The model's load-balancing loss is off here (``router_aux_loss_coef`` 0): like data parallelism
(PaddleNLP, transformers), each rank computes it over its own tokens, a non-linear function of
the batch (measured: it moves GRPO's policy loss by up to 6e-4 relative against one process,
alike with and without expert parallelism). Without it, what remains is rounding: the expert
exchange itself is exact (tests/test_expert_parallel.py), but data-parallel gradients are
averaged per rank and expert gradients are summed over the rows of several ranks. Measured
against one process (two steps of GRPO, three of SFT at learning rate 1e-2): GRPO losses,
KL, entropy and gradient norm within 7e-7 relative, weights within 9.3e-7; SFT losses within
1.1e-7 relative, eval loss equal, weights within 7.4e-6 (EP 2) and 4.6e-5 (EP 2 x DP 2: Adam
turns rounding on near-zero gradients into a few 1e-5, as tests/test_data_tensor_parallel.py
measures for pipelines). ERNIE 4.5 MoE, the same runs: GRPO losses, KL and gradient norm
within 4.8e-7 relative, entropy within 3.1e-6 (step 2), weights within 8.1e-6, and data parallel
2 alone on it as far from one process (entropy 2.4e-6, weights 6.2e-6; EP 2 against DP 2:
entropy equal, weights within 1.9e-6); SFT losses within 1.1e-7 relative, eval loss within
7e-8, weights within 5.7e-5 (EP 2) and 1.1e-4 (EP 2 x DP 2, two of 8,192 entries above 1e-5).
Qwen2-MoE: GRPO losses, KL and gradient norm within 4.8e-7 relative, entropy within 2.2e-6,
weights within 1.7e-5 (DP 2 alone: KL 1.9e-6, weights 1.7e-5); SFT losses within 6e-8, eval
loss equal, weights within 2.5e-5. Mixtral: SFT losses within 1.1e-7, eval loss equal, weights
within 1.8e-5; GRPO (EP 2) losses within 1.4e-6 relative, weights within 1.2e-5, once each expert
ran every rank's rows as a matmul of their own (before: 1.8e-3, see ppo/strategy/expert/exchange.py).
The tolerances sit a little above.

Four CPU processes with groups of different members need the test stand-in for gloo's group
rendezvous (`tests/tp_cpu_collectives.install_group_stores`, installed by the cold-launch
site); expert parallel 2 on two processes uses the default group only."""
import json
import os
import shutil

import numpy as np
import pytest

from ppo.strategy.expert.checks import expert_count
from tests.test_tensor_parallel import ppo_argv, saved_weights
from tests.tp_launch import cold_launch_run, read_jsonl, step_values, worker_logs

pytestmark = pytest.mark.slow

LOSS_RTOL = {"qwen3_moe": 2e-6, "ernie45_moe": 5e-6, "qwen2_moe": 5e-6, "mixtral": 5e-6}
SFT_WEIGHT_ATOL = {"qwen3_moe": 1e-4, "ernie45_moe": 2.5e-4, "qwen2_moe": 1e-4, "mixtral": 1e-4}  # Adam at 1e-2, see above
GRPO_WEIGHT_ATOL = {"qwen3_moe": 2e-5, "ernie45_moe": 2e-5, "qwen2_moe": 2.5e-5, "mixtral": 2.5e-5}
SPARSE_BLOCKS = {"mixtral": 2}  # every layer; the others' first layer is dense


ARCHS = ("qwen3_moe", "ernie45_moe", "qwen2_moe", "mixtral")
"""Qwen3-MoE (routed experts only) and ERNIE 4.5 MoE (a shared expert, a non-zero selection bias
set below, the router in float32): both 4 experts, top-2, one sparse layer."""


def build_moe_dir(path, arch, num_heads=4):
    """A tiny `arch` model without the load-balancing loss; ERNIE's selection bias made non-zero
    (it changes some tokens' experts), as a trained checkpoint's is."""
    import paddle

    from ppo.tiny.factory import build_tiny

    build_tiny(path, seed=5, hidden_size=64, num_layers=2, num_heads=num_heads, intermediate_size=128, arch=arch)
    config_file = os.path.join(path, "config.json")
    config = json.load(open(config_file))
    json.dump(dict(config, router_aux_loss_coef=0.0), open(config_file, "w"))
    weights_file = os.path.join(path, "model_state.pdparams")
    weights = paddle.load(weights_file)
    for key in [k for k in weights if k.endswith("e_score_correction_bias")]:
        weights[key] = paddle.to_tensor([[0.0, 0.01, -0.01, 0.005]])
    paddle.save(weights, weights_file)
    return path


def moe_dir_getter(tmp_path_factory, heads=None):
    """`arch` -> its tiny model directory (`build_moe_dir`, `heads[arch]` heads when given), built once."""
    built = {}

    def get(arch):
        if arch not in built:
            extra = (heads[arch],) if heads else ()
            built[arch] = build_moe_dir(str(tmp_path_factory.mktemp(f"tiny_{arch}")), arch, *extra)
        return built[arch]

    return get


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    """`arch` -> its tiny model directory, built once per module."""
    return moe_dir_getter(tmp_path_factory)


@pytest.fixture(scope="module")
def moe_dir(moe_dirs):
    return moe_dirs("qwen3_moe")


def launch(script, argv, out, nproc, expert=True):
    ep = ["--expert_parallel_degree", "2"] if expert else []
    return cold_launch_run(script, [*argv, *ep, "--output_dir", out, "--logging_dir", f"{out}/vdl"], out, nproc=nproc,
                           cpu_tp_standins=nproc == 4)


def assert_sharded(out, nproc, blocks=1):
    logs = worker_logs(f"{out}/launch", tail=10**7)
    for rank in range(nproc):
        owned = "[0, 1]" if rank % 2 == 0 else "[2, 3]"
        assert f"expert parallel: rank {rank} holds experts {owned} of 4 in {blocks} sparse blocks" in logs, rank


def assert_close_runs(out1, out, keys, steps, weights_sub, atol, rtol=LOSS_RTOL["qwen3_moe"]):
    for key in keys:
        v1, v = step_values(out1, key), step_values(out, key)
        assert sorted(v) == sorted(v1) == list(range(1, steps + 1)), (key, v1, v)
        np.testing.assert_allclose([v[s] for s in v1], [v1[s] for s in v1], rtol=rtol, atol=1e-9, err_msg=key)
    a, b = saved_weights(os.path.join(out1, weights_sub)), saved_weights(os.path.join(out, weights_sub))
    assert sorted(a) == sorted(b) and any("experts.3." in k for k in b)  # every expert, one-process names
    for key in a:
        np.testing.assert_allclose(b[key], a[key], atol=atol, rtol=0, err_msg=key)
    config = json.load(open(os.path.join(out, weights_sub, "config.json")))
    assert expert_count(config)[1] == 4 and "expert_parallel_degree" not in config


def sft_argv(model_dir, data_dir):
    return ["config/tiny/sft_argument.json", "--model_name_or_path", model_dir,
            "--train_datasets", f"Jsonfile:1.0:{data_dir}/sft.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
            "--max_steps", "3", "--gradient_accumulation_steps", "2", "--per_device_eval_batch_size", "8",
            "--logging_steps", "1", "--learning_rate", "1e-2", "--eval_steps", "3", "--save_steps", "3",
            "--warmup_steps", "0", "--disable_tqdm", "true", "--eval_max_new_tokens", "6"]


@pytest.mark.parametrize("arch", ARCHS)
def test_sft_expert_parallel_matches_one_process(arch, moe_dirs, tiny_data_dir, tmp_path):
    argv = sft_argv(moe_dirs(arch), tiny_data_dir)
    one = launch("sft/run_sft.py", [*argv, "--per_device_train_batch_size", "8"], str(tmp_path / "one"), 1, expert=False)
    for nproc in (2, 4):
        out = launch("sft/run_sft.py", [*argv, "--per_device_train_batch_size", str(8 // nproc)], str(tmp_path / f"ep_{nproc}"), nproc)
        assert_sharded(out, nproc, SPARSE_BLOCKS.get(arch, 1))
        assert_close_runs(one, out, ("loss/sft",), 3, "", SFT_WEIGHT_ATOL[arch], LOSS_RTOL[arch])
        s1, s = (json.load(open(f"{o}/summary.json"))["final_eval"] for o in (one, out))
        np.testing.assert_allclose(s["eval/loss"], s1["eval/loss"], rtol=LOSS_RTOL[arch])
        assert s["eval/accuracy"] == s1["eval/accuracy"]


def grpo_argv(model_dir, data_dir, *extra):
    return ["config/tiny/grpo_rule_argument.json", *ppo_argv(
        model_dir, data_dir, "--rollout_n", "4", "--gradient_accumulation_steps", "1", "--learning_rate", "1e-3",
        "--kl_loss_coeff", "0.05", "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer",
        "--overwrite_output_dir", "true", *extra)]


GRPO_KEYS = ("loss/policy_avg", "loss/kl", "objective/scores", "policy/entropy_avg", "train/actor_grad_norm")


def grpo_sizes(nproc):
    return ["--per_device_prompt_batch_size", str(4 // nproc), "--per_device_train_batch_size", str(16 // nproc)]


def assert_rank0_samples_lead(one, out):
    """Rank 0's logged samples are the first rows of the one-process run's of the same step."""
    by_step = ({}, {})
    for rows, run in zip(by_step, (one, out)):
        for r in read_jsonl(f"{run}/samples.jsonl"):
            rows.setdefault(r["step"], []).append(r["response"])
    assert sorted(by_step[1]) == sorted(by_step[0]) and by_step[1]
    for step, responses in by_step[1].items():
        assert responses == by_step[0][step][:len(responses)], step


@pytest.mark.parametrize("arch", ARCHS)
def test_grpo_expert_parallel_matches_one_process(arch, moe_dirs, tiny_data_dir, tmp_path):
    """The rollout engine generates from the gathered experts on every rank (each its own
    prompts); the log-prob and update passes exchange tokens; the same samples result. Data
    parallel alone on the same model (every rank all experts) matches too: its all-reduce is
    told that an expert may get no gradient on a rank (before, gloo timed out there)."""
    moe_dir = moe_dirs(arch)
    one = launch("ppo/run_ppo.py", grpo_argv(moe_dir, tiny_data_dir, *grpo_sizes(1)), str(tmp_path / "one"), 1, expert=False)
    for nproc, expert in ((2, False), (2, True), (4, True)):
        out = launch("ppo/run_ppo.py", grpo_argv(moe_dir, tiny_data_dir, *grpo_sizes(nproc)),
                     str(tmp_path / f"{'ep' if expert else 'dp'}_{nproc}"), nproc, expert)
        if expert:
            assert_sharded(out, nproc, SPARSE_BLOCKS.get(arch, 1))
        assert_close_runs(one, out, GRPO_KEYS, 2, "policy", GRPO_WEIGHT_ATOL[arch], LOSS_RTOL[arch])
        assert_rank0_samples_lead(one, out)


def test_grpo_expert_parallel_with_the_router_loss_matches_data_parallel(tiny_data_dir, tmp_path):
    """With the load-balancing loss on (the tiny model's 0.001), expert parallel 2 against data
    parallel 2 (each rank its own tokens' router loss in both): the exchange changes only
    rounding. Measured: losses, KL and gradient norm within 5e-7 relative, ``moe/aux_loss``
    within 3e-8, weights within 1.2e-6 (both are 5.6e-4 relative from one process in the policy
    loss at step 2, and 6e-3 in the weights, by the per-rank router loss)."""
    from ppo.tiny.factory import build_tiny

    model_dir = str(tmp_path / "tiny_qwen3_moe")
    build_tiny(model_dir, seed=5, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, arch="qwen3_moe")
    argv = grpo_argv(model_dir, tiny_data_dir, *grpo_sizes(2))
    dp = launch("ppo/run_ppo.py", argv, str(tmp_path / "dp"), 2, expert=False)
    ep = launch("ppo/run_ppo.py", argv, str(tmp_path / "ep"), 2)
    assert_close_runs(dp, ep, (*GRPO_KEYS, "moe/aux_loss"), 2, "policy", GRPO_WEIGHT_ATOL["qwen3_moe"])


def test_grpo_expert_parallel_resumes_exactly(moe_dir, tiny_data_dir, tmp_path):
    """A run stopped after its step-1 checkpoint (one-process model layout, one optimiser file
    per rank holding that rank's experts' moments) and started again ends where the
    uninterrupted run ends, bit for bit."""
    argv = grpo_argv(moe_dir, tiny_data_dir, *grpo_sizes(2), "--save_steps", "1", "--save_total_limit", "3")
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    launch("ppo/run_ppo.py", argv, straight, 2)
    os.makedirs(resumed)
    shutil.copytree(f"{straight}/checkpoint-1", f"{resumed}/checkpoint-1")  # what a kill after step 1 leaves
    with open(f"{resumed}/metrics.jsonl", "w") as f:
        f.writelines(open(f"{straight}/metrics.jsonl").readlines()[:2])
    launch("ppo/run_ppo.py", [*argv, "--overwrite_output_dir", "false"], resumed, 2)
    assert f"resumed from {resumed}/checkpoint-1 at step 1" in worker_logs(f"{resumed}/launch", tail=10**7)
    for key in GRPO_KEYS:
        assert step_values(resumed, key) == step_values(straight, key), key
    a, b = saved_weights(f"{straight}/policy"), saved_weights(f"{resumed}/policy")
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)


def test_sft_expert_parallel_resumes_exactly(moe_dir, tiny_data_dir, tmp_path):
    """PaddleNLP's Trainer writes rank 0's optimiser file and loads a resumed model on rank 0
    only; each rank's experts (weights from the one-process checkpoint, AdamW states from its
    ``expert_optimizer.rank{r}.pdopt``) come back too, so a run resumed from checkpoint-2 ends
    with the uninterrupted run's weights, bit for bit. An expert of layer 1 that no token of the
    tiny model's template vocabulary reaches in step 3 is stepped by AdamW from a zero gradient
    in both runs (`ppo.optimization.stepped`; before, the resumed run skipped it and ended up to
    1.3e-4 away)."""
    argv = [*sft_argv(moe_dir, tiny_data_dir), "--per_device_train_batch_size", "4", "--save_steps", "1",
            "--save_total_limit", "5", "--learning_rate", "1e-3"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    launch("sft/run_sft.py", argv, straight, 2)
    assert sorted(f for f in os.listdir(f"{straight}/checkpoint-2") if f.startswith("expert_optimizer")) == [
        "expert_optimizer.rank0.pdopt", "expert_optimizer.rank1.pdopt"]
    os.makedirs(resumed)
    shutil.copytree(f"{straight}/checkpoint-2", f"{resumed}/checkpoint-2")
    launch("sft/run_sft.py", [*argv, "--overwrite_output_dir", "false"], resumed, 2)
    assert "Starting training from resume_from_checkpoint" in worker_logs(f"{resumed}/launch", tail=10**7)
    assert step_values(resumed, "loss/sft") == {3: step_values(straight, "loss/sft")[3]}
    a, b = saved_weights(straight), saved_weights(resumed)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)
