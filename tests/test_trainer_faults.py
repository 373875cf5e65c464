"""Trainer-based runs (SFT; RM and DPO share `finish_trainer_run`) killed with SIGKILL in real
processes (children of tests/warm_python.py's zygote): auto-resume keeps the metrics written before the kill, a checkpoint cut short
is skipped for the complete one before it, and `save_total_limit` holds in one process."""
import json
import os
import signal
import sys

import numpy as np
import pytest

from tests.warm_python import run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs sft/run_sft.main after arranging a SIGKILL at the n-th paddle.save of a file named `suffix`.
KILLER = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from tests.warm_python import rebind
suffix, n = sys.argv[2], int(sys.argv[3])
import paddle
original, calls = paddle.save, [0]

def save(obj, path, *args, **kwargs):
    if str(path).endswith(suffix):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
    return original(obj, path, *args, **kwargs)

paddle.save = save
rebind(original, save)
from sft.run_sft import main
main(sys.argv[4:])
"""


def sft_argv(model_dir, data_dir, out, *extra):
    return ["config/tiny/sft_argument.json", "--model_name_or_path", model_dir,
            "--train_datasets", f"Jsonfile:1.0:{data_dir}/sft.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
            "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "6", "--per_device_train_batch_size", "8",
            "--logging_steps", "1", "--save_steps", "2", "--save_total_limit", "5", "--do_eval", "false",
            "--eval_steps", "100", "--warmup_steps", "0", "--learning_rate", "1e-2", "--disable_tqdm", "true",
            "--eval_with_do_generation", "false", "--overwrite_output_dir", "false", *extra]


def run_sft(argv, kill_suffix="never", kill_at=0):
    cmd = [sys.executable, "-c", KILLER, REPO, kill_suffix, str(kill_at), *argv]
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    return run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def loss_rows(out):
    return [(r["step"], r["loss/sft"]) for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "loss/sft" in r]


@pytest.fixture(scope="module")
def straight(tiny_model_dir, tiny_data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sft_straight") / "out")
    proc = run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize(
    "kill_suffix,nth,resumes_from",
    [
        ("model_state.pdparams", 3, 4),  # killed saving checkpoint-6's model: resume from checkpoint-4
        ("optimizer.pdopt", 2, 2),  # killed inside checkpoint-4 after its model and trainer_state: fall back to checkpoint-2
    ],
)
def test_sft_killed_then_auto_resumed_keeps_metrics_and_skips_partial_checkpoint(
    kill_suffix, nth, resumes_from, straight, tiny_model_dir, tiny_data_dir, tmp_path
):
    out = str(tmp_path / "sft")
    argv = sft_argv(tiny_model_dir, tiny_data_dir, out)
    killed = run_sft(argv, kill_suffix, nth)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = loss_rows(out)
    assert before and before[-1][0] >= resumes_from
    rerun = run_sft(argv)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"checkpoint-{resumes_from}" in rerun.stderr  # resumed from there
    rows = loss_rows(out)
    assert [s for s, _ in rows] == [1, 2, 3, 4, 5, 6]  # nothing lost, nothing twice
    assert rows[:resumes_from] == before[:resumes_from]  # lines before the checkpoint kept as written
    expected = loss_rows(straight)
    np.testing.assert_allclose([v for _, v in rows], [v for _, v in expected], rtol=1e-4)
    summary = json.load(open(os.path.join(out, "summary.json")))
    ref = json.load(open(os.path.join(straight, "summary.json")))
    np.testing.assert_allclose(summary["train"]["train/loss"], ref["train"]["train/loss"], rtol=1e-4)
    assert summary["global_step"] == 6


def test_single_process_save_total_limit_is_honoured(tiny_model_dir, tiny_data_dir, tmp_path):
    from sft.run_sft import main as run_sft_in_process

    out = str(tmp_path / "limit")
    run_sft_in_process(sft_argv(tiny_model_dir, tiny_data_dir, out, "--save_steps", "1", "--save_total_limit", "2"))
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-5", "checkpoint-6"]


def test_overwrite_output_dir_clears_the_old_runs_checkpoints(tiny_model_dir, tiny_data_dir, tmp_path):
    from sft.run_sft import main as run_sft_in_process

    out = str(tmp_path / "reuse")
    run_sft_in_process(sft_argv(tiny_model_dir, tiny_data_dir, out))
    run_sft_in_process(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "1", "--save_steps", "1",
                                "--overwrite_output_dir", "true"))
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-1"]
    assert [s for s, _ in loss_rows(out)] == [1]
