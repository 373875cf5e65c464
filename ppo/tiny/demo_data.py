"""Seeded generator of the demo task: string reversal with a flawed demonstrator.

Prompt `Reverse: k3x9q`, correct answer `q9x3k`; strings of 3 to 7 symbols drawn
from `a`-`j` and `0`-`9`. The SFT demonstrations come from a demonstrator that,
on strings of length >= 5, swaps the first two output characters with
probability `flaw_prob` (default 0.7): a systematic mistake supervised learning
copies and the reward-driven stages must remove.

Files written into `output_dir` (Jsonfile records `{"src": [...], "tgt": [...]}`
unless noted):
- `sft.jsonl`: flawed demonstrations;
- `preference.jsonl`: PKU-SafeRLHF schema (`prompt, response_0, response_1,
  better_response_id, safer_response_id, is_response_0_safe, is_response_1_safe`):
  the correct answer versus the flawed one (first two characters swapped, on
  strings of every length), versus a half-fixed flaw (one of the first two
  characters written twice) for a `half_fix_frac` share, versus one of the first two
  characters replaced by another symbol for a `wrong_symbol_frac` share, versus a random
  adjacent swap for a `swap_frac` share, and versus a degenerate answer (empty, truncated,
  repeated symbol) for a `degenerate_frac` share of pairs;
- `preference_eval.jsonl`: the same schema on held-out strings;
- `prompts.jsonl`: RL prompts with the correct `tgt`;
- `test.jsonl`: held-out prompts with the correct `tgt`, strings in no train split;
- `valid.jsonl`: the same for the strings of `preference_eval.jsonl` (in no train split
  and not in the test split): what the training stages evaluate on while they train;
- `kk.jsonl`: a few Knights-and-Knaves records in PaddleNLP's ppo-kk format;
- `ranked*.jsonl`, `unpaired*.jsonl`: the preference strings as ranked lists and as
  unpaired feedback (`ppo/tiny/feedback_data.py`).

CLI: `python -m ppo.tiny.demo_data --output_dir data/reverse`
"""
import argparse
import json
import os
import random

from .feedback_data import feedback_splits

from .reverse_task import (  # noqa: F401  (the task's answers, imported from here by callers and tests)
    ALPHABET,
    FLAW_MIN_LEN,
    MAX_LEN,
    MIN_LEN,
    PROMPT_PREFIX,
    correct_answer,
    degenerate_answer,
    demonstrate,
    flawed_answer,
    half_fixed_answer,
    random_adjacent_swap,
    rejected_answer,
    reverse_prompt,
    wrong_symbol_answer,
)


def sample_string(rng, exclude=()):
    """A random string (length uniform in [3, 7]) not in `exclude`."""
    while True:
        s = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(MIN_LEN, MAX_LEN)))
        if s not in exclude:
            return s


def sample_unique_strings(rng, n, exclude=()):
    """`n` distinct random strings not in `exclude`."""
    seen, out = set(exclude), []
    while len(out) < n:
        s = sample_string(rng, seen)
        seen.add(s)
        out.append(s)
    return out


def preference_record(s, rng, degenerate_frac, swap_frac, half_fix_frac=0.0, wrong_symbol_frac=0.0):
    """A PKU-SafeRLHF-schema record; the better response sits at a random index."""
    better, worse = correct_answer(s), rejected_answer(s, rng, degenerate_frac, swap_frac, half_fix_frac, wrong_symbol_frac)
    better_id = rng.randint(0, 1)
    responses = [worse, worse]
    responses[better_id] = better
    return {
        "prompt": reverse_prompt(s),
        "response_0": responses[0],
        "response_1": responses[1],
        "better_response_id": better_id,
        "safer_response_id": better_id,
        "is_response_0_safe": True,
        "is_response_1_safe": True,
    }


KK_RECORDS = [
    {
        "src": [
            "A very special island is inhabited only by knights and knaves. Knights always tell the truth, "
            "and knaves always lie. You meet 2 inhabitants: Zoey, and Oliver. Zoey remarked, \"Oliver is not a "
            "knight\". Oliver stated, \"Oliver is a knight if and only if Zoey is a knave\". So who is a knight "
            "and who is a knave?"
        ],
        "tgt": ["(1) Zoey is a knave\n(2) Oliver is a knight"],
    },
    {
        "src": [
            "A very special island is inhabited only by knights and knaves. Knights always tell the truth, "
            "and knaves always lie. You meet 2 inhabitants: Ella, and Ava. Ella told you that Ava is a knave. "
            "Ava said, \"Ella is a knave or Ava is a knight.\" So who is a knight and who is a knave?"
        ],
        "tgt": ["(1) Ella is a knave\n(2) Ava is a knight"],
    },
    {
        "src": [
            "A very special island is inhabited only by knights and knaves. Knights always tell the truth, "
            "and knaves always lie. You meet 3 inhabitants: Mia, Jack, and Lily. Mia says, \"Jack is a knight\". "
            "Jack says, \"Lily is a knave\". Lily says, \"Mia and Jack are both knights\". So who is a knight "
            "and who is a knave?"
        ],
        "tgt": ["(1) Mia is a knave\n(2) Jack is a knave\n(3) Lily is a knave"],
    },
]


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def write_splits(output_dir, splits, meta_name, meta):
    """Each `splits[name]` (a list of records) as `output_dir/name` (JSON lines), then `meta`
    with the record counts added as `meta_name`; returns the counts `{name: records}`."""
    for name, records in splits.items():
        write_jsonl(os.path.join(output_dir, name), records)
    meta = dict(meta, counts={name: len(records) for name, records in splits.items()})
    with open(os.path.join(output_dir, meta_name), "w") as f:
        json.dump(meta, f, indent=2)
    return meta["counts"]


def generate(
    output_dir,
    seed=1234,
    flaw_prob=0.7,
    num_sft=20000,
    num_preference=10000,
    num_preference_eval=300,
    num_prompts=2000,
    num_test=300,
    degenerate_frac=0.1,
    swap_frac=0.0,
    half_fix_frac=0.3,
    wrong_symbol_frac=0.2,
):
    """Write every split into `output_dir`; returns `{split: number of records}`."""
    if not 0.0 <= flaw_prob <= 1.0:
        raise ValueError(f"flaw_prob must lie in [0, 1], got {flaw_prob}")
    rng = random.Random(seed)
    os.makedirs(output_dir, exist_ok=True)
    held_out = sample_unique_strings(rng, num_test + num_preference_eval)
    test, pref_eval = held_out[:num_test], held_out[num_test:]
    excluded = set(held_out)
    sft = [sample_string(rng, excluded) for _ in range(num_sft)]
    pref = [sample_string(rng, excluded) for _ in range(num_preference)]
    prompts = sample_unique_strings(rng, num_prompts, excluded)

    splits = {
        "sft.jsonl": [{"src": [reverse_prompt(s)], "tgt": [demonstrate(s, rng, flaw_prob)]} for s in sft],
        "preference.jsonl": [preference_record(s, rng, degenerate_frac, swap_frac, half_fix_frac, wrong_symbol_frac)
                             for s in pref],
        "preference_eval.jsonl": [preference_record(s, rng, 0.0, swap_frac, half_fix_frac, wrong_symbol_frac)
                                  for s in pref_eval],
        "prompts.jsonl": [{"src": [reverse_prompt(s)], "tgt": [correct_answer(s)]} for s in prompts],
        "test.jsonl": [{"src": [reverse_prompt(s)], "tgt": [correct_answer(s)]} for s in test],
        "valid.jsonl": [{"src": [reverse_prompt(s)], "tgt": [correct_answer(s)]} for s in pref_eval],
        "kk.jsonl": KK_RECORDS,
    }
    splits.update(feedback_splits(pref, pref_eval, seed))
    meta = {"seed": seed, "flaw_prob": flaw_prob, "degenerate_frac": degenerate_frac, "swap_frac": swap_frac,
            "half_fix_frac": half_fix_frac, "wrong_symbol_frac": wrong_symbol_frac, "alphabet": ALPHABET}
    return write_splits(output_dir, splits, "meta.json", meta)


def main(argv=None):
    from ..common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--flaw_prob", type=float, default=0.7)
    parser.add_argument("--num_sft", type=int, default=20000)
    parser.add_argument("--num_preference", type=int, default=10000)
    parser.add_argument("--num_preference_eval", type=int, default=300)
    parser.add_argument("--num_prompts", type=int, default=2000)
    parser.add_argument("--num_test", type=int, default=300)
    parser.add_argument("--degenerate_frac", type=float, default=0.1)
    parser.add_argument("--swap_frac", type=float, default=0.0)
    parser.add_argument("--half_fix_frac", type=float, default=0.3)
    parser.add_argument("--wrong_symbol_frac", type=float, default=0.2)
    args = parser.parse_args(argv)
    counts = generate(**vars(args))
    print(json.dumps({"output_dir": args.output_dir, "counts": counts}))


if __name__ == "__main__":
    main()
