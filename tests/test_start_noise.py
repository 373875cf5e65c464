"""A run's console says each real fact once, at INFO: one line when the custom ops are missing
(not one per caller), no Paddle UserWarning or glog type-promotion line from this toolkit's own
calls, none of PaddleNLP's debug lines (its Trainer prints every argument; resolved_arguments.json
holds them), one line per model load, and the prompt-length limit that actually filters."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import paddle

from tests import warm_python
from tests.test_trainer_faults import sft_argv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_sft_run_without_the_custom_ops_says_each_fact_once(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "sft")
    argv = sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "2", "--eval_with_do_generation", "true",
                    "--do_eval", "true", "--eval_steps", "2", "--max_length", "24")
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5", PPO_ROLLOUT_OPS_LIB=str(tmp_path / "missing.so"))
    done = warm_python.run([sys.executable, "sft/run_sft.py", *argv], cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    console = done.stdout + done.stderr
    assert console.count("custom ops unavailable") == 1, console[-3000:]
    assert "train patch on:" in console and "pure-Paddle twins (use_train_patch" in console  # no second reason
    for noise in ("DEBUG", "Training Configuration Arguments", "UserWarning", "Got different data type",
                  "We are using <class", "Loading configuration file", "All the weights of", "The global seed is set"):
        assert noise not in console, noise
    assert console.count("Loading weights file") == 1  # one line for the one model load
    prompt_lines = [line for line in console.splitlines() if "PromptOnlyDataset: raw=" in line]
    assert prompt_lines and all(line.rstrip("\x1b[0m").endswith("(max_prompt_len=24)") for line in prompt_lines), prompt_lines


def test_grpo_advantages_log_no_type_promotion():
    """`paddle.std` divides integer element counts inside Paddle, which logs a glog warning at the
    first GRPO step; the advantages compute the same numbers without it."""
    code = ("import paddle\nfrom ppo.algos.advantage import grpo_advantages\n"
            "print(grpo_advantages(paddle.to_tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0]), 3).numpy().tolist())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, MKL_DEBUG_CPU_TYPE="5"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Got different data type" not in done.stderr
    third = 1 / np.sqrt(3)  # each group's unbiased std; the advantages are (s - mean) / std
    expected = [2 / 3 / third, -1 / 3 / third, -1 / 3 / third, -2 / 3 / third, 1 / 3 / third, 1 / 3 / third]
    np.testing.assert_allclose(json.loads(done.stdout), expected, rtol=1e-5)


def test_the_rollout_engine_takes_tensors_without_a_copy_warning(tiny_model_dir):
    from ppo.models.loading import load_causal_lm
    from ppo.rollout import RolloutEngine, SamplingParams

    engine = RolloutEngine(load_causal_lm(tiny_model_dir), pad_token_id=0, eos_token_id=2)
    ids = paddle.to_tensor(np.array([[5, 6, 7], [8, 9, 10]], "int64"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.generate(ids, paddle.ones_like(ids), SamplingParams(max_new_tokens=2), seed=0)
    assert [str(w.message) for w in caught if "copy construct" in str(w.message)] == []
