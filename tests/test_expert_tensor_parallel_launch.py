"""Expert parallel 2 x tensor parallel 2 from a cold `python -m paddle.distributed.launch` on four
CPU processes (gloo), against one process with the same global batch, on the tiny Qwen3-MoE and
ERNIE 4.5 MoE (16 heads, 2 key-value heads, a shared expert, a non-zero selection bias, the
float32 router), 4 experts, top-2.

The layout (`ppo.strategy.expert.layout`): fleet puts ranks 0, 1 (data rank 0) and 2, 3 (data
rank 1) in the tensor-parallel groups; the expert groups are [0, 2] and [1, 3], formed across
the data ranks once per tensor slice, so ranks 0 and 1 hold experts 0 and 1, each split along
its width, and ranks 2 and 3 experts 2 and 3. Each data rank reads half of every batch. SFT and
GRPO; the saved models are the one-process layout (experts gathered over the expert group, then
the slices merged over the tensor group).

The load-balancing loss is off (``router_aux_loss_coef`` 0), as in
tests/test_expert_parallel_launch.py: per data rank it is a non-linear function of the batch.
What remains is rounding: tensor parallelism's partial sums (tests/test_family_tensor_parallel_launch.py)
and data parallelism's averaged gradients. Measured against one process: Qwen3-MoE SFT losses
equal, eval loss within 7e-8 relative, weights within 2.8e-5; GRPO losses, KL, entropy and
gradient norm within 1.4e-6 relative, weights within 2.3e-5 (layer 0's dense up_proj, where
TP 2 x DP 2 alone is as far); ERNIE 4.5 MoE SFT losses within 1.2e-7, eval loss equal, weights
within 1.3e-5; GRPO within 5.2e-7 relative, weights within 2.9e-5. Against TP 2 x DP 2 (the
same processes, every rank all experts' slices; Qwen3-MoE): SFT losses equal, weights within
9.9e-7; GRPO entropy equal, losses within 5.7e-7 relative, weights within 1.2e-7; ERNIE 4.5
MoE weights within 4.2e-6 (SFT) and 3.3e-6 (GRPO). The
tolerances sit a little above (the one-process ones are those of the tensor-parallel tests)."""
import json
import os

import numpy as np
import pytest

from tests.test_expert_parallel_launch import (GRPO_KEYS, assert_close_runs, assert_rank0_samples_lead, grpo_argv,
                                               grpo_sizes, sft_argv)
from tests.tp_launch import cold_launch_run, worker_logs

pytestmark = pytest.mark.slow

ARCHS = ("qwen3_moe", "ernie45_moe")
HEADS = {"qwen3_moe": 4, "ernie45_moe": 16}  # ERNIE's tiny model has one key-value head per 4: 2 with 16 heads
LOSS_RTOL = 1e-5
SFT_WEIGHT_ATOL = 3e-4
GRPO_WEIGHT_ATOL = 4e-5
SAME_LAYOUT_RTOL = 2e-6  # against tensor parallel 2 x data parallel 2
SAME_LAYOUT_WEIGHT_ATOL = {"qwen3_moe": 3e-6, "ernie45_moe": 1e-5}  # ERNIE measured 4.2e-6 (SFT), 3.3e-6 (GRPO)


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    from tests.test_expert_parallel_launch import moe_dir_getter

    return moe_dir_getter(tmp_path_factory, HEADS)


LAYOUTS = {"one": (1, []), "tp2_dp2": (4, ["--tensor_parallel_degree", "2"]),
           "ep2_tp2": (4, ["--tensor_parallel_degree", "2", "--expert_parallel_degree", "2"])}
"""One process; tensor parallel 2 x data parallel 2 (every rank all experts' slices); the same
with expert parallel 2 over the data ranks. Name: (processes, flags)."""

TP_DP_ARCHS = ("qwen3_moe", "ernie45_moe")
"""Where tensor parallel 2 x data parallel 2 runs to compare with: both. On the tiny ERNIE 4.5 MoE
an expert that no token of one data rank reached has no gradient there; fleet's fused
data-parallel all-reduce stopped in gloo ("op.preamble.length <= op.nbytes") on the buffers of
other sizes until `ppo.strategy.grad_sync.fill_unreached_gradients` gave it a zero gradient."""


def runs(script, argv, tmp_path, sizes, arch):
    """The output directories of `script` in every layout (`TP_DP_ARCHS` only: without tensor
    parallel 2 x data parallel 2, None); `sizes(data_ranks)`: the per-device batch flags that
    keep the one-process global batch."""
    outs = []
    for layout, (nproc, extra) in LAYOUTS.items():
        if layout == "tp2_dp2" and arch not in TP_DP_ARCHS:
            outs.append(None)
            continue
        out = str(tmp_path / layout)
        outs.append(cold_launch_run(script, [*argv, *sizes(nproc // 2 if nproc > 1 else 1), *extra, "--output_dir", out,
                                             "--logging_dir", f"{out}/vdl"], out, nproc=nproc, cpu_tp_standins=nproc > 1))
    return outs


def assert_sharded_per_slice(out):
    """Ranks 0, 1 (data rank 0, slices 0 and 1) hold experts 0, 1; ranks 2, 3 experts 2, 3."""
    logs = worker_logs(f"{out}/launch", tail=10**7)
    for rank in range(4):
        owned = "[0, 1]" if rank < 2 else "[2, 3]"
        assert (f"expert parallel: rank {rank} holds experts {owned} of 4 in 1 sparse blocks (expert_parallel_degree 2, "
                f"tensor-parallel slice {rank % 2} of 2)") in logs, rank


@pytest.mark.parametrize("arch", ARCHS)
def test_sft_expert_parallel_with_tensor_parallel_matches_one_process(arch, moe_dirs, tiny_data_dir, tmp_path):
    one, tp_dp, out = runs("sft/run_sft.py", sft_argv(moe_dirs(arch), tiny_data_dir), tmp_path,
                           lambda data_ranks: ["--per_device_train_batch_size", str(8 // data_ranks)], arch)
    assert_sharded_per_slice(out)
    assert_close_runs(one, out, ("loss/sft",), 3, "", SFT_WEIGHT_ATOL, LOSS_RTOL)
    if tp_dp:
        assert_close_runs(tp_dp, out, ("loss/sft",), 3, "", SAME_LAYOUT_WEIGHT_ATOL[arch], SAME_LAYOUT_RTOL)
    s1, s = (json.load(open(f"{o}/summary.json"))["final_eval"] for o in (one, out))
    np.testing.assert_allclose(s["eval/loss"], s1["eval/loss"], rtol=LOSS_RTOL)
    assert s["eval/accuracy"] == s1["eval/accuracy"]  # greedy generation from the gathered, merged weights
    assert json.load(open(os.path.join(out, "config.json"))).get("tensor_parallel_degree", 1) == 1


@pytest.mark.parametrize("arch", ARCHS)
def test_grpo_expert_parallel_with_tensor_parallel_matches_one_process(arch, moe_dirs, tiny_data_dir, tmp_path):
    """The rollout engine generates from the gathered experts (then the gathered slices) on every
    rank, each data rank its own prompts; the log-prob and update passes exchange tokens within
    each tensor slice."""
    one, tp_dp, out = runs("ppo/run_ppo.py", grpo_argv(moe_dirs(arch), tiny_data_dir), tmp_path, grpo_sizes, arch)
    assert_sharded_per_slice(out)
    assert_close_runs(one, out, GRPO_KEYS, 2, "policy", GRPO_WEIGHT_ATOL, LOSS_RTOL)
    if tp_dp:
        assert_close_runs(tp_dp, out, GRPO_KEYS, 2, "policy", SAME_LAYOUT_WEIGHT_ATOL[arch], SAME_LAYOUT_RTOL)
    assert_rank0_samples_lead(one, out)
    assert json.load(open(os.path.join(out, "policy", "config.json"))).get("tensor_parallel_degree", 1) == 1
