"""Multi-process runs of the entry scripts for the tensor-parallel tests.

`launch_run(script, argv, out, nproc)` runs `python -m paddle.distributed.launch
--nproc_per_node nproc tests/tp_entry.py script argv` (the CPU stand-ins of the
model-parallel collectives installed, see `tests/tp_cpu_collectives.py`) and fails with the
workers' log tails when a rank fails."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = os.path.join(REPO, "tests", "tp_entry.py")


def worker_logs(log_dir, tail=3000):
    if not os.path.isdir(log_dir):
        return ""
    return "".join(
        f"\n--- {f} ---\n" + open(os.path.join(log_dir, f), errors="replace").read()[-tail:]
        for f in sorted(os.listdir(log_dir)) if f.startswith("workerlog")
    )


def launch_run(script, argv, out, nproc=2):
    """Run `script` under `paddle.distributed.launch` with `nproc` CPU processes; returns `out`."""
    log_dir = os.path.join(out, "launch")
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir", log_dir,
           ENTRY, script, *argv]
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(log_dir)
    return out


def read_jsonl(path):
    return [json.loads(ln) for ln in open(path)]


def step_values(out, key):
    """`{step: value}` of a metric logged per training step in `out/metrics.jsonl`."""
    return {r["step"]: r[key] for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if key in r}
