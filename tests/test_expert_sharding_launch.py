"""Expert parallel 2 x sharding stage 1 (degree 2) from a cold `python -m paddle.distributed.launch`
on two CPU processes (gloo), against one process with the same global batch and against expert
parallel 2 alone (data parallel), on the tiny Qwen3-MoE and ERNIE 4.5 MoE (the models of
tests/test_expert_parallel_launch.py: 4 experts, top-2, load-balancing loss off). SFT and GRPO.

The sharding group is the expert group (`ppo.strategy.expert.sharding`): fleet's stage-1
optimiser partitions the other parameters over the two ranks (each steps its part and broadcasts
it), and each rank steps its own experts, which are neither reduced nor broadcast over the group.

Measured against EP 2: Qwen3-MoE GRPO entropy equal, losses within 4.1e-7 relative, weights
within 2.1e-7, SFT weights within 7.5e-9; ERNIE 4.5 MoE GRPO bit for bit, SFT weights within
1.4e-7. Against one process: within the EP launch tests' tolerances (GRPO weights within 1.1e-5,
SFT within 6e-6). EP 2 x TP 2 x sharding stage 1 (four processes) equals EP 2 x TP 2 bit for bit
in SFT and GRPO. With the experts left in fleet's partition (each position stepped by one rank
and broadcast over the other's experts), the GRPO comparison fails: losses 6.7e-4 apart."""
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
    from tests.test_expert_parallel_launch import moe_dir_getter

    return moe_dir_getter(tmp_path_factory)


TP_LAYOUTS = {"one": (1, []), "ep2_tp2": (4, ["--tensor_parallel_degree", "2", "--expert_parallel_degree", "2"]),
              "ep2_tp2_sharding2": (4, ["--tensor_parallel_degree", "2", "--expert_parallel_degree", "2", "--sharding",
                                        "stage1", "--sharding_parallel_degree", "2"])}
"""With tensor parallel 2 as well (four processes): fleet's sharding groups [0, 2] and [1, 3]
are the expert groups of the two tensor slices."""


def runs(script, argv, tmp_path, sizes, layouts=None):
    """The output directories of `script` in every layout; `sizes(data_ranks)`: the per-device
    batch flags that keep the one-process global batch."""
    outs = []
    for layout, (nproc, extra) in (layouts or LAYOUTS).items():
        out = str(tmp_path / layout)
        data_ranks = nproc // 2 if "--tensor_parallel_degree" in extra else nproc
        outs.append(cold_launch_run(script, [*argv, *sizes(data_ranks), *extra, "--output_dir", out, "--logging_dir",
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


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_expert_parallel_with_tensor_parallel_and_sharding_stage1_matches_one_process(stage, moe_dirs, tiny_data_dir,
                                                                                      tmp_path):
    """EP 2 x TP 2 x sharding stage 1 (degree 2) on four processes, Qwen3-MoE."""
    from tests.test_expert_tensor_parallel_launch import (GRPO_WEIGHT_ATOL as TP_GRPO_ATOL, LOSS_RTOL as TP_RTOL,
                                                          SFT_WEIGHT_ATOL as TP_SFT_ATOL, assert_sharded_per_slice)

    model = moe_dirs("qwen3_moe")
    if stage == "sft":
        script, argv, keys, sub, atol = "sft/run_sft.py", sft_argv(model, tiny_data_dir), ("loss/sft",), "", TP_SFT_ATOL
        sizes = lambda data_ranks: ["--per_device_train_batch_size", str(8 // data_ranks)]  # noqa: E731
    else:
        script, argv, keys, sub, atol = "ppo/run_ppo.py", grpo_argv(model, tiny_data_dir), GRPO_KEYS, "policy", TP_GRPO_ATOL
        sizes = grpo_sizes
    one, ep_tp, out = runs(script, argv, tmp_path, sizes, TP_LAYOUTS)
    assert_sharded_per_slice(out)
    assert_stage1_sharding(out)
    steps = 3 if stage == "sft" else 2
    assert_close_runs(one, out, keys, steps, sub, atol, TP_RTOL)
    assert_close_runs(ep_tp, out, keys, steps, sub, SAME_EXPERTS_WEIGHT_ATOL, SAME_EXPERTS_RTOL)
