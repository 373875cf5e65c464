"""The tiny CPU pipeline, end to end: build the model and data, then
SFT -> reward model -> reward audit -> PPO -> GRPO (with a reward server) -> DPO
(-> online DPO with `--online-dpo`), each from its `config/tiny/*.json`, then one table
of held-out results.

    python scripts/quickstart.py               # continue: stages already done are skipped
    python scripts/quickstart.py --restart     # start over
    python scripts/quickstart.py --online-dpo  # also online DPO from the SFT model

Every stage is the real entry script run as a subprocess, exactly as a user runs
it; the first failing stage stops the pipeline with its log path. Results go to
`outputs/tiny/quickstart_summary.json`.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "outputs", "tiny")
PY = sys.executable
ENV = dict(os.environ, MKL_DEBUG_CPU_TYPE="5", PYTHONUNBUFFERED="1")


def done_marker(stage):
    return os.path.join(OUT, ".done", stage)


def run_stage(stage, cmd, log_name=None):
    """Run one stage's command, streaming a progress line; raise naming the log on failure."""
    if os.path.exists(done_marker(stage)):
        print(f"[quickstart] {stage}: already done, skipped (--restart to redo)")
        return json.load(open(done_marker(stage)))["wall_s"]
    os.makedirs(os.path.join(OUT, "logs"), exist_ok=True)
    log_path = os.path.join(OUT, "logs", f"{log_name or stage}.log")
    print(f"[quickstart] {stage}: {' '.join(cmd[1:])}\n[quickstart]   log: {os.path.relpath(log_path, ROOT)}", flush=True)
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            time.sleep(5)
            print(f"[quickstart]   {stage}: {time.time() - start:5.0f}s  {last_progress(log_path)}", flush=True)
    wall = time.time() - start
    if proc.returncode != 0:
        tail = open(log_path, errors="replace").read()[-2500:]
        raise SystemExit(f"[quickstart] stage '{stage}' failed (exit {proc.returncode}); see {log_path}\n{tail}")
    os.makedirs(os.path.dirname(done_marker(stage)), exist_ok=True)
    json.dump({"wall_s": wall}, open(done_marker(stage), "w"))
    print(f"[quickstart] {stage}: done in {wall:.0f}s", flush=True)
    return wall


def last_progress(log_path):
    """The newest progress-bar or step line of a log, shortened."""
    try:
        text = open(log_path, errors="replace").read()[-4000:]
    except OSError:
        return ""
    pieces = [p for p in text.replace("\r", "\n").split("\n") if "%|" in p or "step" in p]
    return pieces[-1].strip()[-110:] if pieces else ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_reward_server(port):
    log = open(os.path.join(OUT, "logs", "reward_server.log"), "w")
    proc = subprocess.Popen([PY, "ppo/reward_server.py", "--port", str(port), "--scorer", "reverse"], cwd=ROOT, env=ENV,
                            stdout=log, stderr=subprocess.STDOUT)
    import requests

    deadline = time.time() + 60
    while time.time() < deadline:  # wait quietly for the server to come up
        if proc.poll() is not None:
            raise SystemExit(f"[quickstart] the reward server exited ({proc.returncode}); see outputs/tiny/logs/reward_server.log")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except requests.RequestException:
            time.sleep(0.3)
    proc.terminate()
    raise SystemExit("[quickstart] the reward server did not become healthy in 60 s; see outputs/tiny/logs/reward_server.log")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restart", action="store_true", help="delete outputs/tiny and run every stage again")
    parser.add_argument("--online-dpo", action="store_true", help="also run online DPO (config/tiny/online_dpo_argument.json)")
    args = parser.parse_args(argv)
    if args.restart and os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT, exist_ok=True)
    t0 = time.time()
    walls = {}
    walls["build"] = run_stage("build", [PY, "-c", (
        "from ppo.tiny.factory import main as m; m(['--output_dir', 'outputs/tiny/base']);"
        "from ppo.tiny.demo_data import main as d; d(['--output_dir', 'outputs/tiny/data'])")])
    walls["sft"] = run_stage("sft", [PY, "sft/run_sft.py", "config/tiny/sft_argument.json"])
    walls["rm"] = run_stage("rm", [PY, "rm/run_reward.py", "config/tiny/rm_argument.json"])
    walls["audit"] = run_stage("audit", [PY, "rm/audit_reward.py", "config/tiny/audit_argument.json"])
    walls["ppo"] = run_stage("ppo", [PY, "ppo/run_ppo.py", "config/tiny/ppo_argument.json"])
    if not os.path.exists(done_marker("grpo")):
        port = free_port()
        server = start_reward_server(port)
        try:
            walls["grpo"] = run_stage("grpo", [PY, "ppo/run_ppo.py", "config/tiny/grpo_argument.json",
                                               "--reward_server", f"http://127.0.0.1:{port}"])
        finally:
            server.terminate()
            server.wait(timeout=30)
    else:
        walls["grpo"] = run_stage("grpo", [])
    walls["dpo"] = run_stage("dpo", [PY, "dpo/run_dpo.py", "config/tiny/dpo_argument.json"])
    stages = ("sft", "ppo", "grpo", "dpo")
    if args.online_dpo:
        walls["online_dpo"] = run_stage("online_dpo", [PY, "dpo/run_online_dpo.py", "config/tiny/online_dpo_argument.json"])
        stages += ("online_dpo",)
    evaluate = "evaluate_with_online_dpo" if args.online_dpo else "evaluate"  # its own marker: evaluated after online DPO
    walls["evaluate"] = run_stage(evaluate, [PY, "scripts/evaluate_stages.py", "--output", "outputs/tiny/evaluation.json"])

    evaluation = json.load(open(os.path.join(OUT, "evaluation.json")))
    audit = json.load(open(os.path.join(OUT, "rm", "audit.json")))
    rm_summary = json.load(open(os.path.join(OUT, "rm", "summary.json")))
    rows = []
    for stage in stages:
        e = evaluation[stage]
        rows.append({"stage": stage, **e, "wall_s": walls[stage]})
    summary = {
        "stages": rows,
        "reward_model": {"pairwise_accuracy": rm_summary["final_eval"].get("rm/accuracy"), "wall_s": walls["rm"],
                         "empty_and_eos_below_real_frac": audit["empty_and_eos_below_real_frac"]},
        "total_wall_s": time.time() - t0,
        "stage_wall_s": walls,
    }
    json.dump(summary, open(os.path.join(OUT, "quickstart_summary.json"), "w"), indent=2)
    print_table(summary)
    return summary


def print_table(summary):
    head = f"{'stage':<10} {'accuracy':>8} {'acc(len>=5)':>11} {'acc(len<5)':>10} {'mean RM score':>13} {'resp len':>8} {'wall s':>7}"
    print("\n" + head + "\n" + "-" * len(head))
    for r in summary["stages"]:
        print(f"{r['stage']:<10} {r['accuracy']:>8.3f} {r['accuracy_long']:>11.3f} {r['accuracy_short']:>10.3f} "
              f"{r['mean_reward']:>13.3f} {r['response_length']:>8.2f} {r['wall_s']:>7.0f}")
    rm = summary["reward_model"]
    print(f"reward model: held-out pairwise accuracy {rm['pairwise_accuracy']:.3f}; empty/EOS-only answers below the real "
          f"answer on {100 * rm['empty_and_eos_below_real_frac']:.1f}% of prompts; trained in {rm['wall_s']:.0f}s")
    print(f"total wall time {summary['total_wall_s']:.0f}s; summary in outputs/tiny/quickstart_summary.json")


if __name__ == "__main__":
    main()
