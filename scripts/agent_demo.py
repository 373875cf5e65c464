"""The agent demo: the tiny model learns to use the calculator where it cannot multiply itself.

    python scripts/agent_demo.py                    # seeds 42, 43, 44 into outputs/tiny-agent
    python scripts/agent_demo.py --seeds 42 --restart
    python scripts/quickstart.py --agent            # the same

Task (`ppo/tiny/agent_task.py`): `USER: 347*862 ASSISTANT:`, answered exactly. Stages (each the
real entry script as a subprocess, one thread each; stages already done are skipped):
 1. build: the tiny model with the four tool tags as tokens (`build_tiny(tool_tags=True)`) and
    the data: SFT demonstrations of which half call the calculator and half write a product
    straight away, RL prompts, 200 held-out problems;
 2. SFT (`config/tiny/sft_agent_argument.json`): the call format, imperfectly -- half the time
    the model tries the product itself;
 3. per seed, GRPO with the calculator (`config/tiny/grpo_agent_argument.json`: `env_name` tools,
    `ppo.tiny.agent_task:final_answer_scorer`), from the SFT model;
 4. held-out success (the share of the 200 problems whose final answer is the product; one
    sampled trajectory each at the training temperature, greedy decoding would hide the
    policy's mix of calls and guesses), with the calculator, of the SFT model and of every GRPO
    model, and of every GRPO model with the tools switched off (`tools: []`: a call reads
    "Error: there is no tool"); tool calls per episode beside each.
The table goes to `<root>/agent_summary.json` and the console.
"""
import argparse
import json
import os
import shutil
import sys

from scripts.demo_runs import run_logged

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
ENV = dict(os.environ, MKL_DEBUG_CPU_TYPE="5", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
           PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
DEFAULT_ROOT = "outputs/tiny-agent"
TEMPLATE = "USER: {input} ASSISTANT:"


def run(log_dir, name, cmd):
    """Run `cmd` logged to `<log_dir>/<name>.log`; its wall seconds (scripts/demo_runs.py)."""
    return run_logged(log_dir, name, cmd, ENV, "agent_demo")


def moved(root, *flags):
    """`flags` with every `outputs/tiny-agent` path of the configs moved under `root`."""
    return [f.replace(DEFAULT_ROOT, root) for f in flags]


def build(root):
    """Stage 1 (skipped when done): the base model with tool tags and the task's data."""
    from ppo.tiny.agent_task import build_agent_data
    from ppo.tiny.factory import build_tiny

    if not os.path.isfile(f"{root}/base/config.json"):
        build_tiny(f"{root}/base", seed=42, tool_tags=True)
    if not os.path.isfile(f"{root}/data/test.jsonl"):
        build_agent_data(f"{root}/data", seed=0)


def train(root, seed, logs, walls):
    """Stages 2-3 (each skipped when its model exists): SFT once, GRPO with the calculator per seed."""
    if not os.path.isfile(f"{root}/sft/model_state.pdparams"):
        cmd = [PY, "sft/run_sft.py", "config/tiny/sft_agent_argument.json",
               *moved(root, "--model_name_or_path", f"{DEFAULT_ROOT}/base", "--train_datasets",
                      f"Jsonfile:1.0:{DEFAULT_ROOT}/data/sft.jsonl", "--output_dir", f"{DEFAULT_ROOT}/sft",
                      "--logging_dir", f"{DEFAULT_ROOT}/sft/visualdl")]
        walls["sft"] = run(logs, "sft", cmd)
    out = f"{root}/grpo-seed{seed}"
    if not os.path.isfile(f"{out}/policy/model_state.pdparams"):
        cmd = [PY, "ppo/run_ppo.py", "config/tiny/grpo_agent_argument.json", "--seed", str(seed),
               *moved(root, "--actor_model_name_or_path", f"{DEFAULT_ROOT}/sft", "--train_datasets",
                      f"Jsonfile:1.0:{DEFAULT_ROOT}/data/prompts.jsonl"),
               "--output_dir", out, "--logging_dir", f"{out}/visualdl"]
        walls[f"grpo-seed{seed}"] = run(logs, f"grpo-seed{seed}", cmd)
    return out


def success(model_dir, test_path, tools, seed, max_rows=200):
    """`(success, tool calls per episode)` of the policy in `model_dir` on `test_path`: one sampled
    trajectory per problem with `tools` (names; [] switches them off)."""
    import paddle

    from ppo.agents import AgentSettings, TaggedFormat, rollout_trajectories
    from ppo.models.loading import load_causal_lm, load_tokenizer, set_dropout_off
    from ppo.rollout import RolloutEngine, SamplingParams
    from ppo.tiny.agent_task import final_answer_scorer
    from ppo.trainer.agent_rollout import rated_text

    paddle.set_device("cpu")
    tokenizer = load_tokenizer(model_dir)
    model = set_dropout_off(load_causal_lm(model_dir))
    engine = RolloutEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    records = [json.loads(line) for line in open(test_path)][:max_rows]
    records = [{"src": r["src"][0], "tgt": r["tgt"][0]} for r in records]
    agent_args = AgentSettings(env_name="tools", env_kwargs=json.dumps({"tools": tools}), max_turns=2,
                                max_tool_response_len=16, max_total_len=96)
    result = rollout_trajectories(engine, records, agent_args, TaggedFormat(tokenizer, TEMPLATE),
                                  SamplingParams(max_new_tokens=24, temperature=1.0), seed=seed)
    scores = [final_answer_scorer(r["src"], r["tgt"], rated_text(t, tokenizer.eos_token))
              for r, t in zip(records, result.trajectories)]
    return sum(scores) / len(scores), result.metrics["agent/tool_calls_mean"]


def evaluate(root, seeds):
    """Stage 4: the rows of the table."""
    test = f"{root}/data/test.jsonl"
    sft, sft_calls = success(f"{root}/sft", test, ["calculator"], seed=0)
    rows = [{"model": "sft", "tools": "on", "seed": None, "success": sft, "tool_calls": sft_calls}]
    for seed in seeds:
        policy = f"{root}/grpo-seed{seed}/policy"
        for tools, label in ((["calculator"], "on"), ([], "off")):
            rate, calls = success(policy, test, tools, seed=0)
            rows.append({"model": "grpo", "tools": label, "seed": seed, "success": rate, "tool_calls": calls})
    return rows


def print_table(summary):
    print("\nheld-out exact products (200 problems, one sampled trajectory each):")
    print(f"  {'model':<6} {'seed':>5} {'tools':>6} {'success':>8} {'calls/episode':>14} {'train s':>8}")
    for r in summary["rows"]:
        wall = summary["stage_wall_s"].get("sft" if r["model"] == "sft" else f"grpo-seed{r['seed']}")
        wall = f"{wall:.0f}" if wall is not None else "-"
        print(f"  {r['model']:<6} {str(r['seed'] or '-'):>5} {r['tools']:>6} {r['success']:>8.3f} {r['tool_calls']:>14.2f} "
              f"{wall:>8}")
    print(f"summary: {summary['output_root']}/agent_summary.json")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="42,43,44", help="GRPO seeds, comma-separated")
    parser.add_argument("--output_root", default=DEFAULT_ROOT)
    parser.add_argument("--restart", action="store_true", help="delete the output root and run every stage again")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    root = os.path.join(ROOT, args.output_root) if not os.path.isabs(args.output_root) else args.output_root
    if args.restart and os.path.isdir(root):
        shutil.rmtree(root)
    walls_path = os.path.join(root, "stage_wall_s.json")
    walls = json.load(open(walls_path)) if os.path.isfile(walls_path) else {}
    build(root)
    for seed in seeds:
        train(root, seed, os.path.join(root, "logs"), walls)
        json.dump(walls, open(walls_path, "w"), indent=2)
    summary = {"output_root": root, "seeds": seeds, "rows": evaluate(root, seeds), "stage_wall_s": walls}
    json.dump(summary, open(os.path.join(root, "agent_summary.json"), "w"), indent=2)
    print_table(summary)
    return summary


if __name__ == "__main__":
    main()
