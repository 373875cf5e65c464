"""The judge demo on the tiny task: how often a generative judge agrees with the rule scorer `reverse`
on the held-out preference pairs (strings in no training split).

    python scripts/judge_demo.py --output_root outputs/tiny --policy outputs/tiny/distill/teacher/policy

The policy (by default the on-policy distilled student of seed 42, which ties the teacher at 0.993
held-out and trains 4x faster; run `scripts/distill_demo.py` first) is measured twice: as it is, and
after a short SFT on judgement data (`ppo/tiny/judge_data.py`: the `tiny` / `tiny_better` rubric
prompts answered Yes/No and A/B, built from the training split's preference pairs, plus the task
itself), since a policy that only ever saw `Reverse: ...` prompts was never asked for a verdict. With
`--extra_layers N` the judge SFT starts from the policy with N more layers that leave its output as
it was (`ppo/tiny/deepen.py`): room for the comparison the 2-layer policy has no layer left for.
`--template tiny_reference` teaches and measures the rubric with the reference answer; `--no_pairwise`,
`--error_prefixes`, `--near_misses N`, `--fetch` and `--prefixes` (verdicts on every prefix of
each judged answer: the data that taught a judge, docs/distillation.md) shape the judge data
(`ppo/tiny/judge_data.py`).
Three agreements per judge, on the 300 pairs of
`preference_eval.jsonl` (a correct answer and a worse one; `reverse` gives them 1 and 0):

- pointwise verdicts: `judge >= 0.5` equals `reverse == 1`, over the 600 answers (the `judge`
  scorer through the scorer registry, batched);
- pointwise ranking: the judge scores the correct answer above the worse one;
- pairwise: `compare` (both orders averaged) prefers the correct answer.

Results go to `<judge_dir>/agreement.json` (default `<root>/judge`).
"""
import argparse
import json
import os
import time

from scripts.distill_demo import PY, run  # noqa: E402


def agreement(model, pairs, template="tiny"):
    """The three agreements of the judge `model` (pointwise `template`) with `reverse` on `pairs`
    [(question, better, worse)]; the reference of `tiny_reference` is the correct answer (the label)."""
    from ppo.scoring.registry import WeightedScorer
    from ppo.scorers import reverse_score

    scorer = WeightedScorer({"judge": {"model": model, "template": template, "pair_template": "tiny_better"}})
    questions = [q for q, _, _ in pairs]
    answers = [b for _, b, _ in pairs] + [w for _, _, w in pairs]
    labels = [b for _, b, _ in pairs] * 2
    start = time.time()
    scores, _ = scorer.score_batch(questions * 2, labels, answers)
    rule = [reverse_score(q, t, a) for q, t, a in zip(questions * 2, labels, answers)]
    n = len(pairs)
    preference = scorer.functions[0].judge.compare(questions, answers[:n], answers[n:])
    return {
        "pointwise_verdicts": sum((s >= 0.5) == (r == 1.0) for s, r in zip(scores, rule)) / len(rule),
        "pointwise_ranking": sum(scores[i] > scores[n + i] for i in range(n)) / n,
        "pairwise": sum(p > 0.5 for p in preference) / n,
        "pairs": n, "score_correct_mean": sum(scores[:n]) / n, "score_worse_mean": sum(scores[n:]) / n,
        "judge_s": round(time.time() - start, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_root", default="outputs/tiny")
    parser.add_argument("--policy", default=None, help="the judge's starting policy (default: the distilled student, seed 42)")
    parser.add_argument("--num_pairs", type=int, default=4000, help="training pairs of the judgement data")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max_length", type=int, default=64, help="judge SFT's longest record (tokens); longer ones are cut")
    parser.add_argument("--extra_layers", type=int, default=0, help="layers added to the policy before the judge SFT")
    parser.add_argument("--template", default="tiny", choices=("tiny", "tiny_reference"),
                        help="the pointwise rubric taught and measured (tiny_reference: with the reference answer)")
    parser.add_argument("--no_pairwise", action="store_true", help="no pairwise (tiny_better) records in the judge data")
    parser.add_argument("--error_prefixes", action="store_true", help="judge data: also each worse answer cut after its first error")
    parser.add_argument("--near_misses", type=int, default=0, help="judge data: more correct/near-miss record pairs per pair")
    parser.add_argument("--fetch", action="store_true", help="judge data: Given:/Wanted: copy records of each judged answer")
    parser.add_argument("--prefixes", action="store_true", help="judge data: verdicts on every prefix of each judged answer")
    parser.add_argument("--judge_dir", default=None, help="where the judge and agreement.json go (default <root>/judge)")
    args = parser.parse_args(argv)
    root = args.output_root.rstrip("/")
    policy = args.policy or f"{root}/distill/onpolicy-s42"
    out = (args.judge_dir or f"{root}/judge").rstrip("/")
    logs = f"{out}/logs"
    from ppo.tiny.judge_data import SFT_PROMPT_TEMPLATE, generate, read_pairs

    layout = dict(layout=args.template, pairwise=not args.no_pairwise, error_prefixes=args.error_prefixes,
                  near_misses=args.near_misses, fetch=args.fetch, prefixes=args.prefixes)
    data = "judge.jsonl" if layout == dict(layout="tiny", pairwise=True, error_prefixes=False, near_misses=0, fetch=False, prefixes=False) else \
        f"judge_{args.template}{'_nopair' if args.no_pairwise else ''}{'_prefix' if args.error_prefixes else ''}" \
        f"{f'_near{args.near_misses}' if args.near_misses else ''}{'_fetch' if args.fetch else ''}{'_prefixes' if args.prefixes else ''}.jsonl"
    if not os.path.isfile(f"{root}/data/{data}"):
        generate(f"{root}/data", args.num_pairs, output=data, **layout)
    start = policy
    if args.extra_layers:
        from ppo.tiny.deepen import deepen

        start = f"{out}/deepened"
        if not os.path.isfile(f"{start}/model_state.pdparams"):
            deepen(policy, start, args.extra_layers, args.seed)
    if not os.path.isfile(f"{out}/model/summary.json"):
        run(logs, "judge_sft", [PY, "sft/run_sft.py", "config/tiny/sft_argument.json", "--model_name_or_path", start,
                                "--train_datasets", f"Jsonfile:1.0:{root}/data/{data}", "--eval_datasets",
                                f"Jsonfile:1.0:{root}/data/valid.jsonl", "--output_dir", f"{out}/model", "--logging_dir",
                                f"{out}/model/visualdl", "--max_length", str(args.max_length), "--prompt_template", SFT_PROMPT_TEMPLATE, "--max_steps", str(args.steps),
                                "--learning_rate", str(args.learning_rate), "--warmup_steps", "30", "--eval_steps", str(args.steps), "--save_steps", str(args.steps),
                                "--seed", str(args.seed), "--report_to", "none"])
    pairs = read_pairs(f"{root}/data/preference_eval.jsonl")
    result = {"policy": policy, "extra_layers": args.extra_layers, "steps": args.steps, "learning_rate": args.learning_rate,
              "seed": args.seed, **layout, "policy_as_judge": agreement(policy, pairs, args.template),
              "trained_judge": agreement(f"{out}/model", pairs, args.template)}
    os.makedirs(out, exist_ok=True)
    json.dump(result, open(f"{out}/agreement.json", "w"), indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
