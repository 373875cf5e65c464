"""Evaluate every stage's model of the tiny pipeline the same way: greedy answers to
the held-out prompts, exact match (overall, long, short), the learned reward
model's mean score and the mean response length.

    python scripts/evaluate_stages.py --output outputs/tiny/evaluation.json
    python scripts/evaluate_stages.py --stages sft,dpo --output part.json   # only these stages
    python scripts/evaluate_stages.py --stages ppo --include part.json     # these, plus part.json's

The quickstart evaluates SFT, GRPO and DPO beside PPO and only PPO after it (`--include`).
"""
import argparse
import json
import os

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

import paddlenlp.transformers  # noqa: E402,F401 (the score model's; imported ahead when started ahead)
from ppo.data import PromptOnlyDataset  # noqa: E402
from ppo.evaluation import evaluate_generation  # noqa: E402
from ppo.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from ppo.models.adapters import load_merged_score_model  # noqa: E402

STAGES = {"sft": "sft", "ppo": "ppo/policy", "grpo": "grpo/policy", "dpo": "dpo", "online_dpo": "online_dpo/policy"}


def load_included(parser, path):
    """`{stage: metrics}` of an earlier evaluation (empty without one); a missing file is an error."""
    if path is None:
        return {}
    if not os.path.isfile(path):
        parser.error(f"--include: {path} does not exist")
    return json.load(open(path))


def main(argv=None):
    from ppo.common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--runs_dir", default="outputs/tiny")
    parser.add_argument("--test_data", default="outputs/tiny/data/test.jsonl")
    parser.add_argument("--reward_model", default="outputs/tiny/rm")
    parser.add_argument("--prompt_template", default="USER: {input} ASSISTANT:")
    parser.add_argument("--max_new_tokens", type=int, default=12)
    parser.add_argument("--output", default="outputs/tiny/evaluation.json")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages to evaluate")
    parser.add_argument("--include", default=None, help="an earlier output of this script: its stages are copied")
    args = parser.parse_args(argv)
    stages = [name.strip() for name in args.stages.split(",") if name.strip()]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parser.error(f"--stages: unknown {unknown}; choose from {list(STAGES)}")
    included = load_included(parser, args.include)
    reward = load_merged_score_model(args.reward_model)
    reward.eval()
    results = {}
    for stage, sub in STAGES.items():
        if stage not in stages:
            if stage in included:
                results[stage] = included[stage]
            continue
        path = os.path.join(args.runs_dir, sub)
        if not os.path.isdir(path):
            print(f"[evaluate] {stage}: {path} missing, skipped")
            continue
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path)
        dataset = PromptOnlyDataset([f"Jsonfile:1.0:{args.test_data}"], tokenizer, prompt_template=args.prompt_template)
        metrics, _ = evaluate_generation(model, tokenizer, dataset, batch_size=100, max_new_tokens=args.max_new_tokens,
                                         reward_model=reward)
        results[stage] = {
            "accuracy": metrics["eval/accuracy"],
            "accuracy_long": metrics["eval/accuracy_long"],
            "accuracy_short": metrics["eval/accuracy_short"],
            "mean_reward": metrics["eval/score"],
            "response_length": metrics["eval/response_length"],
        }
        print(f"[evaluate] {stage}: {json.dumps(results[stage])}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    json.dump(results, open(args.output, "w"), indent=2)
    return results


if __name__ == "__main__":
    main()
