"""Expert parallel 2 x sharding stage 1 (degree 2) from a cold `python -m paddle.distributed.launch`
on two CPU processes (gloo), against one process with the same global batch and against expert
parallel 2 alone (data parallel), on the tiny Qwen3-MoE and ERNIE 4.5 MoE (the models of
tests/test_expert_parallel_launch.py: 4 experts, top-2, load-balancing loss off). SFT and GRPO.

The sharding group is the expert group (`ppo.strategy.expert.sharding`): fleet's stage-1
optimiser partitions the other parameters over the two ranks (each steps its part and broadcasts
it), and each rank steps its own experts, which are neither reduced nor broadcast over the group."""
import pytest

from tests.test_expert_parallel_launch import (GRPO_KEYS, GRPO_WEIGHT_ATOL, LOSS_RTOL, SFT_WEIGHT_ATOL,
                                               assert_close_runs, assert_rank0_samples_lead, assert_sharded, grpo_argv,
                                               grpo_sizes, sft_argv)
from tests.tp_launch import cold_launch_run, worker_logs

pytestmark = pytest.mark.slow

ARCHS = ("qwen3_moe", "ernie45_moe")
LAYOUTS = {"one": (1, []), "ep2": (2, ["--expert_parallel_degree", "2"]),
           "ep2_sharding2": (2, ["--expert_parallel_degree", "2", "--sharding", "stage1", "--sharding_parallel_degree", "2"])}
SAME_EXPERTS_RTOL, SAME_EXPERTS_WEIGHT_ATOL = 2e-6, 3e-6  # against expert parallel 2 alone


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    from tests.test_expert_parallel_launch import build_moe_dir

    built = {}

    def get(arch):
        if arch not in built:
            built[arch] = build_moe_dir(str(tmp_path_factory.mktemp(f"tiny_{arch}")), arch)
        return built[arch]

    return get


def runs(script, argv, tmp_path, sizes):
    """The output directories of `script` in every layout; `sizes(data_ranks)`: the per-device
    batch flags that keep the one-process global batch."""
    outs = []
    for layout, (nproc, extra) in LAYOUTS.items():
        out = str(tmp_path / layout)
        outs.append(cold_launch_run(script, [*argv, *sizes(nproc), *extra, "--output_dir", out, "--logging_dir",
                                             f"{out}/vdl"], out, nproc=nproc, cpu_tp_standins=nproc > 1))
    return outs


def assert_stage1_sharding(out):
    assert "init DygraphShardingOptimizer" in worker_logs(f"{out}/launch", tail=10**7)


@pytest.mark.parametrize("arch", ARCHS)
def test_sft_expert_parallel_with_sharding_stage1_matches_one_process(arch, moe_dirs, tiny_data_dir, tmp_path):
    one, ep, out = runs("sft/run_sft.py", sft_argv(moe_dirs(arch), tiny_data_dir), tmp_path,
                        lambda data_ranks: ["--per_device_train_batch_size", str(8 // data_ranks)])
    assert_sharded(out, 2)
    assert_stage1_sharding(out)
    assert_close_runs(one, out, ("loss/sft",), 3, "", SFT_WEIGHT_ATOL[arch], LOSS_RTOL[arch])
    assert_close_runs(ep, out, ("loss/sft",), 3, "", SAME_EXPERTS_WEIGHT_ATOL, SAME_EXPERTS_RTOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_grpo_expert_parallel_with_sharding_stage1_matches_one_process(arch, moe_dirs, tiny_data_dir, tmp_path):
    one, ep, out = runs("ppo/run_ppo.py", grpo_argv(moe_dirs(arch), tiny_data_dir), tmp_path, grpo_sizes)
    assert_sharded(out, 2)
    assert_stage1_sharding(out)
    assert_close_runs(one, out, GRPO_KEYS, 2, "policy", GRPO_WEIGHT_ATOL[arch], LOSS_RTOL[arch])
    assert_close_runs(ep, out, GRPO_KEYS, 2, "policy", SAME_EXPERTS_WEIGHT_ATOL, SAME_EXPERTS_RTOL)
    assert_rank0_samples_lead(one, out)
