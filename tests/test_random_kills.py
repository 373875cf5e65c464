"""Kill a run at random moments, rerun the same command each time, and the finished run equals an
uninterrupted one: the same final weights and the same metrics (timings aside), for PPO and SFT
on the tiny model.

Every attempt is a real process killed with SIGKILL: after a random delay (mid-step or anywhere;
a fresh `python`, start-up included, like the timed unkilled run the delays scale with), inside
the n-th `paddle.save` after half its file is written (mid-save), or inside the n-th trace append
after half a line is written (mid-write); those and the later unkilled runs are children of
tests/warm_python.py's zygote. The kill plan comes from a
seeded generator, so a failure reproduces."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest

from tests.test_ppo_trainer import ppo_argv
from tests.test_trainer_faults import sft_argv
from tests.warm_python import run

# The slow suite: by default, agent-training runs are killed the same way (tests/test_agent_training.py,
# with this module's helpers) and PPO/SFT are stopped and resumed at fixed points (tests/test_trainer_faults.py,
# tests/test_checkpoint_faults.py).
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KILLER = r"""
import json, os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
mode, n, entry, argv = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "time":  # a random moment
    threading.Timer(float(n), die).start()
elif mode == "save":  # the n-th paddle.save writes half its file, then the kill
    import paddle
    from tests.warm_python import rebind
    original, calls = paddle.save, [0]
    def save(obj, path, *args, **kwargs):
        calls[0] += 1
        original(obj, path, *args, **kwargs)
        if calls[0] == int(n):
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            die()
    paddle.save = save
    rebind(original, save)
elif mode == "trace":  # the n-th trace append writes half a line, then the kill
    from tests.warm_python import rebind
    import ppo.common.jsonl_trace as trace
    import ppo.common.tracking as tracking
    import ppo.trainer.report as report
    original, calls = trace.append_rows, [0]
    def append_rows(path, rows):
        calls[0] += 1
        if calls[0] == int(n):
            line = json.dumps(rows[0]) + "\n"
            with open(path, "a") as f:
                f.write(line[: len(line) // 2])
            die()
        return original(path, rows)
    trace.append_rows = tracking.append_rows = report.append_rows = append_rows
    rebind(original, append_rows)
if entry == "ppo":
    from ppo.run_ppo import main
else:
    from sft.run_sft import main
main(argv)
"""

TIMING_WORDS = ("timing", "time", "perf/", "per_second", "runtime", "tokens_per_s")


def attempt(entry, argv, mode="none", n=0):
    cmd = [sys.executable, "-c", KILLER, REPO, mode, str(n), entry, *argv]
    return (subprocess.run if mode in ("time", "timed") else run)(cmd, cwd=REPO, env=dict(os.environ, MKL_DEBUG_CPU_TYPE="5"), capture_output=True, text=True, timeout=600)


def timed_attempt(entry, argv):
    """An unkilled attempt and its wall seconds (the machine's speed: kill times scale with it)."""
    start = time.time()
    proc = attempt(entry, argv, "timed")
    return proc, time.time() - start


def kill_plan(seed, wall_s, saves, appends):
    """Kill moments for a run that takes `wall_s` when not killed: a timed kill between 30% and
    60% of it (start-up or the first steps), the n-th save, the n-th trace append, a second timed
    kill between 15% and 30% (a resumed attempt has less work left), then an early save and an
    early append of the attempt. A timed kill misses when the attempt runs faster than the
    measured run (the cores less busy), and a late event misses when the attempt finishes first:
    a finished run leaves the rest of the plan nothing to kill, so the plan ends with two kills
    that land while any step is left, and holds more kills than the tests require."""
    rng = random.Random(seed)
    timed = lambda low, high: ("time", round(rng.uniform(low, high) * wall_s, 2))  # noqa: E731
    return [timed(0.3, 0.6), ("save", rng.randint(*saves)), ("trace", rng.randint(*appends)), timed(0.15, 0.3),
            ("save", rng.randint(saves[0], min(saves[0] + 2, saves[1]))), ("trace", appends[0])]


def metrics_without_timings(out):
    rows = [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]
    return [{k: v for k, v in r.items() if not any(w in k for w in TIMING_WORDS)} for r in rows]


def run_killed_then_resumed(entry, argv, plan):
    """Every attempt of `plan` then a last unkilled one; returns the kill count."""
    kills = 0
    for mode, n in plan:
        proc = attempt(entry, argv, mode, n)
        assert proc.returncode in (0, -signal.SIGKILL), (mode, n, proc.stderr[-3000:])
        kills += proc.returncode == -signal.SIGKILL
    final = attempt(entry, argv)
    assert final.returncode == 0, final.stderr[-3000:]
    return kills


def assert_same_run(straight, resumed, weights_dir):
    a = paddle.load(os.path.join(straight, weights_dir, "model_state.pdparams"))
    b = paddle.load(os.path.join(resumed, weights_dir, "model_state.pdparams"))
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)
    got, expected = metrics_without_timings(resumed), metrics_without_timings(straight)
    assert [sorted(r) for r in got] == [sorted(r) for r in expected]
    for row, want in zip(got, expected):  # a resumed Trainer run's train/loss is recomputed from the logged rows
        assert row == {k: pytest.approx(v, rel=1e-6) if k == "train/loss" else v for k, v in want.items()}


def test_ppo_killed_at_random_moments_equals_an_uninterrupted_run(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    def argv(out):
        return ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "5", "--save_steps", "1",
                        "--logging_steps", "1", "--overwrite_output_dir", "false", "--save_total_limit", "2")

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    proc, wall = timed_attempt("ppo", argv(straight))
    assert proc.returncode == 0, proc.stderr[-3000:]
    kills = run_killed_then_resumed("ppo", argv(resumed), kill_plan(28, wall, (2, 14), (2, 8)))
    assert kills >= 3
    assert_same_run(straight, resumed, "policy")
    assert json.load(open(os.path.join(resumed, "summary.json")))["steps"] == 5


def test_sft_killed_at_random_moments_equals_an_uninterrupted_run(tiny_model_dir, tiny_data_dir, tmp_path):
    def argv(out):
        return sft_argv(tiny_model_dir, tiny_data_dir, out, "--save_steps", "1")

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    proc, wall = timed_attempt("sft", argv(straight))
    assert proc.returncode == 0, proc.stderr[-3000:]
    kills = run_killed_then_resumed("sft", argv(resumed), kill_plan(29, wall, (2, 16), (2, 5)))
    assert kills >= 3
    assert_same_run(straight, resumed, "")
    assert json.load(open(os.path.join(resumed, "summary.json")))["global_step"] == 6
