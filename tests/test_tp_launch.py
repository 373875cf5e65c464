"""Which failed multi-process launches `tests/tp_launch.launch_run` starts once more."""
import os

import pytest
import tp_launch
from tp_launch import failed_in_group_rendezvous

STORE_ABORT = """[INFO] topology.py:526 - Total 4 sharding comm group(s) create successfully!
I1125 08:25:45.386183 23522 tcp_store.cc:336] create libuv server at port: 54968
pure virtual method called
terminate called without an active exception
"""
BIND_ASSERT = """I1125 08:37:07.757496 27505 tcp_store.cc:336] create libuv server at port: 34815
python: /paddle/third_party/libuv/src/unix/core.c:314: uv__finish_close: Assertion failed.
"""
RENDEZVOUS_RESET = """  File "fleet/fleet.py", line 12, in _create_hcg
  File "tests/tp_cpu_collectives.py", line 40, in impl
RuntimeError: TCP connection reset by peer
"""
SCRIPT_FAILURE = """I1125 08:25:45.386183 23522 tcp_store.cc:336] create libuv server at port: 54968
  File "ppo/entry/ppo_trainer.py", line 300, in train
ValueError: loss is nan
"""
LATER_ABORT = """I1125 tcp_store.cc:336] create libuv server at port: 54968
[INFO] step 1 loss 0.5
pure virtual method called
"""


def write_logs(tmp_path, *texts):
    tmp_path.mkdir()
    for i, text in enumerate(texts):
        (tmp_path / f"workerlog.{i}").write_text(text)
    return str(tmp_path)


def test_store_aborts_and_rendezvous_resets_are_retried(tmp_path):
    for name, text in {"abort": STORE_ABORT, "assert": BIND_ASSERT, "reset": RENDEZVOUS_RESET}.items():
        assert failed_in_group_rendezvous(write_logs(tmp_path / name, "rank ok\n", text)), name


def test_failures_of_the_script_itself_are_not_retried(tmp_path):
    for name, text in {"script": SCRIPT_FAILURE, "later": LATER_ABORT}.items():
        assert not failed_in_group_rendezvous(write_logs(tmp_path / name, "rank ok\n", text)), name
    assert not failed_in_group_rendezvous(str(tmp_path / "no_logs"))


def test_a_signature_split_over_two_logs_is_not_retried(tmp_path):
    """Fleet's group creation in one rank's log and a reset in another's are two unrelated events."""
    half_a = '  File "fleet/fleet.py", line 12, in _create_hcg\n  File "tests/tp_cpu_collectives.py", line 40\n'
    half_b = "RuntimeError: TCP connection reset by peer\n"
    assert not failed_in_group_rendezvous(write_logs(tmp_path / "split", half_a, half_b))


class FakeRun:
    """Stands in for warm_python.run (the launcher in a zygote child): the first call fails in the rendezvous (writing a worker log
    and a stale file into `out`), later calls succeed; records each call's timeout."""

    def __init__(self, out, fail_times=1):
        self.out, self.fail_times, self.timeouts, self.seen_stale = out, fail_times, [], []

    def __call__(self, cmd, **kwargs):
        import subprocess

        self.timeouts.append(kwargs["timeout"])
        self.seen_stale.append(os.path.exists(os.path.join(self.out, "metrics.jsonl")))
        if len(self.timeouts) <= self.fail_times:
            write_logs_at(os.path.join(self.out, "launch"), RENDEZVOUS_RESET)
            open(os.path.join(self.out, "metrics.jsonl"), "w").write("{}\n")
            return subprocess.CompletedProcess(cmd, 1, "", "")
        return subprocess.CompletedProcess(cmd, 0, "", "")


def write_logs_at(log_dir, text):
    os.makedirs(log_dir, exist_ok=True)
    open(os.path.join(log_dir, "workerlog.0"), "w").write(text)


def test_a_retry_is_logged_counted_on_a_clean_out_within_one_time_cap(tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "run")
    os.makedirs(out)
    fake = FakeRun(out)
    monkeypatch.setattr(tp_launch.warm_python, "run", fake)
    monkeypatch.setattr(tp_launch, "RETRIES", [])
    assert tp_launch.launch_run("ppo/run_ppo.py", [], out) == out
    assert len(fake.timeouts) == 2 and fake.seen_stale == [False, False]  # the retry started on an empty out/
    assert fake.timeouts[0] == tp_launch.LAUNCH_TIMEOUT_S and fake.timeouts[1] <= tp_launch.LAUNCH_TIMEOUT_S
    assert tp_launch.RETRIES == [("ppo/run_ppo.py", "gloo group rendezvous failed")]
    assert "retry 1 of this session" in capsys.readouterr().err


def test_retries_are_limited_per_session_and_per_launch(tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    os.makedirs(out)
    monkeypatch.setattr(tp_launch, "RETRIES", [("x", "r")] * tp_launch.MAX_RETRIES_PER_SESSION)
    monkeypatch.setattr(tp_launch.warm_python, "run", FakeRun(out))
    with pytest.raises(AssertionError, match="launch retries in one session"):
        tp_launch.launch_run("ppo/run_ppo.py", [], out)
    monkeypatch.setattr(tp_launch, "RETRIES", [])
    twice = FakeRun(out, fail_times=2)  # a second rendezvous failure of the same launch is not retried
    monkeypatch.setattr(tp_launch.warm_python, "run", twice)
    with pytest.raises(AssertionError):
        tp_launch.launch_run("ppo/run_ppo.py", [], out)
    assert len(twice.timeouts) == 2
