"""The demo task's preference data beyond pairs, for the listwise / unpaired / rejected-only
losses (written by `ppo.tiny.demo_data.generate` next to `preference.jsonl`):

- `ranked.jsonl`, `ranked_eval.jsonl`: PaddleNLP's DPO format with three responses per
  prompt (`paddlenlp-ranked`): the correct answer (rank 2), the demonstrator's flaw or an
  adjacent swap (rank 1) and a degenerate answer (rank 0), in random order;
- `unpaired.jsonl`, `unpaired_eval.jsonl`: TRL's KTO format (`trl-unpaired`), one answer per
  prompt, alternately the correct one (`label: true`) and a wrong one (`label: false`).

A generator of its own (seeded from the demo seed) leaves the other splits unchanged.
"""
import random

from .reverse_task import correct_answer, degenerate_answer, rejected_answer, reverse_prompt

__all__ = ["ranked_record", "unpaired_record", "feedback_splits"]


def ranked_record(s, rng):
    """One `paddlenlp-ranked` record for string `s` with three distinct responses."""
    correct = correct_answer(s)
    middle = rejected_answer(s, rng, 0.0, 0.0)
    worst = degenerate_answer(correct, rng)
    while worst in (correct, middle) or not worst.strip():
        worst = correct[0] * rng.randint(len(correct) + 1, 2 * len(correct) + 2)
    responses = [(correct, 2), (middle, 1), (worst, 0)]
    rng.shuffle(responses)
    return {"src": [reverse_prompt(s)], "tgt": [], "response": [r for r, _ in responses], "sort": [k for _, k in responses]}


def unpaired_record(s, rng, desirable):
    """One `trl-unpaired` record: the correct answer, or a wrong one (flaw or swap)."""
    completion = correct_answer(s) if desirable else rejected_answer(s, rng, 0.0, 0.0)
    return {"prompt": reverse_prompt(s), "completion": completion, "label": desirable}


def feedback_splits(train_strings, eval_strings, seed):
    """`{file name: records}` of the four splits above."""
    rng = random.Random(seed + 27)
    return {
        "ranked.jsonl": [ranked_record(s, rng) for s in train_strings],
        "ranked_eval.jsonl": [ranked_record(s, rng) for s in eval_strings],
        "unpaired.jsonl": [unpaired_record(s, rng, i % 2 == 0) for i, s in enumerate(train_strings)],
        "unpaired_eval.jsonl": [unpaired_record(s, rng, i % 2 == 0) for i, s in enumerate(eval_strings)],
    }
