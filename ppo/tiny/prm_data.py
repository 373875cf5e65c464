"""Seeded step-labelled data of the demo task for a process reward model (Math-Shepherd format,
`ppo/data/process_reward.py`).

The answer to `Reverse: k3x9q` is written in steps of `STEP_CHARS` characters (`q9|x3|k|`, the
placeholder `|` after each step); a step is good when it holds exactly the characters of the
correct answer at its place. Each answer is the correct one or the correct one with one to three
same-length corruptions (two characters swapped, a character replaced by another symbol,
the demonstrator's flaw: the first two characters swapped), so about half of the steps are bad
and a bad step can sit anywhere; a quarter of the answers are then stopped early or run on (a step
past the end is bad), and an empty last step says whether the answer stops where it should (a PRM
that never sees the end scores an answer cut short like a whole one, and GRPO against it learnt to
stop early: PPO/GRPO's `prm_end_step` scores the EOS as that step). Record: `{"input": "USER:
Reverse: k3x9q ASSISTANT:q9|x3|k||", "label": "USER: Reverse: k3x9q ASSISTANT:q9+x3-k++"}` (the
tiny template, `config/tiny/`).

A PRM reads the step marks only if its model knows where the correct characters of an answer
written in steps stand: the quickstart's policy, which never saw a placeholder inside an answer,
predicts the characters after the first `|` right 0-5% of the time (100% without placeholders),
so a PRM trained from it must learn the task again from step labels alone. `prm_sft.jsonl` (the
training strings' correct answers in steps, `{"src": ["Reverse: k3x9q"], "tgt": ["q9|x3|k|"]}`)
teaches the PRM's starting model that layout first (`config/tiny/sft_steps_argument.json`, from the
base model), the way a math PRM starts from a model that writes its solutions in steps; `prm_test.jsonl` holds the held-out strings'
prompts with their stepped answers. A policy trained against the PRM writes plain answers: the PRM
scorer cuts them every two tokens and puts the placeholders in (`prm_step_tokens 2`,
`config/tiny/grpo_prm_argument.json`).

Files: `prm_train.jsonl`, `prm_eval.jsonl` (strings in no train record), `prm_sft.jsonl`,
`prm_test.jsonl`, `prm_meta.json`.
CLI: `python -m ppo.tiny.prm_data --output_dir outputs/tiny/data`
"""
import argparse
import json
import os
import random

from .demo_data import ALPHABET, correct_answer, flawed_answer, reverse_prompt, sample_unique_strings, write_splits

STEP_CHARS = 2
PLACEHOLDER = "|"
REWARD_TOKENS = ("+", "-")
PROMPT_FORMAT = "USER: {input} ASSISTANT:"


CORRUPTIONS = ("swap", "replace", "flaw", "foreign")


def corrupt(answer, rng, kinds=("swap", "replace", "flaw")):
    """`answer` with one same-length corruption of a kind drawn from `kinds`: `swap` two different
    characters, `replace` a character by another symbol, `flaw` the first two characters swapped,
    `foreign` a character replaced by a symbol the string does not hold."""
    kind = rng.choice(list(kinds))
    chars = list(answer)
    if kind == "foreign":
        i = rng.randrange(len(chars))
        chars[i] = rng.choice([c for c in ALPHABET if c not in answer])
        return "".join(chars)
    if kind == "flaw" and chars[0] != chars[1]:
        return chars[1] + chars[0] + answer[2:]
    if kind == "swap":
        pairs = [(i, j) for i in range(len(chars)) for j in range(i + 1, len(chars)) if chars[i] != chars[j]]
        if pairs:
            i, j = rng.choice(pairs)
            chars[i], chars[j] = chars[j], chars[i]
            return "".join(chars)
    i = rng.randrange(len(chars))
    chars[i] = rng.choice([c for c in ALPHABET if c != chars[i]])
    return "".join(chars)


def steps_of(answer):
    return [answer[i:i + STEP_CHARS] for i in range(0, len(answer), STEP_CHARS)]


def stepped(answer, end_step=False):
    """`answer` written in steps, each followed by the placeholder: `q9x3k` -> `q9|x3|k|`; with
    `end_step` an empty last step says where the answer stops: `q9|x3|k||`."""
    return "".join(step + PLACEHOLDER for step in steps_of(answer)) + (PLACEHOLDER if end_step else "")


def change_length(answer, rng):
    """`answer` stopped early (3 in 4: its first 0 to len-1 characters) or run on (1 or 2 more symbols)."""
    if rng.random() < 0.75:
        return answer[:rng.randrange(len(answer))]
    return answer + "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 2)))


def step_marks(answer, right, end_step):
    """One mark per step of `answer` (good: exactly the correct answer's characters at its place;
    a step past the correct answer's end is bad), and with `end_step` one for its empty last step
    (good when the answer stops where the correct one does)."""
    truth = steps_of(right)
    marks = [REWARD_TOKENS[0] if i < len(truth) and got == truth[i] else REWARD_TOKENS[1]
             for i, got in enumerate(steps_of(answer))]
    if end_step:
        marks.append(REWARD_TOKENS[0] if len(answer) == len(right) else REWARD_TOKENS[1])
    return marks


def task_record(s):
    """The reversal of `s` as a policy writes it in steps (the `Jsonfile` SFT / prompt format)."""
    return {"src": [reverse_prompt(s)], "tgt": [stepped(correct_answer(s))]}


def prm_record(s, rng, correct_frac, corruptions=("swap", "replace", "flaw"), length_frac=0.0, end_step=False):
    """One Math-Shepherd record for string `s`: an answer (correct with probability `correct_frac`,
    else with 1-3 corruptions; then with probability `length_frac` stopped early or run on) in
    steps, each labelled by whether it matches the correct answer (`step_marks`)."""
    right = correct_answer(s)
    answer = right
    if rng.random() >= correct_frac:
        for _ in range(rng.randint(1, 3)):
            answer = corrupt(answer, rng, corruptions)
    if length_frac > 0 and rng.random() < length_frac:
        answer = change_length(answer, rng)
    steps = steps_of(answer) + ([""] if end_step else [])
    prompt = PROMPT_FORMAT.format(input=reverse_prompt(s))
    return {
        "input": prompt + stepped(answer, end_step),
        "label": prompt + "".join(step + mark for step, mark in zip(steps, step_marks(answer, right, end_step))),
    }


def generate(output_dir, seed=4321, num_train=40000, num_eval=400, correct_frac=0.25, corruptions=("swap", "replace", "flaw"),
             length_frac=0.25, end_step=True):
    """Write the PRM splits and the stepped task files (module docstring) into `output_dir`; returns their
    record counts.
    `corruptions`: the kinds `corrupt` draws from; `length_frac`, `end_step`: see `prm_record`."""
    unknown = [k for k in corruptions if k not in CORRUPTIONS]
    if unknown or not corruptions:
        raise ValueError(f"corruptions must name some of {CORRUPTIONS}, got {list(corruptions)}")
    rng = random.Random(seed)
    os.makedirs(output_dir, exist_ok=True)
    held_out = sample_unique_strings(rng, num_eval)
    train = sample_unique_strings(rng, num_train, exclude=set(held_out))
    splits = {
        "prm_train.jsonl": [prm_record(s, rng, correct_frac, corruptions, length_frac, end_step) for s in train],
        "prm_eval.jsonl": [prm_record(s, rng, correct_frac, corruptions, length_frac, end_step) for s in held_out],
        "prm_sft.jsonl": [task_record(s) for s in train],
        "prm_test.jsonl": [task_record(s) for s in held_out],
    }
    meta = {"seed": seed, "correct_frac": correct_frac, "corruptions": list(corruptions), "step_chars": STEP_CHARS, "placeholder_token": PLACEHOLDER,
            "length_frac": length_frac, "end_step": end_step,
            "reward_tokens": ",".join(REWARD_TOKENS), "flawed_example": flawed_answer("abcde")}
    return write_splits(output_dir, splits, "prm_meta.json", meta)


def main(argv=None):
    from ..common.argument_help import doc_summary

    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=4321)
    parser.add_argument("--num_train", type=int, default=40000)
    parser.add_argument("--num_eval", type=int, default=400)
    parser.add_argument("--correct_frac", type=float, default=0.25)
    parser.add_argument("--corruptions", default="swap,replace,flaw", help=f"comma-separated kinds of {CORRUPTIONS}")
    parser.add_argument("--length_frac", type=float, default=0.25, help="share of answers stopped early or run on")
    parser.add_argument("--no_end_step", action="store_true", help="no empty last step (the layout before prm_end_step)")
    args = parser.parse_args(argv)
    kw = dict(vars(args), corruptions=tuple(k.strip() for k in args.corruptions.split(",") if k.strip()),
              end_step=not args.no_end_step)
    del kw["no_end_step"]
    print(json.dumps({"output_dir": args.output_dir, "counts": generate(**kw)}))


if __name__ == "__main__":
    main()
