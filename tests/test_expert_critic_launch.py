"""PPO with a critic and a reward model on a mixture-of-experts family under expert parallelism,
from a cold `python -m paddle.distributed.launch` on CPU processes (gloo), against one process
with the same global batch: expert parallel 2 (two processes), expert parallel 2 x tensor
parallel 2 (four processes) and expert parallel 2 x sharding stage 1 (two processes), on the tiny
Qwen3-MoE and ERNIE 4.5 MoE of tests/test_expert_tensor_parallel_launch.py (4 experts, top-2,
load-balancing loss off).

The actor and the critic (a score model on the same MoE backbone) are trained, so both have their
experts sharded over the expert group: the critic's value passes exchange tokens as the actor's
do, its gradient norm and clip count each expert once, its experts stay out of fleet's stage-1
partition, and its checkpoint is the one-process layout. The reward model and the reference are
frozen and keep all their experts (split by tensor parallelism alone). Compared: per-step policy,
value and KL losses, scores, entropy, both gradient norms, and the saved policy and critic
weights, against one process and against the same processes with one axis less (EP 2 x TP 2
against TP 2 x DP 2, EP 2 x sharding against EP 2).

Measured against one process: Qwen3-MoE EP 2 losses within 2.3e-6 relative (value loss), weights
within 1.8e-5 (critic's layer-0 dense up_proj); EP 2 x TP 2 losses within 2.8e-6, weights within
2.5e-5, and against TP 2 x DP 2 losses within 9.8e-7, weights within 1.2e-7; EP 2 x sharding stage
1 against EP 2: losses equal, gradient norms within 4.6e-8 relative, weights within 7.5e-9; ERNIE
4.5 MoE: the policy loss 2.6e-6 relative (3.9e-8 absolute at -0.0153), weights within 8.8e-8.
ERNIE 4.5 MoE EP 2 losses within 8.1e-6 (value loss, step 2), weights within 1.1e-5; EP 2 x TP 2
value loss 1.2e-5 relative and policy weights 4.5e-5 (layer 0's attention o_proj) from one
process, where TP 2 x DP 2 alone is as far (1.2e-5, 4.6e-5): EP 2 x TP 2 against TP 2 x DP 2 is
within 4.7e-7 (losses) and 1.7e-6 (weights). Tolerances: those of the EP x TP launch tests
(tests/test_expert_tensor_parallel_launch.py: losses 1e-5 relative, weights 4e-5, against the
layout with one axis less 2e-6 and 3e-6 / ERNIE 1e-5; 5e-6 for the losses against EP 2), but
ERNIE's against one process under EP 2 x TP 2 at the tensor-parallel tests' 2e-5 (losses) and 6e-5
(weights): TP 2 x DP 2's own distance."""
import pytest

from tests.test_expert_parallel_launch import assert_close_runs, assert_sharded
from tests.test_expert_tensor_parallel_launch import (HEADS, SAME_LAYOUT_RTOL, SAME_LAYOUT_WEIGHT_ATOL,
                                                      assert_sharded_per_slice)
from tests.tp_launch import cold_launch_run, worker_logs

pytestmark = pytest.mark.slow

ARCHS = ("qwen3_moe", "ernie45_moe")
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 4e-5
TP_ONE_PROCESS = {"ernie45_moe": (2e-5, 6e-5)}  # (losses, weights) under EP 2 x TP 2: TP 2 x DP 2 alone is as far
SHARDING_RTOL = 5e-6  # EP 2 x sharding against EP 2: ERNIE's policy loss near 0 (-0.0153) 3.9e-8 apart
PPO_KEYS = ("loss/policy_avg", "loss/value_avg", "loss/kl", "objective/scores", "policy/entropy_avg",
            "train/actor_grad_norm", "train/critic_grad_norm")
LAYOUTS = {"one": (1, []), "ep2": (2, ["--expert_parallel_degree", "2"]),
           "tp2_dp2": (4, ["--tensor_parallel_degree", "2"]),
           "ep2_tp2": (4, ["--tensor_parallel_degree", "2", "--expert_parallel_degree", "2"]),
           "ep2_sharding2": (2, ["--expert_parallel_degree", "2", "--sharding", "stage1",
                                 "--sharding_parallel_degree", "2"])}
"""Name: (processes, flags)."""


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    from tests.test_expert_parallel_launch import moe_dir_getter

    return moe_dir_getter(tmp_path_factory, HEADS)


def score_dir(model_dir, path, seed=5):
    """A score model on `model_dir`'s backbone (random head drawn with `seed`) with its tokenizer:
    the reward model, and the critic's initialisation."""
    import paddle

    from ppo.models.loading import load_tokenizer
    from ppo.models.score_model import AutoModelForScore

    paddle.seed(seed)
    AutoModelForScore.from_pretrained(model_dir).save_pretrained(path)
    load_tokenizer(model_dir).save_pretrained(path)
    return path


def ppo_critic_argv(model_dir, rm_dir, data_dir, *extra):
    """PPO (GAE, a critic initialised from the reward model, whitened advantages) on the tiny MoE:
    2 steps of 8 prompts, one answer each, two update iterations of one micro-batch each, as
    tests/test_data_parallel.py's PPO (per-micro-batch token means would differ by layout)."""
    from tests.demo_config_flags import PPO_AS_BEFORE
    from tests.test_tensor_parallel import ppo_argv

    return ["config/tiny/ppo_argument.json", *PPO_AS_BEFORE, *ppo_argv(
        model_dir, data_dir, "--reward_model_name_or_path", rm_dir, "--learning_rate", "1e-3",
        "--critic_learning_rate", "1e-3", "--kl_coeff", "0.1", "--entropy_coeff", "0.01", "--temperature", "1.5",
        "--normalize_advantage", "true", "--update_iters", "2", "--gradient_accumulation_steps", "1",
        "--overwrite_output_dir", "true", *extra)]


def ppo_sizes(data_ranks):
    return ["--per_device_prompt_batch_size", str(8 // data_ranks),
            "--per_device_train_batch_size", str(8 // data_ranks)]


def launch(argv, out, layout):
    nproc, extra = LAYOUTS[layout]
    data_ranks = nproc // 2 if "--tensor_parallel_degree" in extra else nproc
    argv = [*argv, *ppo_sizes(data_ranks), *extra, "--output_dir", out, "--logging_dir", f"{out}/vdl"]
    return cold_launch_run("ppo/run_ppo.py", argv, out, nproc=nproc, cpu_tp_standins=nproc > 1)


def assert_critic_sharded(out, nproc):
    """The two trained models (actor, critic) logged their experts' sharding on every rank; the
    frozen ones (reward model, reference) did not."""
    logs = worker_logs(f"{out}/launch", tail=10**7)
    for rank in range(nproc):
        assert logs.count(f"expert parallel: rank {rank} holds experts") == 2, rank  # not the reward model, reference


@pytest.mark.parametrize("arch", ARCHS)
def test_ppo_with_a_critic_under_expert_parallel_matches_one_process(arch, moe_dirs, tiny_data_dir, tmp_path):
    model_dir = moe_dirs(arch)
    rm_dir = score_dir(model_dir, str(tmp_path / "rm"))
    argv = ppo_critic_argv(model_dir, rm_dir, tiny_data_dir)
    outs = {layout: launch(argv, str(tmp_path / layout), layout) for layout in LAYOUTS}
    for layout in ("ep2", "ep2_tp2", "ep2_sharding2"):
        out, nproc = outs[layout], LAYOUTS[layout][0]
        assert_sharded(out, 2) if nproc == 2 else assert_sharded_per_slice(out)
        assert_critic_sharded(out, nproc)
        rtol, atol = TP_ONE_PROCESS.get(arch, (LOSS_RTOL, WEIGHT_ATOL)) if nproc == 4 else (LOSS_RTOL, WEIGHT_ATOL)
        for sub, keys in (("policy", PPO_KEYS), ("value", ())):
            assert_close_runs(outs["one"], out, keys, 2, sub, atol, rtol)
    for same, out, rtol in (("tp2_dp2", "ep2_tp2", SAME_LAYOUT_RTOL), ("ep2", "ep2_sharding2", SHARDING_RTOL)):
        for sub, keys in (("policy", PPO_KEYS), ("value", ())):  # the same processes, one axis less
            assert_close_runs(outs[same], outs[out], keys, 2, sub, SAME_LAYOUT_WEIGHT_ATOL[arch], rtol)
    assert "init DygraphShardingOptimizer" in worker_logs(f"{outs['ep2_sharding2']}/launch", tail=10**7)
