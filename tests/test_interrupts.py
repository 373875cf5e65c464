"""SIGTERM / SIGINT: the run saves a checkpoint at the next step boundary, says where, exits
128 + the signal number, and the same command resumes from that checkpoint (PPO and SFT, real
entry scripts in child processes of tests/warm_python.py's zygote)."""
import json
import os
import signal
import subprocess
import sys
import time

from ppo.checkpoints.checkpoint import list_checkpoints
from tests.test_ppo_trainer import ppo_argv
from tests.test_trainer_faults import sft_argv
from tests.warm_python import popen, run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")


def rows(out):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(ln) for ln in open(path) if ln.endswith("\n")]


def with_max_steps(argv, steps):
    """`argv` with its last `--max_steps` value replaced (the one that wins)."""
    i = len(argv) - 1 - argv[::-1].index("--max_steps")
    return argv[: i + 1] + [str(steps)] + argv[i + 2:]


def signal_after_first_step(script, argv, out, signum, timeout=600):
    """Start `script argv`, send `signum` once `metrics.jsonl` has a row; returns the finished process."""
    proc = popen([sys.executable, script, *argv], cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True)
    deadline = time.time() + timeout
    while not rows(out) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be signalled"
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stderr


def test_ppo_sigterm_saves_at_the_step_boundary_and_resumes(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "ppo")
    argv = ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "40", "--logging_steps", "1",
                    "--overwrite_output_dir", "false", "--save_steps", "0")
    code, stderr = signal_after_first_step("ppo/run_ppo.py", argv, out, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, stderr[-3000:]
    saved = list_checkpoints(out)
    assert len(saved) == 1, saved
    step, path = saved[0]
    assert 1 <= step < 40 and f"stopped by SIGTERM after step {step}: saved {path}" in stderr
    assert "Traceback" not in stderr.split("SIGTERM received")[-1]
    assert json.load(open(os.path.join(path, "trainer_state.json")))["step"] == step
    assert json.load(open(os.path.join(out, "summary.json")))["interrupted"] == "SIGTERM"
    assert not os.path.exists(os.path.join(out, "run.lock"))
    assert [r["step"] for r in rows(out)] == list(range(1, step + 1))
    argv = with_max_steps(argv, step + 2)
    rerun = run([sys.executable, "ppo/run_ppo.py", *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {path} at step {step}" in rerun.stderr
    assert [r["step"] for r in rows(out)] == list(range(1, step + 3))


def test_sft_sigint_saves_through_the_callback_and_resumes(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "sft")
    argv = sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "400", "--save_steps", "1000")
    code, stderr = signal_after_first_step("sft/run_sft.py", argv, out, signal.SIGINT)
    assert code == 128 + signal.SIGINT, stderr[-3000:]
    saved = [n for n in os.listdir(out) if n.startswith("checkpoint-")]
    assert len(saved) == 1, saved
    step = int(saved[0].split("-")[1])
    assert 1 <= step < 400 and f"stopped by SIGINT after step {step}: saved {out}/checkpoint-{step}" in stderr
    assert os.path.isfile(os.path.join(out, saved[0], "optimizer.pdopt"))
    assert json.load(open(os.path.join(out, "summary.json")))["interrupted"] == "SIGINT"
    assert not os.path.exists(os.path.join(out, "model_state.pdparams"))  # no final model from a stopped run
    argv = with_max_steps(argv, step + 2)
    rerun = run([sys.executable, "sft/run_sft.py", *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert [r["step"] for r in rows(out) if "loss/sft" in r] == list(range(1, step + 3))
    assert json.load(open(os.path.join(out, "summary.json")))["global_step"] == step + 2


def test_reward_server_gone_for_good_saves_before_the_run_stops(tiny_model_dir, tiny_data_dir, tmp_path):
    import pytest

    from ppo.serving.reward_client import RewardServerError
    from ppo.run_ppo import main as run_ppo
    from tests.test_grpo import grpo_argv
    from tests.test_reward_client import FakeServer, ok

    server = FakeServer()  # healthy, scores two steps, then answers 500 to everything
    server.script = [(200, {"status": "ok"}, 0), ok([0.0, 1.0] * 8), ok([1.0, 0.0] * 8)]
    out = str(tmp_path / "grpo")
    try:
        with pytest.raises(RewardServerError, match=r"saved .*checkpoint-2 \(after step 2\) before stopping"):
            run_ppo(grpo_argv(tiny_model_dir, tiny_data_dir, out, server.url, "--max_steps", "5",
                              "--reward_server_retries", "0"))
    finally:
        server.stop()
    assert [s for s, _ in list_checkpoints(out)] == [2]
    assert [r["step"] for r in rows(out)] == [1, 2]
