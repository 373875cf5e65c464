"""One logged step of a demo script (scripts/agent_demo.py, distill_demo.py, judge_demo.py)."""
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_logged(log_dir, name, cmd, env, tag):
    """Run `cmd` from the repository root with `env`, logged to `<log_dir>/<name>.log`; return its
    wall seconds, print them as `[tag] name: N s`; SystemExit naming the log when it fails."""
    os.makedirs(log_dir, exist_ok=True)
    log = os.path.join(log_dir, f"{name}.log")
    start = time.time()
    with open(log, "w") as f:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"[{tag}] {name} failed ({done.returncode}); see {log}")
    wall = time.time() - start
    print(f"[{tag}] {name}: {wall:.0f} s", flush=True)
    return wall
