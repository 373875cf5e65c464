"""Multi-process runs of the entry scripts for the tensor-parallel tests.

`launch_run(script, argv, out, nproc)` runs `python -m paddle.distributed.launch
--nproc_per_node nproc tests/tp_entry.py script argv` (the CPU stand-ins of the
model-parallel collectives installed, see `tests/tp_cpu_collectives.py`) and fails with the
workers' log tails when a rank fails. The launcher and its workers' runs are children of
tests/warm_python.py's zygote (Paddle and the entry modules imported once per test process);
the workers themselves stay the launcher's processes (tests/warm_client.py). WARM_PYTHON=0
starts every process cold.

`cold_launch_run(script, argv, out, nproc, cpu_tp_standins)` runs the command a user types,
`python -m paddle.distributed.launch --nproc_per_node nproc script argv`, in fresh processes with
this checkout first on PYTHONPATH (as a `pip install -e .` of it would import it). Tensor
parallel on CPU processes still needs the stand-ins of the model-parallel collectives; with
`cpu_tp_standins` they are installed by `tests/cold_launch_site/sitecustomize.py` when each
worker's interpreter starts, before the script runs: no test file sits between the launcher and
the script."""
import json
import os
import shutil
import subprocess
import sys
import time

from tests import warm_client, warm_python

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = os.path.join(REPO, "tests", "tp_entry.py")
COLD_SITE = os.path.join(REPO, "tests", "cold_launch_site")  # its sitecustomize.py installs the stand-ins


def worker_logs(log_dir, tail=3000):
    if not os.path.isdir(log_dir):
        return ""
    return "".join(
        f"\n--- {f} ---\n" + open(os.path.join(log_dir, f), errors="replace").read()[-tail:]
        for f in sorted(os.listdir(log_dir)) if f.startswith("workerlog")
    )


def _worker_log_texts(log_dir):
    if not os.path.isdir(log_dir):
        return []
    return [open(os.path.join(log_dir, f), errors="replace").read() for f in sorted(os.listdir(log_dir))
            if f.startswith("workerlog")]


def _aborted_creating_store(log):
    """Whether the process aborted right after starting to create a TCP store (libuv's server
    could not bind: an assertion kills the process, with no Python traceback)."""
    created = log.rfind("create libuv server")
    if created < 0:
        return False
    next_line = (log[created:].split("\n", 1) + [""])[1].lstrip().split("\n", 1)[0]
    return next_line.startswith("pure virtual method called") or "uv__finish_close" in next_line


def _log_failed_in_group_rendezvous(log):
    """Whether ONE worker log shows its rank stopping while fleet was creating its groups on the
    test stand-in's own group stores (`tp_cpu_collectives._gloo_group_on_own_store`), before the
    script ran anything of its own: a TCP store connection reset or refused during gloo's
    rendezvous (seen once in about a hundred four-process launches here), or an abort while
    binding a store's port. Every part of the signature must be in the same log."""
    reset = "_create_hcg" in log and "tp_cpu_collectives.py" in log and (
        "TCP connection reset by peer" in log or "Connection refused" in log
    )
    return reset or _aborted_creating_store(log)


def failed_in_group_rendezvous(log_dir):
    """Whether some rank's log (each judged on its own) shows the group-rendezvous failure."""
    return any(_log_failed_in_group_rendezvous(log) for log in _worker_log_texts(log_dir))


LAUNCH_TIMEOUT_S = 900  # one cap for a launch, retry included
MAX_RETRIES_PER_SESSION = 3  # more rendezvous failures than this in one test session fail the test
RETRIES = []  # (script, reason) of every launch started again in this test session


def _clean(out):
    """Empty `out` (the retried launch must not see the failed one's files)."""
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)


def _launch_command(nproc, log_dir, *script_and_argv):
    return [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir", log_dir,
            *script_and_argv]


def _run_launch(run, cmd, env, script, out):
    """`run(cmd, ...)` (warm_python.run or subprocess.run) with the retry rule of `launch_run`;
    the finished process."""
    log_dir = os.path.join(out, "launch")
    start = time.time()
    proc = run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    if proc.returncode != 0 and failed_in_group_rendezvous(log_dir):  # nothing of the run written yet
        RETRIES.append((script, "gloo group rendezvous failed"))
        print(f"[tp_launch] retry {len(RETRIES)} of this session: {script} failed in the gloo group rendezvous; "
              f"started again on an empty {out}", file=sys.stderr)
        assert len(RETRIES) <= MAX_RETRIES_PER_SESSION, f"{len(RETRIES)} launch retries in one session: {RETRIES}"
        _clean(out)
        remaining = max(LAUNCH_TIMEOUT_S - (time.time() - start), 1)
        proc = run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=remaining)
    return proc


def launch_run(script, argv, out, nproc=2):
    """Run `script` under `paddle.distributed.launch` with `nproc` CPU processes; returns `out`.
    A launch that failed in the stand-in's group rendezvous (`failed_in_group_rendezvous`) is
    started once more on an emptied `out`, within the same time cap; the retry is printed and
    counted in `RETRIES`, and more than `MAX_RETRIES_PER_SESSION` of them fail the test. Any
    other failure fails the test with the workers' logs."""
    log_dir = os.path.join(out, "launch")
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    sock_path = warm_python.launch_socket(env)
    if sock_path:  # the workers run in children of a zygote with the imports done (tests/tp_entry.py)
        env[warm_client.SOCKET_ENV] = sock_path
    proc = _run_launch(lambda cmd, **kw: warm_python.run(cmd, launcher=True, **kw),
                       _launch_command(nproc, log_dir, ENTRY, script, *argv), env, script, out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(log_dir)
    return out


def cold_launch_env(cpu_tp_standins):
    """The environment of a cold launch: this checkout first on PYTHONPATH (the launched script
    imports this checkout's packages, as an editable install of it would), preceded by
    `COLD_SITE` when the tensor-parallel stand-ins are wanted; nothing of the warm launches."""
    env = {k: v for k, v in os.environ.items() if k != warm_client.SOCKET_ENV}
    env["MKL_DEBUG_CPU_TYPE"] = "5"
    env["PYTHONPATH"] = os.pathsep.join([COLD_SITE, REPO] if cpu_tp_standins else [REPO])
    return env


def cold_launch(script, argv, out, nproc=2, cpu_tp_standins=False):
    """`python -m paddle.distributed.launch --nproc_per_node nproc script argv` in fresh processes
    (no zygote, no `tests/tp_entry.py`), with `launch_run`'s retry rule; the finished process
    (the caller asserts on its exit status)."""
    cmd = _launch_command(nproc, os.path.join(out, "launch"), script, *argv)
    return _run_launch(subprocess.run, cmd, cold_launch_env(cpu_tp_standins), script, out)


def cold_launch_run(script, argv, out, nproc=2, cpu_tp_standins=False):
    """`cold_launch` that fails the test with the workers' logs unless every rank exited 0; returns `out`."""
    proc = cold_launch(script, argv, out, nproc, cpu_tp_standins)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(os.path.join(out, "launch"))
    return out


def read_jsonl(path):
    return [json.loads(ln) for ln in open(path)]


def step_values(out, key):
    """`{step: value}` of a metric logged per training step in `out/metrics.jsonl`."""
    return {r["step"]: r[key] for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if key in r}
