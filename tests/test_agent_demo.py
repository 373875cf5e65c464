"""The agent demo's task (ppo/tiny/agent_task.py): the data splits, the demonstrations' mix of
tool calls and direct answers, and the rule scorer that rates only the policy's final answer."""
import json

from ppo.tiny.agent_task import build_agent_data, final_answer, final_answer_scorer, tool_answer


def test_the_scorer_rates_the_final_answer_only():
    call = tool_answer(347, 862)
    assert call == "<tool_call>calculator 347*862</tool_call><tool_response>299114</tool_response>299114"
    assert final_answer(call) == "299114" and final_answer(" 299114 ") == "299114"
    assert final_answer_scorer("347*862", "299114", call) == 1.0
    assert final_answer_scorer("347*862", "299114", " 299114") == 1.0  # right without the tool
    # the tool's answer is not the policy's: copying nothing out, or something else, earns 0
    assert final_answer_scorer("347*862", "299114", call[: -len("299114")]) == 0.0
    assert final_answer_scorer("347*862", "299114", call + "0") == 0.0


def test_the_data_splits(tmp_path):
    paths = build_agent_data(str(tmp_path), seed=3, n_sft=400, n_prompts=100, n_test=50, tool_frac=0.5)
    rows = {name: [json.loads(line) for line in open(path)] for name, path in paths.items()}
    assert [len(rows[n]) for n in ("sft", "prompts", "test")] == [400, 100, 50]
    problems = {n: {r["src"][0] for r in rows[n]} for n in rows}
    assert not problems["test"] & (problems["sft"] | problems["prompts"]) and not problems["sft"] & problems["prompts"]
    for r in rows["test"] + rows["prompts"]:
        a, b = map(int, r["src"][0].split("*"))
        assert r["tgt"] == [str(a * b)] and len(r["tgt"][0]) == 6
    calls = [r for r in rows["sft"] if r["tgt"][0].startswith("<tool_call>")]
    assert 0.4 < len(calls) / 400 < 0.6
    assert all(r["tgt"][0] == tool_answer(*map(int, r["src"][0].split("*"))) for r in calls)
    direct = [r for r in rows["sft"] if not r["tgt"][0].startswith("<tool_call>")]
    assert all(r["tgt"][0] == str(eval(r["src"][0])) for r in direct)  # noqa: S307 - our own "a*b" strings
