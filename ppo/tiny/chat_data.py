"""Long multi-turn chat data for real-shape runs: a long conversation, a short final answer.

Every record is a conversation of reversal turns (`Reverse: k3x9q` -> `q9x3k`,
`ppo.tiny.demo_data`) interleaved with sentences of the built-in English passage,
grown turn by turn while its chat-template prompt stays within `prompt_tokens` tokens
of the given tokenizer (the next turn would pass it). The final user turn asks for one reversal; its answer is
the short trained part. Files written into `output_dir`:

- `sft.jsonl`, `prompts.jsonl`: Jsonfile multi-turn records
  `{"src": [u0, ..., un], "tgt": [a0, ..., an]}` (`tgt[-1]` answers the last turn);
- `preference.jsonl`: `json` records `{"dialogue": [u0, a0, ..., un], "input": [u0, ..., un],
  "answer": correct, "other_answer": correct[:-1], "better": true}`.
"""
import json
import os
import random

from ..data.encode import encode_exact
from . import demo_data
from .bpe_tokenizers import ENGLISH_TEXT


def _prompt_length(tokenizer, users, assistants, final_turn):
    """Tokens of the chat-template prompt, encoded as the datasets encode it (`encode_exact`)."""
    conversation = [[u, a] for u, a in zip(users, assistants)] + [[final_turn]]
    text = tokenizer.apply_chat_template(conversation, tokenize=False)
    return len(encode_exact(tokenizer, text))


def long_conversation(tokenizer, prompt_tokens, rng):
    """`(users, assistants, final_string)`: the longest run of history turns whose chat-template
    prompt (with the final reversal turn) stays within `prompt_tokens` tokens."""
    sentences = [s.strip() + "." for s in ENGLISH_TEXT.replace("\n", " ").split(".") if s.strip()]
    final = demo_data.sample_string(rng)
    final_turn = demo_data.reverse_prompt(final)
    users, assistants = [], []
    while True:
        s = demo_data.sample_string(rng)
        user = rng.choice(sentences) + " " + demo_data.reverse_prompt(s)
        if _prompt_length(tokenizer, users + [user], assistants + [demo_data.correct_answer(s)], final_turn) > prompt_tokens:
            return users, assistants, final
        users.append(user)
        assistants.append(demo_data.correct_answer(s))


def write_long_chat_data(output_dir, tokenizer, prompt_tokens=1000, num_records=4, seed=0):
    """Write the three files (see module docstring); returns their paths by name."""
    rng = random.Random(seed)
    os.makedirs(output_dir, exist_ok=True)
    sft, preference = [], []
    for _ in range(num_records):
        users, assistants, final = long_conversation(tokenizer, prompt_tokens, rng)
        src = users + [demo_data.reverse_prompt(final)]
        answer = demo_data.correct_answer(final)
        sft.append({"src": src, "tgt": assistants + [answer]})
        dialogue = [t for pair in zip(users, assistants) for t in pair] + [src[-1]]
        truncated = answer[:-1]
        preference.append({"dialogue": dialogue, "input": src, "answer": answer, "other_answer": truncated, "better": True})
    paths = {}
    for name, records in (("sft", sft), ("prompts", sft), ("preference", preference)):
        paths[name] = os.path.join(output_dir, f"{name}.jsonl")
        demo_data.write_jsonl(paths[name], records)
    return paths
