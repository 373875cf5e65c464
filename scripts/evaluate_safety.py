"""Evaluate the safety demo's models the same way: greedy answers to the held-out secret
prompts (`safety_test.jsonl`), the helpfulness reward model's and the cost model's mean scores,
the leak rate (answers holding a secret symbol) and exact match with the redacted reversal; and,
for the RL runs, the last 20% of training steps' mean cost (`objective/cost` of the sampled
rollouts, or the cost model's score of them for plain PPO) against the threshold.

    python scripts/evaluate_safety.py --runs_dir outputs/tiny --output outputs/tiny/safety_evaluation.json
"""
import argparse
import json
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.data import PromptOnlyDataset  # noqa: E402
from ppo.evaluation import evaluate_generation, reward_model_score_fn  # noqa: E402
from ppo.models.adapters import load_merged_score_model  # noqa: E402
from ppo.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from ppo.tiny.safety_data import leaked_secrets  # noqa: E402

STAGES = {"sft": "sft-safety", "ppo": "ppo_safety/policy", "ppo_lagrangian": "safe_ppo/policy"}
TRAINING_RUNS = {"ppo": "ppo_safety", "ppo_lagrangian": "safe_ppo"}


def last_fifth(runs_dir, run, key):
    """Mean of `key` over the last 20% of a run's logged training steps, and every 10th step's row."""
    rows = [json.loads(line) for line in open(os.path.join(runs_dir, run, "metrics.jsonl"))]
    rows = [r for r in rows if key in r and "objective/scores" in r]
    tail = rows[len(rows) - max(1, len(rows) // 5):]
    curve = [{k: r.get(k) for k in ("step", "objective/scores", key, "lagrange/lambda")} for r in rows if r["step"] % 10 == 0]
    return sum(r[key] for r in tail) / len(tail), curve


def sampled_cost_last_fifth(runs_dir, run, cost, tokenizer):
    """For a run without a cost model: the cost model's mean score of the rollouts it logged in
    `samples.jsonl` (every step with `num_sample_generations 1`) over its last 20% of steps,
    each scored as prompt + response + EOS."""
    import paddle

    rows = [json.loads(line) for line in open(os.path.join(runs_dir, run, "samples.jsonl"))]
    last = max(r["step"] for r in rows)
    rows = [r for r in rows if r["step"] > last - max(1, last // 5)]
    scores = []
    for r in rows:
        ids = tokenizer(r["prompt"] + r["response"])["input_ids"] + [tokenizer.eos_token_id]
        x = paddle.to_tensor([ids], dtype="int64")
        scores.append(float(cost(input_ids=x, attention_mask=paddle.ones_like(x)).end_scores.numpy().reshape(-1)[0]))
    return sum(scores) / len(scores)


def evaluate_stage(path, args, reward, cost):
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path)
    dataset = PromptOnlyDataset([f"Jsonfile:1.0:{args.test_data}"], tokenizer, prompt_template=args.prompt_template)
    reward_fn, cost_fn, costs = reward_model_score_fn(reward), reward_model_score_fn(cost), []

    def score_fn(batch, out):
        costs.extend(cost_fn(batch, out))
        return reward_fn(batch, out)

    metrics, records = evaluate_generation(model, tokenizer, dataset, batch_size=100, max_new_tokens=args.max_new_tokens,
                                           score_fn=score_fn)
    n = len(records)
    return {
        "reward": metrics["eval/score"],
        "cost": sum(costs) / n,
        "leak_rate": sum(leaked_secrets(r["response"]) > 0 for r in records) / n,
        "redacted_exact_match": metrics["eval/accuracy"],
    }


def main(argv=None):
    from ppo.common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--runs_dir", default="outputs/tiny")
    parser.add_argument("--test_data", default="outputs/tiny/data/safety_test.jsonl")
    parser.add_argument("--reward_model", default="outputs/tiny/rm_helpful")
    parser.add_argument("--cost_model", default="outputs/tiny/cost")
    parser.add_argument("--threshold", type=float, default=0.0, help="the PPO-Lagrangian run's cost budget")
    parser.add_argument("--prompt_template", default="USER: {input} ASSISTANT:")
    parser.add_argument("--max_new_tokens", type=int, default=12)
    parser.add_argument("--output", default="outputs/tiny/safety_evaluation.json")
    args = parser.parse_args(argv)
    reward, cost = load_merged_score_model(args.reward_model), load_merged_score_model(args.cost_model)
    reward.eval()
    cost.eval()
    results = {"threshold": args.threshold, "stages": {}}
    for stage, sub in STAGES.items():
        row = evaluate_stage(os.path.join(args.runs_dir, sub), args, reward, cost)
        if stage in TRAINING_RUNS:
            run = TRAINING_RUNS[stage]
            resolved = json.load(open(os.path.join(args.runs_dir, run, "resolved_arguments.json")))
            row["train_reward_last20"], row["curve"] = last_fifth(args.runs_dir, run, "objective/scores")
            if resolved["ModelArgument"].get("cost_model_name_or_path"):
                row["train_cost_last20"], row["curve"] = last_fifth(args.runs_dir, run, "objective/cost")
            else:
                tokenizer = load_tokenizer(os.path.join(args.runs_dir, sub))
                row["train_cost_last20"] = sampled_cost_last_fifth(args.runs_dir, run, cost, tokenizer)
        else:  # the SFT policy's own samples: the PPO-Lagrangian run's first step, before any update
            first = [json.loads(line) for line in open(os.path.join(args.runs_dir, TRAINING_RUNS["ppo_lagrangian"], "metrics.jsonl"))]
            first = [r for r in first if r.get("step") == 1 and "objective/cost" in r][0]
            row["train_reward_last20"], row["train_cost_last20"] = first["objective/scores"], first["objective/cost"]
        results["stages"][stage] = row
        print(f"[evaluate_safety] {stage}: {json.dumps({k: v for k, v in row.items() if k != 'curve'})}", flush=True)
    json.dump(results, open(args.output, "w"), indent=2)
    return results


def print_safety_table(results):
    """The SFT / PPO / PPO-Lagrangian table of `main`'s results."""
    d = results["threshold"]
    head = (f"{'stage':<15} {'greedy: reward':>14} {'cost':>7} {'leak rate':>9} {'redacted EM':>11} | "
            f"{'sampled: reward':>15} {'cost vs threshold':>18}")
    print("\n" + head + "\n" + "-" * len(head))
    for stage, r in results["stages"].items():
        tail = f"{r['train_cost_last20']:+.3f} {'<=' if r['train_cost_last20'] <= d else '>'} {d:g}"
        print(f"{stage:<15} {r['reward']:>14.3f} {r['cost']:>7.3f} {r['leak_rate']:>9.3f} {r['redacted_exact_match']:>11.3f} | "
              f"{r['train_reward_last20']:>15.3f} {tail:>18}")
    print("greedy: held-out secret prompts; sampled: the RL runs' rollouts over their last 20% of steps (SFT: the first "
          "step's rollouts, before any update)")


if __name__ == "__main__":
    print_safety_table(main())
