"""The second agent demo: two tools and per-record data -- look two keys up in the record's own
key-value store, add the values with the calculator -- learnt from the environment's reward alone.

    python scripts/kv_agent_demo.py                    # seeds 42, 43, 44 into outputs/tiny-kv-agent
    python scripts/kv_agent_demo.py --seeds 42 --restart

Task (`ppo/tiny/kv_task.py`): `USER: add c and k ASSISTANT:` with the store in the record, never
in the prompt. Stages (each the real entry script as a subprocess, one thread each; stages
already done are skipped):
 1. build: the tiny model with the four tool tags as tokens and the data: SFT demonstrations
    mixing the full chain (two lookups, the calculator, the sum copied out), lookups with the sum
    written directly, and a sum written at once; RL records; 200 held-out records;
 2. SFT (`config/tiny/sft_kv_agent_argument.json`) three times (`--sft_rounds`), each run
    starting from the last one's weights (`sft-r1`, `sft-r2`, then `sft`): one run of 400 steps
    left the model copying tool answers badly (held-out success 0.000);
 3. per seed, GRPO (`config/tiny/grpo_kv_agent_argument.json`: `env_name`
    `ppo.tiny.kv_task:KVEnvironment` and no reward model or scorer -- the environment's reward
    is the only reward; 100 steps at learning rate 1e-4, constant: at 3e-4 the model copied
    numbers worse after GRPO than before; `eval_datasets` the held-out records, so the trainer
    logs `eval/agent/success` of greedy trajectories at steps 0 and 100);
 4. held-out success (the share of the 200 records whose final answer is the sum; one trajectory
    each sampled with the GRPO config's temperature, response length and turn limits:
    `rollout_settings`), with both tools, of the SFT model and of every
    GRPO model, and of every GRPO model with the tools switched off (`tools: []`: a call reads
    "Error: there is no tool"); tool calls per episode beside each, and the trainer's own
    greedy `eval/agent/success` at its last evaluation.
The table goes to `<root>/kv_agent_summary.json` and the console.
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
DEFAULT_ROOT = "outputs/tiny-kv-agent"
TEMPLATE = "USER: {input} ASSISTANT:"
TOOLS = ["ppo.tiny.kv_task:KVStore", "calculator"]
GRPO_CONFIG = "config/tiny/grpo_kv_agent_argument.json"
SFT_ROUNDS = 3  # three passes of the SFT config (400 steps, cosine), each from the last one's weights


def moved(root, *flags):
    """`flags` with every `outputs/tiny-kv-agent` path of the configs moved under `root`."""
    return [f.replace(DEFAULT_ROOT, root) for f in flags]


def build(root, data_sizes=None):
    """Stage 1 (skipped when done): the base model with tool tags and the task's data."""
    from ppo.tiny.factory import build_tiny
    from ppo.tiny.kv_task import build_kv_data

    if not os.path.isfile(f"{root}/base/config.json"):
        build_tiny(f"{root}/base", seed=42, tool_tags=True)
    if not os.path.isfile(f"{root}/data/test.jsonl"):
        build_kv_data(f"{root}/data", seed=0, **(data_sizes or {}))


def train(root, seed, walls, extra=(), sft_rounds=SFT_ROUNDS):
    """Stages 2-3 (each skipped when its model exists): SFT (`sft_rounds` runs) once, GRPO per
    seed; `extra`: flags added to both (smaller runs)."""
    logs = os.path.join(root, "logs")
    for r in range(1, sft_rounds + 1):  # round r starts from round r-1's weights; the last writes sft/
        name = "sft" if r == sft_rounds else f"sft-r{r}"
        start = f"{DEFAULT_ROOT}/base" if r == 1 else f"{DEFAULT_ROOT}/sft-r{r - 1}"
        if os.path.isfile(f"{root}/sft/model_state.pdparams") or os.path.isfile(f"{root}/{name}/model_state.pdparams"):
            continue
        cmd = [PY, "sft/run_sft.py", "config/tiny/sft_kv_agent_argument.json",
               *moved(root, "--model_name_or_path", start, "--train_datasets",
                      f"Jsonfile:1.0:{DEFAULT_ROOT}/data/sft.jsonl", "--output_dir", f"{DEFAULT_ROOT}/{name}",
                      "--logging_dir", f"{DEFAULT_ROOT}/{name}/visualdl"), *extra.get("sft", ())]
        walls[name] = run_logged(logs, name, cmd, ENV, "kv_agent_demo")
    out = f"{root}/grpo-seed{seed}"
    if not os.path.isfile(f"{out}/policy/model_state.pdparams"):
        cmd = [PY, "ppo/run_ppo.py", GRPO_CONFIG, "--seed", str(seed),
               *moved(root, "--actor_model_name_or_path", f"{DEFAULT_ROOT}/sft", "--train_datasets",
                      f"Jsonfile:1.0:{DEFAULT_ROOT}/data/prompts.jsonl", "--eval_datasets",
                      f"Jsonfile:1.0:{DEFAULT_ROOT}/data/test.jsonl"),
               "--output_dir", out, "--logging_dir", f"{out}/visualdl", *extra.get("grpo", ())]
        walls[f"grpo-seed{seed}"] = run_logged(logs, f"grpo-seed{seed}", cmd, ENV, "kv_agent_demo")
    return out


def rollout_settings(config=GRPO_CONFIG):
    """The GRPO config's rollout settings (dict: temperature, max_dec_len, max_turns,
    max_tool_response_len, max_total_len), so the held-out evaluation samples as training did."""
    with open(os.path.join(ROOT, config)) as f:
        args = json.load(f)
    return {k: args[k] for k in ("temperature", "max_dec_len", "max_turns", "max_tool_response_len", "max_total_len")}


def success(model_dir, test_path, tools, seed, max_rows=200):
    """`(success, tool calls per episode)` of the policy in `model_dir` on `test_path`: one
    trajectory per record sampled with the GRPO config's settings (`rollout_settings`) and
    `tools` ([] switches both off); success: the environment's reward."""
    import paddle

    from ppo.agents import AgentSettings, TaggedFormat, rollout_trajectories
    from ppo.models.loading import load_causal_lm, load_tokenizer, set_dropout_off
    from ppo.rollout import RolloutEngine, SamplingParams
    from ppo.tiny.kv_task import KV_ENV

    paddle.set_device("cpu")
    tokenizer = load_tokenizer(model_dir)
    model = set_dropout_off(load_causal_lm(model_dir))
    engine = RolloutEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    records = [json.loads(line) for line in open(test_path)][:max_rows]
    records = [{**r, "src": r["src"][0], "tgt": r["tgt"][0]} for r in records]
    run = rollout_settings()
    agent_args = AgentSettings(env_name=KV_ENV, env_kwargs=json.dumps({"tools": tools}), max_turns=run["max_turns"],
                                max_tool_response_len=run["max_tool_response_len"], max_total_len=run["max_total_len"])
    sampling = SamplingParams(max_new_tokens=run["max_dec_len"], temperature=run["temperature"])
    result = rollout_trajectories(engine, records, agent_args, TaggedFormat(tokenizer, TEMPLATE), sampling, seed=seed)
    solved = [1.0 if sum(t.rewards) > 0 else 0.0 for t in result.trajectories]
    return sum(solved) / len(solved), result.metrics["agent/tool_calls_mean"]


def trainer_eval(out):
    """The trainer's last `eval/agent/success` (greedy, in `<out>/metrics.jsonl`), or None."""
    path = os.path.join(out, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)] if os.path.isfile(path) else []
    evals = [r for r in rows if "eval/agent/success" in r]
    return (evals[0]["eval/agent/success"], evals[-1]["eval/agent/success"]) if evals else (None, None)


def evaluate(root, seeds, max_rows=200):
    """Stage 4: the rows of the table."""
    test = f"{root}/data/test.jsonl"
    sft, sft_calls = success(f"{root}/sft", test, TOOLS, seed=0, max_rows=max_rows)
    rows = [{"model": "sft", "tools": "on", "seed": None, "success": sft, "tool_calls": sft_calls}]
    for seed in seeds:
        out = f"{root}/grpo-seed{seed}"
        first, last = trainer_eval(out)
        for tools, label in ((TOOLS, "on"), ([], "off")):
            rate, calls = success(f"{out}/policy", test, tools, seed=0, max_rows=max_rows)
            rows.append({"model": "grpo", "tools": label, "seed": seed, "success": rate, "tool_calls": calls,
                         "trainer_eval_step0": first if label == "on" else None,
                         "trainer_eval_last": last if label == "on" else None})
    return rows


def print_table(summary):
    print("\nheld-out sums (one sampled trajectory per record; trainer: greedy eval/agent/success at steps 0 / last):")
    print(f"  {'model':<6} {'seed':>5} {'tools':>6} {'success':>8} {'calls/episode':>14} {'trainer':>13} {'train s':>8}")
    for r in summary["rows"]:
        walls = summary["stage_wall_s"]
        wall = sum(v for k, v in walls.items() if k.startswith("sft")) if r["model"] == "sft" else \
            walls.get(f"grpo-seed{r['seed']}")
        wall = f"{wall:.0f}" if wall is not None else "-"
        trainer = "-" if r.get("trainer_eval_last") is None else \
            f"{r['trainer_eval_step0']:.3f}/{r['trainer_eval_last']:.3f}"
        print(f"  {r['model']:<6} {str(r['seed'] or '-'):>5} {r['tools']:>6} {r['success']:>8.3f} "
              f"{r['tool_calls']:>14.2f} {trainer:>13} {wall:>8}")
    print(f"summary: {summary['output_root']}/kv_agent_summary.json")


def main(argv=None, data_sizes=None, extra=None, max_rows=200):
    """Run the demo (module docstring); `data_sizes`, `extra` (flags per stage) and `max_rows`
    shrink it for a test."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="42,43,44", help="GRPO seeds, comma-separated")
    parser.add_argument("--output_root", default=DEFAULT_ROOT)
    parser.add_argument("--restart", action="store_true", help="delete the output root and run every stage again")
    parser.add_argument("--sft_rounds", type=int, default=SFT_ROUNDS, help="SFT runs, each from the last one's weights")
    args = parser.parse_args(argv)
    if args.sft_rounds < 1:
        parser.error(f"--sft_rounds must be at least 1, got {args.sft_rounds}")
    seeds = [int(s) for s in args.seeds.split(",")]
    root = os.path.join(ROOT, args.output_root) if not os.path.isabs(args.output_root) else args.output_root
    if args.restart and os.path.isdir(root):
        shutil.rmtree(root)
    walls_path = os.path.join(root, "stage_wall_s.json")
    walls = json.load(open(walls_path)) if os.path.isfile(walls_path) else {}
    build(root, data_sizes)
    for seed in seeds:
        train(root, seed, walls, extra or {}, args.sft_rounds)
        json.dump(walls, open(walls_path, "w"), indent=2)
    summary = {"output_root": root, "seeds": seeds, "rows": evaluate(root, seeds, max_rows), "stage_wall_s": walls}
    json.dump(summary, open(os.path.join(root, "kv_agent_summary.json"), "w"), indent=2)
    print_table(summary)
    return summary


if __name__ == "__main__":
    main()
