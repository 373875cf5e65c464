"""Evaluate any checkpoint with any verifier: n sampled responses per prompt, pass@k, maj@n, mean@n.

    python scripts/evaluate.py --model outputs/tiny/sft --data outputs/tiny/data/test.jsonl \\
        --verifier reverse --num_samples 8 --temperature 1.0 --output outputs/tiny/eval_sft.json
    python scripts/evaluate.py --model outputs/tiny/sft --data outputs/tiny/data/test.jsonl \\
        --verifier reverse --greedy          # one greedy answer: pass@1 = the quickstart's accuracy
    python scripts/evaluate.py --model my_lora_adapter --data gsm8k_test.jsonl \\
        --verifier '{"gsm8k": 1.0, "format": {"weight": 0.2, "allow_outside": true}}' --num_samples 16

`--model` is a full model directory or a LoRA adapter (merged into its base for the run);
`--data` a prompt file in any local format the trainers read (Jsonfile src/tgt by default, see
docs/data.md), its reference answers the labels; `--verifier` any registered scorer or
combination (docs/verifiers.md). Responses are sampled with the rollout engine. The JSON written
to `--output` holds `metrics` (pass@k for k = 1, 2, 4, ... and n, maj@n, mean@n, mean_score,
response_length), the `settings` of the run and, with `--details`, every prompt's responses,
scores, verdicts and answers. With `--greedy` every sample is the greedy answer, so
pass@k = pass@1 = mean@n.
"""
import argparse
import json
import os
import time

from ppo.common.cpu_flags import default_mkl_code_path  # noqa: E402
default_mkl_code_path()  # before paddle: MKL's AVX2 path on AMD CPUs (3-4x faster matmuls there)

from ppo.scorers import WeightedScorer  # noqa: E402
from ppo.evaluation.metrics import default_ks  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model directory or LoRA adapter directory")
    parser.add_argument("--data", required=True, help="prompt file with reference answers (a path or a dataset spec)")
    parser.add_argument("--data_format", default="Jsonfile", help="dataset kind of --data when it is a path")
    parser.add_argument("--verifier", default="reverse", help="scorer name(s) with weights, or a JSON object")
    parser.add_argument("--weights", default=None, help="comma-separated weights for a comma-separated --verifier")
    parser.add_argument("--num_samples", type=int, default=1, help="responses per prompt (n)")
    parser.add_argument("--ks", default=None, help="comma-separated k of pass@k (default 1, 2, 4, ... and n)")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--top_k", type=int, default=0)
    parser.add_argument("--max_new_tokens", type=int, default=12)
    parser.add_argument("--min_new_tokens", type=int, default=0)
    parser.add_argument("--prompt_template", default="USER: {input} ASSISTANT:")
    parser.add_argument("--use_chat_template", action="store_true", help="the tokenizer's chat template instead")
    parser.add_argument("--prompt_key", default=None, help="record field of the prompt (default: the format's)")
    parser.add_argument("--response_key", default=None, help="record field of the reference answer")
    parser.add_argument("--batch_size", type=int, default=64, help="prompts per generation batch")
    parser.add_argument("--max_prompts", type=int, default=0, help="evaluate the first N prompts only (0: all)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--no_rollout_engine", action="store_true", help="PaddleNLP's generate instead of the engine")
    parser.add_argument("--details", action="store_true", help="write every prompt's responses and verdicts too")
    parser.add_argument("--output", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.num_samples < 1 or args.batch_size < 1 or args.max_prompts < 0:
        parser.error("--num_samples and --batch_size must be >= 1, --max_prompts >= 0")
    from ppo.common.validation import check_model_dir

    try:
        check_model_dir("--model", args.model)
    except ValueError as err:
        parser.error(str(err))
    try:
        args.scorer = WeightedScorer(args.verifier, args.weights)
        args.ks_list = default_ks(args.num_samples) if args.ks is None else [int(k) for k in args.ks.split(",")]
    except ValueError as err:
        parser.error(f"--verifier/--weights/--ks: {err}")
    if not args.scorer.judges_correctness:
        parser.error(f"--verifier {args.verifier}: none of its scorers says which answers are correct (correct_at); "
                     "add a verifier such as math_boxed, gsm8k, choice or reverse")
    if any(not 1 <= k <= args.num_samples for k in args.ks_list):
        parser.error(f"--ks: every k must be in [1, --num_samples={args.num_samples}], got {args.ks_list}")
    return args


def load_dataset(args, tokenizer):
    from ppo.data import PromptOnlyDataset

    spec = args.data if (":" in args.data and not os.path.exists(args.data)) else f"{args.data_format}:1.0:{args.data}"
    return PromptOnlyDataset([spec], tokenizer, prompt_template=args.prompt_template,
                             use_chat_template=args.use_chat_template, prompt_key=args.prompt_key,
                             response_key=args.response_key, seed=args.seed)


def main(argv=None):
    args = parse_args(argv)
    from ppo.models.adapters import load_merged_causal_lm
    from ppo.models.loading import load_tokenizer
    from ppo.rollout import SamplingParams
    from ppo.evaluation.sampled import evaluate_sampled, scorer_judge

    judge = scorer_judge(args.scorer)
    tokenizer = load_tokenizer(args.model)
    dataset = load_dataset(args, tokenizer)  # before the model: a data error stops the run before it loads
    model = load_merged_causal_lm(args.model)
    count = len(dataset) if not args.max_prompts else min(args.max_prompts, len(dataset))
    params = SamplingParams(max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens,
                            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, do_sample=not args.greedy)
    start = time.time()
    metrics, records = evaluate_sampled(model, tokenizer, dataset, judge, args.num_samples, params, args.batch_size,
                                        args.seed, list(range(count)), ks=args.ks_list,
                                        use_rollout_engine=not args.no_rollout_engine)
    settings = {k: v for k, v in vars(args).items() if k not in ("scorer", "ks_list", "output", "details")}
    settings.update(num_prompts=count, ks=args.ks_list, wall_s=round(time.time() - start, 3))
    result = {"metrics": metrics, "settings": settings}
    if args.details:
        result["prompts"] = records
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
    print(json.dumps(metrics, indent=2))
    return result


if __name__ == "__main__":
    from ppo.common.process_exit import run_and_exit

    run_and_exit(main)  # a data error (an empty or malformed --data file): one line, exit status 2
