"""Run a test worker script over named cases in one process and collect its per-case lines."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_case_worker(script, work_dir, cases):
    """`python tests/<script> work_dir *cases` (the repository on PYTHONPATH, MKL's AVX2 path as
    the suite runs it); returns `(proc, {case: ("RESULT" or "FAILED", rest of its line)})` from
    the worker's `RESULT <case> ...` / `FAILED <case> ...` lines."""
    env = dict(os.environ, PYTHONPATH=REPO, MKL_DEBUG_CPU_TYPE="5")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", script), str(work_dir), *cases], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    results = {}
    for line in proc.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("RESULT", "FAILED"):
            case, _, text = rest.partition(" ")
            results[case] = (kind, text)
    return proc, results
