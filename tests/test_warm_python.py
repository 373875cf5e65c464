"""tests/warm_python.py: a command run in a zygote child gives what a real `python` process
gives (output, exit status, trained weights and metrics), and falls back to a real process where
a fork would not be faithful."""
import os
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
    for env in (dict(ENV, FLAGS_check_nan_inf="1"), dict(ENV, OMP_NUM_THREADS="2"), dict(ENV, PYTHONPATH=REPO)):
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
