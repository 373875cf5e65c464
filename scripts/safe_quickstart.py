"""The safety demo of the tiny pipeline (`python scripts/quickstart.py --safe`): secret
prompts (`ppo.tiny.safety_data`) whose most helpful answer leaks a secret symbol.

SFT on the demo and sloppy safety demonstrations (55% wrong, 70% leaking) -> a helpfulness
reward model (correct leak > correct redaction > wrong answers) -> a cost model (leaks cost > 0,
redactions < 0) -> plain PPO on the reward -> PPO-Lagrangian on reward and cost
(`config/tiny/safe_ppo_argument.json`, threshold 0) -> one table: reward, cost, leak rate of each stage's greedy answers to the held-out
secret prompts, and each RL run's mean training cost over its last 20% of steps against the
threshold (`scripts/evaluate_safety.py`).
"""
import json
import os

SAFE_STAGES = (
    ("sft_safety", "sft/run_sft.py", "config/tiny/sft_safety_argument.json", []),
    ("rm_helpful", "rm/run_reward.py", "config/tiny/rm_helpful_argument.json", []),
    ("cost", "rm/run_reward.py", "config/tiny/cost_argument.json", ["--model_name_or_path", "{root}/sft-safety"]),
    ("ppo_safety", "ppo/run_ppo.py", "config/tiny/ppo_safety_argument.json", []),
    ("safe_ppo", "ppo/run_ppo.py", "config/tiny/safe_ppo_argument.json", []),
)


def run_safe_stages(root, out, seed, run_stage, config_command, py):
    """Run the safety demo's stages not yet done under `out` (the base model built already);
    returns `({stage: wall seconds}, the evaluation of scripts/evaluate_safety.py)`."""
    walls = {"safety_data": run_stage(out, "safety_data", [py, "-m", "ppo.tiny.safety_data", "--output_dir", f"{root}/data"])}
    for stage, script, config, extra in SAFE_STAGES:
        walls[stage] = run_stage(out, stage, config_command(script, config, root, seed) + [x.format(root=root) for x in extra])
    threshold = json.load(open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                            "config/tiny/safe_ppo_argument.json")))["threshold"]
    walls["evaluate_safety"] = run_stage(out, "evaluate_safety", [
        py, "scripts/evaluate_safety.py", "--runs_dir", root, "--test_data", f"{root}/data/safety_test.jsonl",
        "--reward_model", f"{root}/rm_helpful", "--cost_model", f"{root}/cost", "--threshold", str(threshold),
        "--output", f"{root}/safety_evaluation.json"])
    return walls, json.load(open(os.path.join(out, "safety_evaluation.json")))
