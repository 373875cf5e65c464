"""Which failed multi-process launches `tests/tp_launch.launch_run` starts once more."""
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
  File "ppo/ppo_trainer.py", line 300, in train
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
