"""The agent demo's task: exact multiplication of two 3-digit numbers (from 317 to 999, so that
every product has 6 digits), which the tiny model cannot do by itself but can with the calculator tool.

Prompt `USER: 347*862 ASSISTANT:`; a tool-using answer is the call, the tool's answer (fed by
the environment, never generated) and the product copied out:

    <tool_call>calculator 347*862</tool_call><tool_response>299114</tool_response>299114

SFT demonstrations (`sft.jsonl`) are a mix: a `tool_frac` share of them (default 0.5) call the
calculator as above, the others write the product at once -- which a 0.4M-parameter character
model cannot learn, so after SFT it calls the tool on about that share of prompts and fails on
the others. GRPO with the tool then finds that calling it is what gets the reward.

`final_answer_scorer` is the rule scorer: 1.0 when the text after the last `</tool_response>`
(the whole response when there is none) is the product, else 0.0; a tool answer that the policy
did not copy out earns nothing.

Files written into `output_dir` (Jsonfile records `{"src": [...], "tgt": [...]}`): `sft.jsonl`
(demonstrations: `tgt` the whole answer), `prompts.jsonl` (RL prompts, `tgt` the product) and
`test.jsonl` (held-out pairs in no other split, `tgt` the product).

CLI: `python -m ppo.tiny.agent_task --output_dir data/agent`
"""
import argparse
import json
import os
import random

from .factory import TOOL_TAGS

CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE = TOOL_TAGS  # the tags of ppo/agents/tool_calls.py

LOW, HIGH = 317, 999  # 3-digit factors whose product has 6 digits (317 * 317 = 100489): one answer length


def problem_text(a, b):
    return f"{a}*{b}"


def tool_answer(a, b):
    """The tool-using demonstration of `a*b` (the whole response text after the prompt)."""
    return f"{CALL_OPEN}calculator {a}*{b}{CALL_CLOSE}{RESPONSE_OPEN}{a * b}{RESPONSE_CLOSE}{a * b}"


def final_answer(response):
    """The policy's final answer: the text after the last `</tool_response>`, stripped."""
    return response.rsplit(RESPONSE_CLOSE, 1)[-1].strip()


def final_answer_scorer(src, tgt, response):
    """1.0 when the final answer (`final_answer`) is the product `tgt`, else 0.0."""
    return 1.0 if final_answer(response) == str(tgt).strip() else 0.0


def sample_pairs(rng, n, exclude=()):
    """`n` distinct `(a, b)` pairs of 3-digit numbers, none in `exclude`."""
    seen, pairs = set(exclude), []
    while len(pairs) < n:
        pair = (rng.randint(LOW, HIGH), rng.randint(LOW, HIGH))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return pairs


def write_jsonl(path, records):
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def build_agent_data(output_dir, seed=0, n_sft=2000, n_prompts=512, n_test=200, tool_frac=0.5):
    """Write the three files (see the module docstring) and return their paths by name."""
    rng = random.Random(seed)
    os.makedirs(output_dir, exist_ok=True)
    test = sample_pairs(rng, n_test)
    train = sample_pairs(rng, n_sft + n_prompts, exclude=test)
    sft = [{"src": [problem_text(a, b)], "tgt": [tool_answer(a, b) if rng.random() < tool_frac else str(a * b)]}
           for a, b in train[:n_sft]]
    prompts = [{"src": [problem_text(a, b)], "tgt": [str(a * b)]} for a, b in train[n_sft:]]
    tests = [{"src": [problem_text(a, b)], "tgt": [str(a * b)]} for a, b in test]
    paths = {name: os.path.join(output_dir, f"{name}.jsonl") for name in ("sft", "prompts", "test")}
    for name, records in (("sft", sft), ("prompts", prompts), ("test", tests)):
        write_jsonl(paths[name], records)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool_frac", type=float, default=0.5)
    args = parser.parse_args(argv)
    for name, path in build_agent_data(args.output_dir, args.seed, tool_frac=args.tool_frac).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
