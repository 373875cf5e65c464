"""A mixture-of-experts SFT run resumed from a checkpoint ends where the uninterrupted run ends,
bit for bit, in one process (PaddleNLP's Trainer path). The tiny Qwen3-MoE at learning rate
1e-3: in step 3 no token reaches expert 2 of layer 1; the uninterrupted run steps it from its
zeroed gradient (AdamW's momentum moves it), and so does the resumed run now
(`ppo.optimization.stepped`). Before, the resumed run skipped it: its weights ended 1.3e-4 away.
The expert-parallel launch of the same check is in tests/test_expert_parallel_launch.py."""
import os
import shutil

import numpy as np
import paddle

from tests.test_expert_parallel_launch import build_moe_dir, sft_argv
from tests.test_tensor_parallel import saved_weights
from tests.tp_launch import step_values


def test_sft_on_a_moe_resumes_exactly(tiny_data_dir, tmp_path):
    from sft.run_sft import main as run_sft

    model = build_moe_dir(str(tmp_path / "tiny_qwen3_moe"), "qwen3_moe")
    argv = [*sft_argv(model, tiny_data_dir), "--per_device_train_batch_size", "8", "--save_steps", "1",
            "--save_total_limit", "5", "--learning_rate", "1e-3", "--eval_steps", "100", "--eval_max_new_tokens", "1"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    with paddle.utils.unique_name.guard():  # the resumed optimiser's state names are the saved run's
        run_sft([*argv, "--output_dir", straight, "--logging_dir", f"{straight}/vdl"])
    os.makedirs(resumed)
    shutil.copytree(f"{straight}/checkpoint-2", f"{resumed}/checkpoint-2")
    with paddle.utils.unique_name.guard():
        run_sft([*argv, "--output_dir", resumed, "--logging_dir", f"{resumed}/vdl", "--overwrite_output_dir", "false"])
    assert step_values(resumed, "loss/sft") == {3: step_values(straight, "loss/sft")[3]}
    a, b, at_2 = saved_weights(straight), saved_weights(resumed), saved_weights(f"{straight}/checkpoint-2")
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)
    key = "qwen3_moe.layers.1.mlp.experts.2.up_proj.weight"
    assert 1e-5 < np.abs(a[key] - at_2[key]).max() < 1e-2  # stepped in step 3 without a token
