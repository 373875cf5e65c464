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

Options (docs/distillation.md, "With the reference answer, and near misses"): the `tiny_reference`
layout (the correct answer as `{reference}`), no pairwise records, error prefixes, near misses,
fetch records, and prefix verdicts (`prefix_records`: what taught the demo's judge). The answers
stand where the policy writes its own, so the judge can reuse what the policy computes there; an
earlier layout with the answer inside the user turn (`USER: Judge: Reverse: k3x9q =>
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
from .reverse_task import half_fixed_answer, random_adjacent_swap, wrong_symbol_answer

POINTWISE, PAIRWISE = TEMPLATES["tiny"], TEMPLATES["tiny_better"]
LAYOUTS = ("tiny", "tiny_reference")
"""Pointwise templates the records can be written in (`tiny_reference` adds the reference answer)."""
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


def first_error(answer, reference):
    """The index of the first character where `answer` departs from `reference` (a character that
    differs, or the end of the shorter one); None when they are equal."""
    if answer == reference:
        return None
    return next((i for i, (a, r) in enumerate(zip(answer, reference)) if a != r), min(len(answer), len(reference)))


def near_miss(correct, rng):
    """A wrong answer of the same length as `correct` (at least 2 characters): its first two characters
    swapped (the demonstrator's flaw), a half fix, a wrong symbol in the first two places or a random
    adjacent swap, chosen with `rng`; None when the chosen one equals `correct`."""
    kind = rng.randrange(4)
    if kind == 0:
        wrong = correct[1] + correct[0] + correct[2:]
    else:
        wrong = (half_fixed_answer, wrong_symbol_answer, random_adjacent_swap)[kind - 1](correct, rng)
    return None if wrong == correct else wrong


def fetch_records(question, answer, correct):
    """Two records that ask for what a verdict on `answer` compares (layout `tiny`): after `Given:` the
    answer's first two characters, after `Wanted:` the correct answer's (the question's last two,
    mirrored). Each is a copy, learnable on its own, unlike the verdict (an equality of the two)."""
    stem = f"USER: {question} ASSISTANT:{answer}"
    return [{"src": [f"{stem} Given:"], "tgt": [answer[:2]]}, {"src": [f"{stem} Wanted:"], "tgt": [correct[:2]]}]


UNFINISHED = "..."
"""Marks a partial answer in a prefix record: its verdict is "no error so far", while the same text
without the mark is a whole answer, wrong when it stops early."""


def prefix_records(question, answer, correct, pointwise):
    """`pointwise` verdicts on every proper prefix of `answer` written as unfinished (`c9c...`): `Yes`
    while the prefix agrees with `correct`, `No` from its first wrong character on. A prefix's verdict
    first depends on the character just before the mark (a local check the judge can learn), over
    longer prefixes on every earlier one: the comparisons a whole answer's verdict gathers."""
    cut = first_error(answer, correct)
    return [{"src": [render(pointwise, question=question, answer=answer[:k] + UNFINISHED, reference=correct)],
             "tgt": ["Yes" if cut is None or k <= cut else "No"]} for k in range(1, len(answer))]


def stopped_early_record(question, correct, pointwise, rng):
    """A proper prefix of `correct` (its length drawn with `rng`) as a whole answer -> `No`."""
    early = correct[:rng.randrange(1, len(correct))]
    return {"src": [render(pointwise, question=question, answer=early, reference=correct)], "tgt": ["No"]}


def judgement_records(pairs, keep_task=True, layout="tiny", pairwise=True, error_prefixes=False, near_misses=0,
                      rng=None, fetch=False, prefixes=False):
    """Records per pair: both answers judged alone (`layout`: `tiny`, or `tiny_reference` with the
    correct answer as the reference), with `pairwise` the pair compared in both orders (`tiny_better`),
    with `keep_task` the task itself (`USER: Reverse: k3x9q ASSISTANT:` -> the correct answer), so that
    the policy keeps computing what the judge reads, and with `error_prefixes` the worse answer cut
    right after its first wrong character (`q9x3k` vs `9q...` -> `9`) -> `No`: a record whose cue is
    its last character. `near_misses` more pairs of records per pair: the correct answer -> `Yes`
    and a `near_miss` of it (drawn with `rng`) -> `No`, so that most verdicts need a comparison. With
    `fetch`, `fetch_records` of every judged answer. With `prefixes`, `prefix_records` of every judged
    answer and a `stopped_early_record` per pair as well."""
    if layout not in LAYOUTS:
        raise ValueError(f"judge data layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    pointwise = TEMPLATES[layout]
    records = []
    for question, better, worse in pairs:
        if keep_task:
            records.append({"src": [f"USER: {question} ASSISTANT:"], "tgt": [better]})
        records += [
            {"src": [render(pointwise, question=question, answer=better, reference=better)], "tgt": ["Yes"]},
            {"src": [render(pointwise, question=question, answer=worse, reference=better)], "tgt": ["No"]},
        ]
        if prefixes:
            records += prefix_records(question, better, better, pointwise) + prefix_records(question, worse, better, pointwise)
            records += [stopped_early_record(question, better, pointwise, rng)] if len(better) >= 2 else []
        cut = first_error(worse, better)
        if error_prefixes and cut is not None and cut < len(worse) and worse[:cut + 1] != worse:
            records.append({"src": [render(pointwise, question=question, answer=worse[:cut + 1], reference=better)],
                            "tgt": ["No"]})
        for _ in range(near_misses):
            wrong = near_miss(better, rng) if len(better) >= 2 else None
            if wrong is not None:
                records += prefix_records(question, wrong, better, pointwise) if prefixes else []
                records += [{"src": [render(pointwise, question=question, answer=a, reference=better)], "tgt": [v]}
                            for a, v in ((better, "Yes"), (wrong, "No"))]
                records += fetch_records(question, wrong, better) if fetch else []
        if fetch and worse:
            records += fetch_records(question, better, better) + fetch_records(question, worse, better)
        if pairwise:
            records += [
                {"src": [render(PAIRWISE, question=question, answer_a=better, answer_b=worse)], "tgt": ["A"]},
                {"src": [render(PAIRWISE, question=question, answer_a=worse, answer_b=better)], "tgt": ["B"]},
            ]
    return records


def generate(data_dir, num_pairs=4000, seed=7, output="judge.jsonl", keep_task=True, **layout):
    """Write `output` (in `data_dir`) from the first `num_pairs` pairs of `preference.jsonl`,
    shuffled with `seed` (`layout`: the options of `judgement_records`); returns the number of records."""
    pairs = read_pairs(os.path.join(data_dir, "preference.jsonl"))[:num_pairs]
    rng = random.Random(seed)
    records = judgement_records(pairs, keep_task, rng=rng, **layout)
    rng.shuffle(records)
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
    parser.add_argument("--layout", default="tiny", choices=LAYOUTS, help="the pointwise template of the records")
    parser.add_argument("--no_pairwise", action="store_true", help="leave out the pairwise (tiny_better) records")
    parser.add_argument("--error_prefixes", action="store_true", help="add each worse answer cut after its first error")
    parser.add_argument("--near_misses", type=int, default=0, help="more correct/near-miss record pairs per pair")
    parser.add_argument("--fetch", action="store_true", help="add the Given:/Wanted: copy records of each judged answer")
    parser.add_argument("--prefixes", action="store_true", help="verdicts on every prefix of each judged answer")
    parser.add_argument("--output", default="judge.jsonl")
    args = parser.parse_args(argv)
    n = generate(args.data_dir, args.num_pairs, args.seed, args.output, layout=args.layout,
                 pairwise=not args.no_pairwise, error_prefixes=args.error_prefixes, near_misses=args.near_misses, fetch=args.fetch, prefixes=args.prefixes)
    print(json.dumps({args.output: n}))


if __name__ == "__main__":
    main()
