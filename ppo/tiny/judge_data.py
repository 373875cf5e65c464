"""Judgement data for the demo task: teaches a tiny policy to answer the judge's rubric prompts.

The tiny models only ever saw `Reverse: ...` prompts; a judge must read the `tiny` and
`tiny_better` templates of `ppo/judge/templates.py` and answer with a verdict. From the preference
pairs of the training split (`preference.jsonl`: the correct reversal and a worse answer: the
demonstrator's flaw, a half fix, a wrong symbol, an adjacent swap or a degenerate answer) this
writes `Jsonfile` records for `sft/run_sft.py` with the prompt template `USER: {input} ASSISTANT:`:

- pointwise: `Judge: Reverse: k3x9q => q9x3k` -> `Yes`, and the worse answer -> `No`;
- pairwise: `Compare: Reverse: k3x9q A: q9x3k B: 9qx3k` -> `A`, and the same pair swapped -> `B`.

The held-out pairs (`preference_eval.jsonl`, strings in no training split) stay for measuring the
judge against the rule scorer `reverse`:

    python -m ppo.tiny.judge_data --data_dir outputs/tiny/data --num_pairs 4000
"""
import argparse
import json
import os
import random

from ..judge.templates import render

POINTWISE = "Judge: {question} => {answer}"
PAIRWISE = "Compare: {question} A: {answer_a} B: {answer_b}"
"""The user turns of the `tiny` and `tiny_better` templates (the SFT prompt template adds `USER: `
and ` ASSISTANT:` around them)."""


def read_pairs(path):
    """`[(question, better, worse)]` of a PKU-SafeRLHF-style preference file."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            better = r[f"response_{r['better_response_id']}"]
            worse = r[f"response_{1 - r['better_response_id']}"]
            pairs.append((r["prompt"], better, worse))
    return pairs


def judgement_records(pairs):
    """Four records per pair: both answers judged alone, and the pair compared in both orders."""
    records = []
    for question, better, worse in pairs:
        records += [
            {"src": [render(POINTWISE, question=question, answer=better)], "tgt": ["Yes"]},
            {"src": [render(POINTWISE, question=question, answer=worse)], "tgt": ["No"]},
            {"src": [render(PAIRWISE, question=question, answer_a=better, answer_b=worse)], "tgt": ["A"]},
            {"src": [render(PAIRWISE, question=question, answer_a=worse, answer_b=better)], "tgt": ["B"]},
        ]
    return records


def generate(data_dir, num_pairs=4000, seed=7, output="judge.jsonl"):
    """Write `output` (in `data_dir`) from the first `num_pairs` pairs of `preference.jsonl`,
    shuffled with `seed`; returns the number of records."""
    records = judgement_records(read_pairs(os.path.join(data_dir, "preference.jsonl"))[:num_pairs])
    random.Random(seed).shuffle(records)
    with open(os.path.join(data_dir, output), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return len(records)


def main(argv=None):
    from ..common.argument_help import doc_summary

    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--data_dir", required=True, help="the demo data (preference.jsonl); judge.jsonl is written there")
    parser.add_argument("--num_pairs", type=int, default=4000, help="training pairs used (4 records each)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    print(json.dumps({"judge.jsonl": generate(args.data_dir, args.num_pairs, args.seed)}))


if __name__ == "__main__":
    main()
