"""The tiny CPU pipeline, end to end: build the model and data, then
SFT -> reward model -> reward audit -> PPO -> GRPO (with a reward server) -> DPO
(-> online DPO with `--online-dpo`), each from its `config/tiny/*.json`, then one table
of held-out results.

    python scripts/quickstart.py            # continue: stages already done are skipped
    python scripts/quickstart.py --restart  # start over
    python scripts/quickstart.py --seed 43  # every training seed 43, into outputs/tiny-seed43
    python scripts/quickstart.py --arch qwen3_moe  # the same pipeline on a tiny Qwen3-MoE, into outputs/tiny-qwen3_moe
    python scripts/quickstart.py --online-dpo  # also online DPO from the SFT model
    python scripts/quickstart.py --safe     # the safety demo only: SFT -> RM, cost model -> PPO vs PPO-Lagrangian
    python scripts/quickstart.py --agent    # the agent demo only: SFT -> GRPO with the calculator tool (scripts/agent_demo.py)
    python scripts/quickstart.py --stop-after rm  # only the stages up to the reward model (no table)

Every stage is the real entry script run as a subprocess, exactly as a user runs
it, scheduled by `scripts/stage_scheduler.py` on `--jobs` cores (default all), one
thread each (`--stage-threads`), the next stages' imports done ahead on a free core
(`scripts/stage_launcher.py`): after SFT the reward model runs beside GRPO and DPO,
then PPO beside the audit; the first failing stage stops the pipeline (and the stages
running beside it) with its log path. `--seed` sets
the seed of the base model's initialisation and of every training stage (the
demo data, held-out prompts included, stay the same); `--output_root` moves every
path of the configs from `outputs/tiny` to another directory; `--arch` builds the base model of
another family (`ppo.tiny.factory.ARCHS`; same tokenizer characters, data and evaluation), each
stage run with that family's overrides from `ARCH_OVERRIDES` (`scripts/quickstart_arch.py`), into
`outputs/tiny-<arch>` by default. Results go to
`<output root>/quickstart_summary.json`, each stage's training curves beside them to
`<output root>/curves/<stage>.png` (`scripts/plot_metrics.py`; PPO's after the table, the others
beside PPO).
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
from scripts.quickstart_arch import ARCHS, DEFAULT_ARCH, arch_problem, default_output_root, factory_flags, stage_flags  # noqa: E402
from scripts.stage_scheduler import Stage, run_dag, sigterm_stops_stages, stage_env  # noqa: E402

DEFAULT_ROOT = "outputs/tiny"  # the root every path in config/tiny/*.json is written under
PY = sys.executable
ENV = {"MKL_DEBUG_CPU_TYPE": "5", **os.environ, "PYTHONUNBUFFERED": "1"}
"""Every stage's environment: MKL's AVX2 code path on AMD CPUs (3-4x faster matrix products) unless
MKL_DEBUG_CPU_TYPE is already set (`MKL_DEBUG_CPU_TYPE= python scripts/quickstart.py` runs MKL's own
choice, one of the numerics variants of docs/demo_quality.md)."""


def config_command(script, config, root, seed=None):
    """`[python, script, config, flags...]`: every `outputs/tiny/` path in the config moved
    under `root` and, when `seed` is given, the config's `seed` set to it."""
    values = json.load(open(os.path.join(ROOT, config)))
    cmd = [PY, script, config]
    if root != DEFAULT_ROOT:
        for key, value in values.items():
            items = value if isinstance(value, list) else [value]
            if any(isinstance(v, str) and DEFAULT_ROOT + "/" in v for v in items):  # a list goes as one nargs flag
                cmd += [f"--{key}"] + [v.replace(DEFAULT_ROOT + "/", root.rstrip("/") + "/") for v in items]
    if seed is not None:
        if "seed" not in values:
            raise ValueError(f"{config} has no seed to set")
        cmd += ["--seed", str(seed)]
    return cmd


def run_stage(out, stage, cmd):
    """Run one stage's command on its own (the safety demo's stages, one after another) through
    the stage scheduler: same log, progress lines, done marker and failure message."""
    return run_dag(out, [Stage(stage, cmd)], 1, ENV, ROOT, max_threads=1)[stage]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_reward_server(log_dir, port):
    log_path = os.path.join(log_dir, "reward_server.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([PY, "ppo/reward_server.py", "--port", str(port), "--scorer", "reverse"], cwd=ROOT,
                            env=stage_env(ENV, 1), stdout=log, stderr=subprocess.STDOUT)
    import requests

    deadline = time.time() + 60
    while time.time() < deadline:  # wait quietly for the server to come up
        if proc.poll() is not None:
            raise SystemExit(f"[quickstart] the reward server exited ({proc.returncode}); see {log_path}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except requests.RequestException:
            time.sleep(0.3)
    proc.terminate()
    raise SystemExit(f"[quickstart] the reward server did not become healthy in 60 s; see {log_path}")


EXIT_WITHOUT_TEARDOWN = "from scripts.stage_launcher import exit_without_teardown; exit_without_teardown()"
"""The build's last statement (it runs in the repository root): the interpreter's teardown with
Paddle loaded (about 1.2 s) would hold up SFT; the same end as the stages `stage_launcher.py` runs."""


def pipeline_stages(root, seed, online_dpo=False, arch=DEFAULT_ARCH):
    """The quickstart's stage table, in priority order: build -> SFT -> reward model -> PPO and
    the reward audit (which only reports: nothing waits for it), GRPO (with its reward server)
    and DPO from the SFT model (-> online DPO) -> evaluation (SFT's, GRPO's and DPO's beside PPO,
    PPO's after it). SFT -> reward model -> PPO is the critical path; with one thread per stage on
    two cores the reward model runs beside GRPO and then DPO, and PPO beside the audit. `arch`: the
    base model's family, each training stage with its `stage_flags`."""
    seed_flags = [] if seed is None else ["--seed", str(seed)]
    factory_argv = ["--output_dir", root + "/base"] + seed_flags + factory_flags(arch)
    build = [PY, "-c", (f"from ppo.tiny.factory import main as m; m({factory_argv!r});"
                        f"from ppo.tiny.demo_data import main as d; d({['--output_dir', root + '/data']!r});"
                        f"{EXIT_WITHOUT_TEARDOWN}")]
    def command(stage, script, config, with_seed=True):
        return config_command(script, config, root, seed if with_seed else None) + stage_flags(arch, stage)

    stages = [
        Stage("build", build),
        Stage("sft", command("sft", "sft/run_sft.py", "config/tiny/sft_argument.json"), ("build",), alone=True),
        Stage("rm", command("rm", "rm/run_reward.py", "config/tiny/rm_argument.json"), ("sft",)),
        Stage("ppo", command("ppo", "ppo/run_ppo.py", "config/tiny/ppo_argument.json"), ("rm",)),
        Stage("grpo", command("grpo", "ppo/run_ppo.py", "config/tiny/grpo_argument.json"), ("sft",),
              setup=reward_server_setup),
        Stage("dpo", command("dpo", "dpo/run_dpo.py", "config/tiny/dpo_argument.json"), ("sft",)),
        Stage("audit", command("audit", "rm/audit_reward.py", "config/tiny/audit_argument.json", False), ("rm",)),
    ]
    if online_dpo:
        stages.append(Stage("online_dpo", command("online_dpo", "dpo/run_online_dpo.py",
                                                  "config/tiny/online_dpo_argument.json"), ("sft",)))
    evaluate = [PY, "scripts/evaluate_stages.py", "--runs_dir", root, "--test_data", f"{root}/data/test.jsonl",
                "--reward_model", f"{root}/rm"]
    early = f"{root}/evaluation_sft_grpo_dpo.json"
    stages.append(Stage("evaluate_sft_grpo_dpo", evaluate + ["--stages", "sft,grpo,dpo", "--output", early],
                        ("sft", "rm", "grpo", "dpo")))  # beside PPO, off the critical path
    runs = [s.name for s in stages if s.name in CURVE_STAGES]
    stages.append(Stage("curves", [PY, "scripts/plot_metrics.py"] + [f"{root}/{name}" for name in runs]
                        + ["--output_dir", f"{root}/curves"], tuple(runs)))  # beside PPO too
    final = "evaluate_with_online_dpo" if online_dpo else "evaluate"  # its own marker: evaluated after online DPO
    stages.append(Stage(final, evaluate + ["--stages", "ppo,online_dpo", "--include", early, "--output",
                                           f"{root}/evaluation.json"], tuple(s.name for s in stages), alone=True))
    return stages


def reward_server_setup(log_dir):
    """GRPO's reward server on a free port: `(["--reward_server", url], server process)`."""
    port = free_port()
    return ["--reward_server", f"http://127.0.0.1:{port}"], start_reward_server(log_dir, port)


CURVE_STAGES = ("sft", "rm", "grpo", "dpo", "online_dpo")
"""The runs whose curves the `curves` stage draws beside PPO (PPO's are drawn after the table)."""
STOP_STAGES = ("build", "sft", "rm")
PRESTARTED_STAGES = 2
"""How many stages may wait started ahead, imports done (about 0.5 GB each): the next stage of the
critical path imports during the one before it (SFT during the build, the reward model and PPO
during SFT), which takes about 4 s off each of them; with one thread a stage only."""


def up_to(stages, last):
    """The stages `last` needs (itself included), in table order."""
    by_name, needed, todo = {s.name: s for s in stages}, set(), [last]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += list(by_name[name].deps)
    return [s for s in stages if s.name in needed]


def run_stages(root, out, seed, online_dpo=False, jobs=None, stage_threads=1, stop_after=None, arch=DEFAULT_ARCH):
    """Run every stage not yet done under `out` (the absolute `root`) on `jobs` cores (default
    all) with `stage_threads` threads each, online DPO too with `online_dpo`, only those up to
    `stop_after` when given, on the base model of `arch`; returns `{stage: wall seconds}`."""
    stages = pipeline_stages(root, seed, online_dpo, arch)
    if stop_after:
        stages = up_to(stages, stop_after)
    walls = run_dag(out, stages, jobs or os.cpu_count() or 1, ENV, ROOT, max_threads=stage_threads,
                    prestart=PRESTARTED_STAGES)
    if "evaluate_with_online_dpo" in walls:
        walls["evaluate"] = walls.pop("evaluate_with_online_dpo")
    return walls


def parse_args(argv):
    """The quickstart's arguments; a bad value ends here with one line (exit code 2)."""
    from ppo.common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--restart", action="store_true", help="delete the output root and run every stage again")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the base model and of every training stage (default: the configs' own, 42)")
    parser.add_argument("--output_root", default=None,
                        help="directory for every output (default outputs/tiny, outputs/tiny-<arch> with --arch, "
                             "then -seed<N> with --seed)")
    parser.add_argument("--arch", default=DEFAULT_ARCH,
                        help=f"family of the tiny base model: {', '.join(ARCHS)} (default %(default)s); the tokenizer, "
                             "data, configs and evaluation stay the same (docs/quickstart_families.md)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="cores to use: independent stages run side by side (default: every core, here %(default)s)")
    parser.add_argument("--stage-threads", type=int, default=1,
                        help="at most this many threads per stage, from its share of the cores (default 1: the "
                             "README's table was measured so; thread counts change the numerics)")
    parser.add_argument("--stop-after", choices=STOP_STAGES, default=None,
                        help="run the stages up to this one (and those it needs) and stop, without the table")
    parser.add_argument("--online-dpo", action="store_true", help="also run online DPO (config/tiny/online_dpo_argument.json)")
    parser.add_argument("--agent", action="store_true",
                        help="run the agent demo instead (scripts/agent_demo.py): SFT, then GRPO with the calculator tool, "
                             "three seeds; held-out success after SFT, after GRPO, and with the tools switched off")
    parser.add_argument("--safe", action="store_true",
                        help="run the safety demo instead (scripts/safe_quickstart.py): PPO vs PPO-Lagrangian on secret prompts")
    args = parser.parse_args(argv)
    for flag, value in (("--jobs", args.jobs), ("--stage-threads", args.stage_threads)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    problem = arch_problem(args.arch)
    if problem is None and args.arch != DEFAULT_ARCH and (args.agent or args.safe):
        problem = f"--arch {args.arch} runs the main pipeline only; --agent and --safe build their own tiny Llama"
    if problem:
        print(f"[quickstart] {problem}", file=sys.stderr)
        raise SystemExit(2)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.agent:
        return run_agent_demo(args.restart, args.seed)
    root = args.output_root or default_output_root(DEFAULT_ROOT, args.arch, args.seed)
    out = os.path.join(ROOT, root)
    if args.restart and os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    with sigterm_stops_stages():
        if args.safe:
            return run_safe_demo(root, out, args.seed, t0)
        walls = run_stages(root, out, args.seed, args.online_dpo, args.jobs, args.stage_threads, args.stop_after,
                           args.arch)
    if args.stop_after:
        print(f"[quickstart] stopped after {args.stop_after} (run again without --stop-after for the rest)")
        return {"stage_wall_s": walls}
    evaluation = json.load(open(os.path.join(out, "evaluation.json")))
    audit = json.load(open(os.path.join(out, "rm", "audit.json")))
    rm_summary = json.load(open(os.path.join(out, "rm", "summary.json")))
    stages = ("sft", "ppo", "grpo", "dpo") + (("online_dpo",) if args.online_dpo else ())
    rows = [{"stage": stage, **evaluation[stage], "wall_s": walls[stage]} for stage in stages]
    summary = {
        **({} if args.arch == DEFAULT_ARCH else {"arch": args.arch}),
        "seed": args.seed,
        "output_root": root,
        "stages": rows,
        "reward_model": {"pairwise_accuracy": rm_summary["final_eval"].get("rm/accuracy"), "wall_s": walls["rm"],
                         "empty_and_eos_below_real_frac": audit["empty_and_eos_below_real_frac"]},
        "total_wall_s": time.time() - t0,
        "stage_wall_s": walls,
    }
    json.dump(summary, open(os.path.join(out, "quickstart_summary.json"), "w"), indent=2)
    print_table(summary)
    print_curves(root, out, ("sft", "rm") + stages[1:])
    return summary


def run_agent_demo(restart, seed):
    """`--agent`: scripts/agent_demo.py (its three seeds, or `seed` alone), into outputs/tiny-agent."""
    from scripts.agent_demo import main as agent_demo

    return agent_demo((["--restart"] if restart else []) + (["--seeds", str(seed)] if seed is not None else []))


def print_curves(root, out, stages):
    """Draw PPO's curves beside the other stages' (the `curves` stage drew those beside PPO) and
    say where they are."""
    from scripts.plot_metrics import plot_each, read_metrics

    t0 = time.time()
    plot_each({"ppo": read_metrics(os.path.join(out, "ppo"))}, os.path.join(out, "curves"))
    print(f"curves of every stage (reward, KL, losses, entropy, evaluation) in {root}/curves/: "
          f"{', '.join(name + '.png' for name in stages)} (drawn in {time.time() - t0:.1f}s)")


def run_safe_demo(root, out, seed, t0):
    """`--safe`: the base model and demo data, then the safety demo's stages and its table."""
    from scripts.evaluate_safety import print_safety_table
    from scripts.safe_quickstart import run_safe_stages

    seed_flags = [] if seed is None else ["--seed", str(seed)]
    run_stage(out, "build", [PY, "-c", (
        f"from ppo.tiny.factory import main as m; m({['--output_dir', root + '/base'] + seed_flags!r});"
        f"from ppo.tiny.demo_data import main as d; d({['--output_dir', root + '/data']!r})")])
    walls, evaluation = run_safe_stages(root, out, seed, run_stage, config_command, PY)
    summary = {"seed": seed, "output_root": root, "safety": evaluation, "stage_wall_s": walls, "total_wall_s": time.time() - t0}
    json.dump(summary, open(os.path.join(out, "safe_quickstart_summary.json"), "w"), indent=2)
    print_safety_table(evaluation)
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
    print(f"total wall time {summary['total_wall_s']:.0f}s; summary in {summary['output_root']}/quickstart_summary.json")


if __name__ == "__main__":
    main()
