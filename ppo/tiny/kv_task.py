"""The second agent demo's task: add the values of two keys of a small key-value store that only
a tool can read, with the calculator for the sum.

Every record has its own store (four lowercase keys, values 100-999), never shown in the prompt:

    {"src": ["add c and k"], "tgt": ["1209"], "store": {"c": 347, "k": 862, "q": 511, "x": 104}, "keys": ["c", "k"]}

Prompt `USER: add c and k ASSISTANT:`; the tool-using answer is two lookups, a sum and the
result copied out (tool answers fed by the environment, never generated):

    <tool_call>lookup c</tool_call><tool_response>347</tool_response>
    <tool_call>lookup k</tool_call><tool_response>862</tool_response>
    <tool_call>calculator 347+862</tool_call><tool_response>1209</tool_response>1209

(one line in the data). Two tools: `KVStore` (`lookup`), a `StatefulTool` created per
trajectory from the record's `store` (ppo/agents/tool_state.py), and the built-in `calculator`.
`KVEnvironment` (`ppo.tiny.kv_task:KVEnvironment`) is the `tools` environment with these two
whose final answer earns reward 1.0 when it is the sum of the record's two values, else 0.0: the
environment's reward is the run's only reward (ppo/trainer/env_reward.py).

SFT demonstrations (`sft.jsonl`) are a mix of calls: `tool_frac` of them (default 0.5) as above,
`lookup_frac` (0.25) look both values up and then write the sum themselves, the rest write a sum
at once without any call. A 0.4M-parameter character model can neither know a store it never
sees nor reliably add two 3-digit numbers, so after SFT only the full chain succeeds; GRPO with
the environment's reward finds that it is the one that pays.

Files written into `output_dir` (Jsonfile records as above): `sft.jsonl` (`tgt` the whole
answer), `prompts.jsonl` (RL records) and `test.jsonl` (held-out records, their stores and key
pairs in no other split).

CLI: `python -m ppo.tiny.kv_task --output_dir data/kv_agent`
"""
import argparse
import json
import os
import random
import string

from ..agents.tool_env import ToolEnvironment
from ..agents.tool_state import StatefulTool
from .factory import TOOL_TAGS

CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE = TOOL_TAGS
KEYS = string.ascii_lowercase
STORE_SIZE, LOW, HIGH = 4, 100, 999
LOOKUP_TOOL = "ppo.tiny.kv_task:KVStore"
KV_ENV = "ppo.tiny.kv_task:KVEnvironment"


def record_store(record):
    """The record's store as {key: int}; ValueError naming the field when it has none."""
    store = record.get("store") if isinstance(record, dict) else None
    if not isinstance(store, dict) or not store:
        raise ValueError(f"the record has no store (a JSON object of key -> integer), got {store!r}")
    return {str(k): int(v) for k, v in store.items()}


def record_answer(record):
    """The sum of the values of the record's `keys` in its `store` (an int)."""
    store, keys = record_store(record), record.get("keys")
    if not isinstance(keys, list) or len(keys) != 2 or any(k not in store for k in keys):
        raise ValueError(f"the record's keys must be two keys of its store {sorted(store)}, got {keys!r}")
    return store[keys[0]] + store[keys[1]]


class KVStore(StatefulTool):
    """The `lookup` tool: the value of a key in this trajectory's store (the record's `store`)."""

    name = "lookup"
    description = "the value of a key in this task's key-value store"
    parameters = {"type": "object", "properties": {"key": {"type": "string", "description": "a key, e.g. c"}},
                  "required": ["key"]}

    def create(self, record, **create_kwargs):
        self.store = record_store(record)
        self.calls = 0

    def call(self, key):
        self.calls += 1
        key = str(key).strip()
        if key not in self.store:
            raise KeyError(f"no key {key!r} in the store")
        return str(self.store[key])


def final_answer(text, eos_text="</s>"):
    """The policy's final answer in a turn's `text`: after the last `</tool_response>`, without a
    trailing `eos_text`, stripped."""
    text = text.rsplit(RESPONSE_CLOSE, 1)[-1].strip()
    if eos_text and text.endswith(eos_text):
        text = text[: -len(eos_text)]
    return text.strip()


class KVEnvironment(ToolEnvironment):
    """The `tools` environment with `lookup` and `calculator` (by default; `tools: []` switches
    both off) whose final answer earns 1.0 when it is the record's sum (`record_answer`), else
    0.0; `eos_text`: the end-of-sequence text a final turn may end with."""

    def __init__(self, tools=(LOOKUP_TOOL, "calculator"), eos_text="</s>", tool_options=None, max_output_chars=4096,
                 prompt_key=None, system_prompt=None, tool_isolation="thread"):
        super().__init__(tools, tool_options, max_output_chars, prompt_key, system_prompt, tool_isolation)
        self.eos_text, self.answer = eos_text, None

    def reset(self, record):
        self.answer = str(record_answer(record))
        return super().reset(record)

    def step(self, action_text):
        observation, reward, done, info = super().step(action_text)
        if done:
            reward += 1.0 if final_answer(action_text, self.eos_text) == self.answer else 0.0
        return observation, reward, done, info


def call_text(tool, argument, answer):
    return f"{CALL_OPEN}{tool} {argument}{CALL_CLOSE}{RESPONSE_OPEN}{answer}{RESPONSE_CLOSE}"


def demonstration(record, kind):
    """The response text of `record` for `kind`: "tools" (lookups and calculator), "lookups"
    (lookups, then the sum written directly) or "direct" (the sum at once, no call)."""
    store, (a, b) = record["store"], record["keys"]
    total = store[a] + store[b]
    lookups = call_text("lookup", a, store[a]) + call_text("lookup", b, store[b])
    if kind == "tools":
        return lookups + call_text("calculator", f"{store[a]}+{store[b]}", total) + str(total)
    if kind == "lookups":
        return lookups + str(total)
    if kind == "direct":
        return str(total)
    raise ValueError(f"unknown demonstration kind {kind!r}")


def sample_records(rng, n, exclude=()):
    """`n` records with distinct (store, keys), none in `exclude` (a set of their `identity`)."""
    seen, records = set(exclude), []
    while len(records) < n:
        keys = rng.sample(KEYS, STORE_SIZE)
        store = {k: rng.randint(LOW, HIGH) for k in keys}
        a, b = rng.sample(keys, 2)
        record = {"src": [f"add {a} and {b}"], "tgt": [str(store[a] + store[b])], "store": store, "keys": [a, b]}
        if identity(record) not in seen:
            seen.add(identity(record))
            records.append(record)
    return records


def identity(record):
    return json.dumps([record["store"], record["keys"]], sort_keys=True)


def write_jsonl(path, records):
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def build_kv_data(output_dir, seed=0, n_sft=3000, n_prompts=512, n_test=200, tool_frac=0.5, lookup_frac=0.25):
    """Write the three files (module docstring) and return their paths by name."""
    if not (0 <= tool_frac and 0 <= lookup_frac and tool_frac + lookup_frac <= 1):
        raise ValueError(f"tool_frac {tool_frac} and lookup_frac {lookup_frac} must be shares summing to at most 1")
    rng = random.Random(seed)
    os.makedirs(output_dir, exist_ok=True)
    test = sample_records(rng, n_test)
    train = sample_records(rng, n_sft + n_prompts, exclude={identity(r) for r in test})
    sft = []
    for record in train[:n_sft]:
        u = rng.random()
        kind = "tools" if u < tool_frac else "lookups" if u < tool_frac + lookup_frac else "direct"
        sft.append({"src": record["src"], "tgt": [demonstration(record, kind)]})
    paths = {name: os.path.join(output_dir, f"{name}.jsonl") for name in ("sft", "prompts", "test")}
    for name, records in (("sft", sft), ("prompts", train[n_sft:]), ("test", test)):
        write_jsonl(paths[name], records)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool_frac", type=float, default=0.5)
    parser.add_argument("--lookup_frac", type=float, default=0.25)
    args = parser.parse_args(argv)
    for name, path in build_kv_data(args.output_dir, args.seed, tool_frac=args.tool_frac,
                                    lookup_frac=args.lookup_frac).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
