"""The second agent demo's task (ppo/tiny/kv_task.py): the data splits and their mix of calls, the
per-record `lookup` tool, and the environment's reward (the run's only reward) on hand-written
trajectories."""
import json

import pytest

from ppo.agents.environment import environment_problems
from ppo.tiny.kv_task import KV_ENV, KVEnvironment, build_kv_data, demonstration, final_answer, record_answer

RECORD = {"src": "add c and k", "tgt": "1209", "store": {"c": 347, "k": 862, "q": 511, "x": 104}, "keys": ["c", "k"]}


def call(tool, arg):
    return f"<tool_call>{tool} {arg}</tool_call>"


def play(env, record, turns):
    """`(observations, rewards, done flags)` of `turns` played in `env` from `record`."""
    env.reset(record)
    out = [env.step(turn) for turn in turns]
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]


def test_the_environment_rewards_only_the_records_sum():
    env = KVEnvironment()
    chain = [call("lookup", "c"), call("lookup", "k"), call("calculator", "347+862"), "1209</s>"]
    obs, rewards, done = play(env, RECORD, chain)
    assert obs == ["347", "862", "1209", None] and rewards == [0.0, 0.0, 0.0, 1.0] and done == [False] * 3 + [True]
    # a wrong sum, a sum of other keys, nothing after the tool's answer: 0
    assert play(env, RECORD, [call("lookup", "c"), call("lookup", "k"), "1208"])[1] == [0.0, 0.0, 0.0]
    assert play(env, RECORD, [call("calculator", "347+511"), "858"])[1] == [0.0, 0.0]
    assert play(env, RECORD, ["</s>"])[1] == [0.0]
    assert play(env, RECORD, [" 1209 "])[1] == [1.0]  # the environment rates the answer, not the way to it
    env.close()


def test_the_lookup_tool_reads_each_records_own_store():
    first, second = KVEnvironment(), KVEnvironment()
    other = {**RECORD, "store": {"c": 100, "k": 200}, "tgt": "300"}
    assert play(first, RECORD, [call("lookup", "c")])[0] == ["347"]
    assert play(second, other, [call("lookup", "c")])[0] == ["100"]
    assert first.step(call("lookup", "k"))[0] == "862"  # its own store still, after the other's reset
    obs, rewards, done = play(second, other, [call("lookup", "q"), "300"])
    assert obs[0].startswith("Error: lookup raised KeyError") and "'q'" in obs[0] and rewards == [0.0, 1.0]
    assert first.states.instances["lookup"].calls == 2
    first.close()
    assert first.states.instances == {}  # released
    with pytest.raises(ValueError, match="the record has no store"):
        KVEnvironment().reset({"src": "add c and k", "keys": ["c", "k"]})
    with pytest.raises(ValueError, match="keys must be two keys of its store"):
        record_answer({**RECORD, "keys": ["c", "z"]})


def test_tools_off_leave_only_a_guess():
    env = KVEnvironment(tools=[])
    obs, rewards, _ = play(env, RECORD, [call("lookup", "c"), "1209"])
    assert obs[0].startswith("Error: there is no tool 'lookup'") and rewards == [0.0, 1.0]
    assert env.tools == []
    assert environment_problems(KV_ENV, {"tools": []}) == [] and environment_problems(KV_ENV, {}) == []
    assert "do not fit" in environment_problems(KV_ENV, {"store": {}})[0]


def test_final_answer():
    assert final_answer("<tool_response>12</tool_response>12</s>") == "12"
    assert final_answer(" 12 ") == "12" and final_answer("<tool_response>12</tool_response>") == ""


def test_the_data_splits_and_their_mix_of_calls(tmp_path):
    paths = build_kv_data(str(tmp_path), seed=3, n_sft=800, n_prompts=100, n_test=50)
    rows = {name: [json.loads(line) for line in open(path)] for name, path in paths.items()}
    assert [len(rows[n]) for n in ("sft", "prompts", "test")] == [800, 100, 50]
    ident = {n: {json.dumps([r["store"], r["keys"]], sort_keys=True) for r in rows[n]} for n in ("prompts", "test")}
    assert len(ident["test"]) == 50 and not ident["test"] & ident["prompts"]
    for r in rows["test"] + rows["prompts"]:
        store, (a, b) = r["store"], r["keys"]
        assert len(store) == 4 and a != b and a in store and b in store
        assert all(100 <= v <= 999 for v in store.values())
        assert r["tgt"] == [str(store[a] + store[b])] == [str(record_answer(r))]
        assert r["src"] == [f"add {a} and {b}"] and str(store[a]) not in r["src"][0]
    kinds = {"tools": 0, "lookups": 0, "direct": 0}
    for r in rows["sft"]:
        text = r["tgt"][0]
        kind = "tools" if "calculator" in text else "lookups" if text.startswith("<tool_call>lookup") else "direct"
        kinds[kind] += 1
        if kind == "direct":
            assert text.isdigit() and 200 <= int(text) <= 1998
        else:
            assert text.count("<tool_call>lookup ") == 2 and text.count("<tool_response>") == (3 if kind == "tools" else 2)
    assert 0.45 < kinds["tools"] / 800 < 0.55 and 0.2 < kinds["lookups"] / 800 < 0.3 and 0.2 < kinds["direct"] / 800 < 0.3
    assert demonstration(RECORD, "tools") == (
        "<tool_call>lookup c</tool_call><tool_response>347</tool_response><tool_call>lookup k</tool_call>"
        "<tool_response>862</tool_response><tool_call>calculator 347+862</tool_call><tool_response>1209</tool_response>1209")
    with pytest.raises(ValueError, match="shares summing to at most 1"):
        build_kv_data(str(tmp_path), tool_frac=0.8, lookup_frac=0.3)
