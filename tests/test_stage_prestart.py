"""Stages started ahead: `scripts/stage_launcher.py` runs a script's imports, then the script as
`python script args` would; `run_dag(..., prestart=N)` imports the next stages on a free core
while the stages before them run, and releases each when its dependencies are done."""
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from scripts.stage_scheduler import LAUNCHER, Stage, can_prestart, next_prestart, run_dag

SCRIPT = """import json, os, sys, time
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'imports'), 'a').write(
    json.dumps({{"name": __name__, "t": time.time(), "pid": os.getpid()}}) + '\\n')
{top}
if __name__ == "__main__":
    open('ran', 'a').write(json.dumps({{"argv": sys.argv, "path0": sys.path[0], "t": time.time(), "pid": os.getpid(),
                                       "threads": os.environ.get('OMP_NUM_THREADS')}}) + '\\n')
    print('main of', sys.argv[0])
    {body}
"""


def write_script(tmp_path, name, body="pass", top=""):
    path = tmp_path / name
    path.write_text(SCRIPT.format(body=body, top=top))
    return str(path)


def lines(path):
    return [json.loads(line) for line in open(path)]


def test_the_launcher_imports_first_then_runs_the_script_as_python_would(tmp_path):
    script = write_script(tmp_path, "stage.py", body="raise SystemExit(3)")
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, LAUNCHER, script, str(ready)], cwd=tmp_path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    for _ in range(600):
        if ready.exists():
            break
        time.sleep(0.05)
    assert ready.exists() and not (tmp_path / "ran").exists()  # imported, waiting for its arguments
    out, _ = proc.communicate(json.dumps({"argv": ["config.json", "--seed", "43"]}) + "\n", timeout=60)
    assert proc.returncode == 3 and out == f"main of {script}\n"
    assert [i["name"] for i in lines(tmp_path / "imports")] == ["__prestart__", "__main__"]
    ran = lines(tmp_path / "ran")
    assert len(ran) == 1 and ran[0]["argv"] == [script, "config.json", "--seed", "43"]
    assert ran[0]["path0"] == str(tmp_path) and ran[0]["pid"] == proc.pid


def test_the_launcher_ends_without_running_the_script_when_stdin_closes_empty(tmp_path):
    script = write_script(tmp_path, "stage.py")
    done = subprocess.run([sys.executable, LAUNCHER, script, str(tmp_path / "ready")], cwd=tmp_path,
                          input="", capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and (tmp_path / "ready").exists() and not (tmp_path / "ran").exists()


FINISHING = """unclosed = open('unclosed.txt', 'w')
    unclosed.write('buffered ' * 1000)  # never flushed or closed by the script
    binary = open('unclosed.bin', 'wb')
    binary.write(bytes(range(256)))
    sys.kept_open = (unclosed, binary)  # still referenced at the end, as a logger's stream is
    import atexit, threading
    atexit.register(lambda: open('atexit.txt', 'w').write('ran'))
    threading.Thread(target=lambda: (time.sleep(0.3), open('thread.txt', 'w').write('joined'))).start()
    sys.stderr.write('no newline at the end')
    {end}"""


@pytest.mark.parametrize("end, code", [("pass", 0), ("raise SystemExit(0)", 0), ("raise SystemExit(4)", 4),
                                       ("raise RuntimeError('boom')", 1)])
def test_the_launcher_ends_the_script_with_what_teardown_would_have_written(tmp_path, end, code):
    """A finished script skips the interpreter's teardown but loses nothing teardown would write:
    open files' buffers, non-daemon threads, atexit handlers, stderr; other ends keep their status."""
    script = write_script(tmp_path, "stage.py", body=FINISHING.format(end=end))
    done = subprocess.run([sys.executable, LAUNCHER, script, str(tmp_path / "ready")], cwd=tmp_path,
                          input=json.dumps({"argv": []}) + "\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == code
    assert (tmp_path / "unclosed.txt").read_text() == "buffered " * 1000
    assert (tmp_path / "unclosed.bin").read_bytes() == bytes(range(256))
    assert (tmp_path / "atexit.txt").read_text() == "ran" and (tmp_path / "thread.txt").read_text() == "joined"
    assert done.stderr.startswith("no newline at the end")
    assert ("RuntimeError: boom" in done.stderr) == (code == 1)


def test_run_dag_imports_the_next_stage_while_its_dependency_runs_and_starts_it_after(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first = write_script(tmp_path, "first.py", body="time.sleep(2)")
    second = write_script(tmp_path, "second.py", top="time.sleep(0.5)")  # a slow import
    stages = [Stage("first", [sys.executable, first]), Stage("second", [sys.executable, second, "--x", "1"], ("first",))]
    walls = run_dag(str(tmp_path), stages, 2, dict(os.environ), str(tmp_path), poll_s=0.05, max_threads=1, prestart=2)
    ran = {os.path.basename(r["argv"][0]): r for r in lines(tmp_path / "ran")}
    second_import = next(i for i in lines(tmp_path / "imports")
                         if i["name"] == "__prestart__" and i["pid"] == ran["second.py"]["pid"])
    assert second_import["t"] < ran["first.py"]["t"] + 2  # imported while `first` slept
    assert ran["second.py"]["t"] > ran["first.py"]["t"] + 2  # ran only after `first` ended
    assert ran["second.py"]["argv"][1:] == ["--x", "1"] and ran["second.py"]["threads"] == "1"
    assert walls["second"] < 0.5 + 2  # its wall time counts from its release, not from its import
    assert (tmp_path / "logs" / "second.log").read_text().strip().endswith(f"main of {second}")
    assert json.load(open(tmp_path / ".done" / "second"))["threads"] == 1


def test_a_stage_that_dies_while_started_ahead_stops_the_run_with_its_log(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first = write_script(tmp_path, "first.py", body="time.sleep(60)")
    broken = write_script(tmp_path, "broken.py", top="import a_module_that_is_not_there")
    stages = [Stage("first", [sys.executable, first]), Stage("broken", [sys.executable, broken], ("first",))]
    with pytest.raises(SystemExit, match=r"stage 'broken' failed \(exit 1\) while it was started ahead; see .*broken.log"
                                         r"(.|\n)*a_module_that_is_not_there"):
        run_dag(str(tmp_path), stages, 2, dict(os.environ), str(tmp_path), poll_s=0.05, max_threads=1, prestart=2)
    assert len(lines(tmp_path / "ran")) == 1  # `first` was stopped, `broken` never ran
    assert not (tmp_path / ".done" / "first").exists()


def fake_ahead(imported=True):
    return SimpleNamespace(imported=lambda: imported)


def test_next_prestart_takes_the_table_order_on_a_free_core_one_import_at_a_time():
    stages = [Stage("build", ["py", "-c", "pass"]), Stage("sft", ["py", "sft.py"], ("build",)),
              Stage("rm", ["py", "rm.py"], ("sft",)), Stage("ppo", ["py", "ppo.py"], ("rm",))]
    assert [can_prestart(s) for s in stages] == [False, True, True, True]
    assert next_prestart(stages, set(), {"build": 1}, {}, 2, 2).name == "sft"
    assert next_prestart(stages, set(), {"build": 1}, {"sft": fake_ahead(False)}, 2, 2) is None  # still importing
    assert next_prestart(stages, set(), {"build": 1}, {"sft": fake_ahead()}, 2, 2).name == "rm"
    assert next_prestart(stages, {"build"}, {"sft": 1}, {"rm": fake_ahead()}, 2, 2).name == "ppo"
    assert next_prestart(stages, {"build"}, {"sft": 1}, {"rm": fake_ahead(), "ppo": fake_ahead()}, 3, 2) is None  # cap
    assert next_prestart(stages, {"build"}, {"sft": 1, "x": 1}, {}, 2, 2) is None  # no free core
    assert next_prestart(stages, {"build", "sft", "rm"}, {}, {}, 2, 2).name == "ppo"


DRIVER = """import os, subprocess, sys
sys.path.insert(0, {root!r})
from scripts.stage_scheduler import Stage, run_dag, sigterm_stops_stages

def helper(log_dir):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open("helper.pid", "w").write(str(proc.pid))
    return [], proc

slow = Stage("slow", [sys.executable, "-c", "import os, time; open('slow.pid', 'w').write(str(os.getpid())); time.sleep(600)"],
             setup=helper)
waiting = Stage("waiting", [sys.executable, {script!r}], ("slow",))
with sigterm_stops_stages():
    run_dag(".", [slow, waiting], 2, dict(os.environ), ".", poll_s=0.05, max_threads=1, prestart=2)
"""


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return open(f"/proc/{pid}/stat").read().split()[2] == "Z"  # a zombie: ended, not yet reaped


def test_sigterm_to_the_scheduler_stops_its_stages_helpers_and_started_ahead_processes(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = write_script(tmp_path, "waiting.py")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=root, script=script)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    imported = tmp_path / "logs" / ".waiting.imported"
    for _ in range(600):
        if imported.exists() and (tmp_path / "slow.pid").exists():
            break
        time.sleep(0.05)
    waiting_pid = next(i["pid"] for i in lines(tmp_path / "imports") if i["name"] == "__prestart__")
    proc.terminate()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + 15 and "stopped by SIGTERM" in out
    pids = [int((tmp_path / "slow.pid").read_text()), int((tmp_path / "helper.pid").read_text()), waiting_pid]
    assert all(gone(pid) for pid in pids), pids
    assert not (tmp_path / "ran").exists() and not (tmp_path / ".done" / "slow").exists()
