"""One run per output directory: `run.lock` names its holder; a second run is refused before any
model loads, a lock left by a dead run is taken over with a warning, the lock goes at exit."""
import json
import os
import socket
import subprocess
import sys

import pytest

from ppo.common.output_lock import LOCK_NAME, OutputDirLockedError, acquire_output_dir, release_output_dir
from tests.test_ppo_trainer import ppo_argv
from tests.test_trainer_faults import sft_argv
from tests.warm_python import run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def live_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def write_lock(out, pid, host=None):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, LOCK_NAME), "w") as f:
        json.dump({"host": host or socket.gethostname(), "pid": pid, "started": "earlier", "command": "run_x.py"}, f)


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_holds_host_and_pid_and_is_released(tmp_path):
    out = str(tmp_path / "out")
    path = acquire_output_dir(out, is_main=True)
    holder = json.load(open(path))
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    assert acquire_output_dir(out, is_main=True) == path  # the same process may take it again
    assert release_output_dir(path) and not os.path.exists(path)
    assert acquire_output_dir(str(tmp_path / "other"), is_main=False) is None
    assert not os.path.exists(tmp_path / "other")  # ranks other than the main one take nothing


def test_live_holder_is_refused_by_name(tmp_path, live_process):
    out = str(tmp_path / "out")
    write_lock(out, live_process.pid)
    with pytest.raises(OutputDirLockedError, match=rf"in use by another run: pid {live_process.pid} on host "):
        acquire_output_dir(out, is_main=True)
    assert json.load(open(os.path.join(out, LOCK_NAME)))["pid"] == live_process.pid  # untouched
    assert not release_output_dir(os.path.join(out, LOCK_NAME))  # not ours to release


def test_lock_of_another_host_is_refused(tmp_path):
    out = str(tmp_path / "out")
    write_lock(out, dead_pid(), host="some-other-host")
    with pytest.raises(OutputDirLockedError, match="some-other-host"):
        acquire_output_dir(out, is_main=True)


def test_stale_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    out = str(tmp_path / "out")
    pid = dead_pid()
    write_lock(out, pid)
    path = acquire_output_dir(out, is_main=True)
    assert json.load(open(path))["pid"] == os.getpid()
    assert "stale lock" in caplog.text and f"pid {pid}" in caplog.text
    release_output_dir(path)
    with open(path, "w") as f:
        f.write('{"host": "h')  # a lock cut short while written
    assert acquire_output_dir(out, is_main=True) == path and "unreadable" in caplog.text
    release_output_dir(path)


def run_entry(script, argv):
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    return run([sys.executable, script, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_entry_points_refuse_a_busy_output_dir_before_loading(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path, live_process):
    for script, argv_of in [("sft/run_sft.py", lambda out: sft_argv(tiny_model_dir, tiny_data_dir, out)),
                            ("ppo/run_ppo.py", lambda out: ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out))]:
        out = str(tmp_path / script.replace("/", "_"))
        write_lock(out, live_process.pid)
        proc = run_entry(script, argv_of(out))
        assert proc.returncode != 0
        assert f"pid {live_process.pid}" in proc.stderr and "in use by another run" in proc.stderr
        assert sorted(os.listdir(out)) == [LOCK_NAME]  # nothing written: no resolved_arguments.json


def test_entry_point_takes_a_stale_lock_and_releases_it_at_exit(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "sft")
    write_lock(out, dead_pid())
    proc = run_entry("sft/run_sft.py", sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "taking over a stale lock" in proc.stderr
    assert not os.path.exists(os.path.join(out, LOCK_NAME))
    assert os.path.exists(os.path.join(out, "model_state.pdparams"))
