"""tests/warm_python.py: a command run in a zygote child gives what a real `python` process
gives (output, exit status, trained weights and metrics), and falls back to a real process where
a fork would not be faithful."""
import json
import os
import select
import signal
import subprocess
import sys

import numpy as np
import paddle
import pytest

from tests import warm_python
from tests.test_random_kills import metrics_without_timings
from tests.test_trainer_faults import sft_argv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")

SHOW = """import os, sys
print(sys.argv, repr(sys.path[0]), os.getcwd(), os.environ.get("WARM_TEST"), "HOME" in os.environ, __name__)
print(repr(sys.stdin.read()))
sys.stderr.write("to stderr\\n")
how = sys.argv[1]
if how == "raise":
    raise ValueError("bad " + how)
sys.exit(int(how) if how.isdigit() else how)
"""


def both(cmd, **kw):
    """(the zygote child's result, a real subprocess's result) of the same command."""
    env = dict(ENV, WARM_TEST="yes")
    env.pop("HOME", None)
    warm = warm_python.run(cmd, env=env, capture_output=True, text=True, **kw)
    real = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)
    return warm, real


@pytest.mark.parametrize("how, code", [("0", 0), ("3", 3), ("a message", 1), ("raise", 1)])
def test_output_exit_status_and_traceback_equal_a_real_process(tmp_path, how, code):
    warm, real = both([sys.executable, "-c", SHOW, how, "x"], cwd=str(tmp_path))
    assert (warm.returncode, warm.stdout, warm.stderr) == (real.returncode, real.stdout, real.stderr)
    assert warm.returncode == code
    assert f"['-c', '{how}', 'x'] '' {tmp_path} yes False __main__\n''\n" == warm.stdout
    assert warm.stderr.startswith("to stderr\n")
    if how == "raise":
        assert warm.stderr.endswith('  File "<string>", line 7, in <module>\nValueError: bad raise\n')


def test_script_and_module_runs_equal_a_real_process(tmp_path):
    (tmp_path / "shown.py").write_text(SHOW)
    for cmd in ([sys.executable, "shown.py", "4"], [sys.executable, "shown.py", "raise"], [sys.executable, "-m", "shown", "raise"]):
        warm, real = both(cmd, cwd=str(tmp_path))
        assert (warm.returncode, warm.stdout) == (real.returncode, real.stdout) and warm.returncode in (4, 1)
        assert str(tmp_path) in warm.stdout
        assert warm.stderr.replace(str(tmp_path / "shown.py"), "shown.py") == real.stderr.replace(
            str(tmp_path / "shown.py"), "shown.py")


def test_sigkill_gives_minus_9_and_signals_reach_the_child():
    proc = warm_python.popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)"],
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert isinstance(proc, warm_python.Popen) and proc.pid not in (os.getpid(), os.getppid())
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL and proc.poll() == -signal.SIGKILL
    assert proc.communicate() == ("up\n", "")
    with pytest.raises(subprocess.TimeoutExpired):  # run() kills what outlives its timeout
        warm_python.run([sys.executable, "-c", "import time; time.sleep(300)"], env=ENV, timeout=0.5)


def test_import_time_environment_and_other_interpreters_take_a_real_process():
    cmd = [sys.executable, "-c", "import os; print(os.getppid())"]
    for env in (dict(ENV, FLAGS_check_nan_inf="1"), dict(ENV, OMP_NUM_THREADS="2"),
                dict(ENV, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))):
        proc = warm_python.popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        assert type(proc) is subprocess.Popen
        assert proc.communicate()[0] == f"{os.getpid()}\n"
    done = warm_python.run(cmd, env=ENV, capture_output=True, text=True)
    assert done.stdout != f"{os.getpid()}\n"  # served by the zygote: a grandchild of it
    for other in (["/bin/echo", "hi"], [sys.executable, "-u", "-c", "pass"],
                  [sys.executable, "-m", "paddle.distributed.launch", "--help"]):
        assert warm_python._servable(other, ENV, {}) is False
    assert warm_python._servable(cmd, ENV, {"input": "x"}) is False


def test_a_tiny_sft_run_trains_like_a_real_process_bit_for_bit(tiny_model_dir, tiny_data_dir, tmp_path):
    outs = {}
    for name, runner in (("warm", warm_python.run), ("real", subprocess.run)):
        outs[name] = str(tmp_path / name)
        done = runner([sys.executable, "sft/run_sft.py", *sft_argv(tiny_model_dir, tiny_data_dir, outs[name],
                                                                     "--max_steps", "3")],
                      cwd=REPO, env=ENV, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    a, b = (paddle.load(os.path.join(outs[n], "model_state.pdparams")) for n in ("warm", "real"))
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)
    assert metrics_without_timings(outs["warm"]) == metrics_without_timings(outs["real"])
    assert len(metrics_without_timings(outs["warm"])) >= 3


LAUNCH_PROBE = """import sys
preloaded = "paddlenlp" in sys.modules
import json, os
import paddle.distributed as dist
import paddlenlp.utils.distributed as nlp_dist
rank = dist.get_rank()
record = {"preloaded": preloaded, "rank": rank, "world": dist.get_world_size(), "nlp_world": nlp_dist.world_size,
          "trainer_id": os.environ["PADDLE_TRAINER_ID"], "socket": os.environ.get("WARM_LAUNCH_SOCK")}
json.dump(record, open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w"))
sys.exit(int(sys.argv[2]) if rank == 1 else 0)
"""


def launch_probe(tmp_path, exit_code="0"):
    from tests.tp_launch import launch_run

    script, out = tmp_path / "probe.py", tmp_path / "out"
    script.write_text(LAUNCH_PROBE)
    out.mkdir()
    launch_run(str(script), [str(out), exit_code], str(out))
    return [json.load(open(out / f"rank{rank}.json")) for rank in (0, 1)]


def test_launch_workers_run_in_zygote_children_with_their_own_ranks(tmp_path):
    records = launch_probe(tmp_path)
    assert [r["rank"] for r in records] == [0, 1] and [r["trainer_id"] for r in records] == ["0", "1"]
    for r in records:
        assert r["preloaded"] is True  # PaddleNLP imported before the script ran: a zygote child
        assert r["world"] == 2 and r["nlp_world"] == 2  # what was read while importing is refreshed
        assert r["socket"] is None  # the script's own children start cold


@pytest.mark.slow
def test_launch_workers_start_cold_with_warm_python_off(tmp_path, monkeypatch):
    monkeypatch.setenv("WARM_PYTHON", "0")
    records = launch_probe(tmp_path)
    assert [(r["preloaded"], r["rank"], r["nlp_world"]) for r in records] == [(False, 0, 2), (False, 1, 2)]


def test_a_failing_warm_launch_worker_fails_the_launch(tmp_path):
    with pytest.raises(AssertionError, match="workerlog.1"):
        launch_probe(tmp_path, exit_code="3")


SLEEPER = """import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""


def gone_within(pid, seconds=30):
    """Whether process `pid` (a zygote child, reaped by its waiter) disappears within `seconds`."""
    for _ in range(seconds * 10):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        select.select([], [], [], 0.1)
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_launch_worker_signalled_or_killed_takes_its_zygote_child_along(signum, tmp_path):
    from tests import warm_client

    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pid_file = tmp_path / "pid"
    env = dict(ENV, **{warm_client.SOCKET_ENV: warm_python.launch_socket(ENV)})
    client = subprocess.Popen([sys.executable, "tests/tp_entry.py", str(tmp_path / "sleeper.py"), str(pid_file)],
                              cwd=REPO, env=env)
    while not pid_file.exists() or not pid_file.read_text():
        assert client.poll() is None
        select.select([], [], [], 0.05)
    runner = int(pid_file.read_text())
    assert runner != client.pid  # the sleeper runs in the zygote's child, not in the launcher's worker
    client.send_signal(signum)
    assert client.wait(timeout=60) == -signum  # the worker dies of the signal, as its child did
    assert gone_within(runner)
