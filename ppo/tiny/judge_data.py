"""Judgement data for the demo task: teaches a tiny policy to answer the judge's rubric prompts.

The tiny models only ever saw `Reverse: ...` prompts; a judge must read the `tiny` and
`tiny_better` templates of `ppo/judge/templates.py` and answer with a verdict. From the preference
pairs of the training split (`preference.jsonl`: the correct reversal and a worse answer: the
demonstrator's flaw, a half fix, a wrong symbol, an adjacent swap or a degenerate answer) this
writes `Jsonfile` records for `sft/run_sft.py` whose `src` is the whole rendered template (train
with the prompt template `{input}`):

- pointwise: `USER: Reverse: k3x9q ASSISTANT:q9x3k Judge:` -> `Yes`, the worse answer -> `No`;
- pairwise: `USER: Reverse: k3x9q ASSISTANT:q9x3k USER: Reverse: k3x9q ASSISTANT:9qx3k Better:` -> `A`,
  and the same pair swapped -> `B`.

The answers stand where the policy writes its own, so the judge can reuse what the policy computes
there; an earlier layout with the answer inside the user turn (`USER: Judge: Reverse: k3x9q =>
q9x3k ASSISTANT:`) stayed at chance after 1,500 steps of SFT.

The held-out pairs (`preference_eval.jsonl`, strings in no training split) stay for measuring the
judge against the rule scorer `reverse`:

    python -m ppo.tiny.judge_data --data_dir outputs/tiny/data --num_pairs 4000
"""
import argparse
import json
import os
import random

from ..judge.templates import TEMPLATES, render

POINTWISE, PAIRWISE = TEMPLATES["tiny"], TEMPLATES["tiny_better"]
SFT_PROMPT_TEMPLATE = "{input}"
"""The records' `src` are whole judge prompts: SFT adds nothing around them."""


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


def judgement_records(pairs, keep_task=True):
    """Four records per pair: both answers judged alone, and the pair compared in both orders; with
    `keep_task`, a fifth: the task itself (`USER: Reverse: k3x9q ASSISTANT:` -> the correct answer),
    so that the policy keeps computing what the judge reads."""
    records = []
    for question, better, worse in pairs:
        if keep_task:
            records.append({"src": [f"USER: {question} ASSISTANT:"], "tgt": [better]})
        records += [
            {"src": [render(POINTWISE, question=question, answer=better)], "tgt": ["Yes"]},
            {"src": [render(POINTWISE, question=question, answer=worse)], "tgt": ["No"]},
            {"src": [render(PAIRWISE, question=question, answer_a=better, answer_b=worse)], "tgt": ["A"]},
            {"src": [render(PAIRWISE, question=question, answer_a=worse, answer_b=better)], "tgt": ["B"]},
        ]
    return records


def generate(data_dir, num_pairs=4000, seed=7, output="judge.jsonl", keep_task=True):
    """Write `output` (in `data_dir`) from the first `num_pairs` pairs of `preference.jsonl`,
    shuffled with `seed`; returns the number of records."""
    records = judgement_records(read_pairs(os.path.join(data_dir, "preference.jsonl"))[:num_pairs], keep_task)
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
