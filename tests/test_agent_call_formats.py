"""The tool-call format registry (ppo/agents/call_formats.py): each format reads good calls (one
and several, in order) and turns malformed ones into a clear error the policy reads, counted
in the rollout's metrics; the format is chosen by the tools environment's `call_format`."""
import pytest

from ppo.agents import ToolEnvironment, environment_problems
from ppo.agents.call_formats import call_format_facts, get_call_format, list_call_formats
from ppo.agents.metrics import agent_metrics
from ppo.agents.tool_calls import CallProblem, ToolCall
from ppo.agents.tools import get_tool

TOOLS = {name: get_tool(name) for name in ("calculator", "search")}
ADD = {"expression": "1+2"}

GOOD = {
    "hermes": ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call> and '
               "<tool_call>search paris</tool_call>"),
    "qwen3": ('<think>add</think>\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
              '\n<tool_call>\n{"name": "search", "arguments": {"query": "paris"}}\n</tool_call>'),
    "qwen3_coder": ("<tool_call>\n<function=calculator>\n<parameter=expression>\n1+2\n</parameter>\n</function>\n"
                    "</tool_call><tool_call>\n<function=search>\n<parameter=query>\nparis\n</parameter>\n</function>\n"
                    "</tool_call>"),
    "llama3_json": ('<|python_tag|>{"name": "calculator", "parameters": {"expression": "1+2"}}; '
                    '{"name": "search", "parameters": {"query": "paris"}}<|eot_id|>'),
    "json_list": ('[{"name": "calculator", "arguments": {"expression": "1+2"}}, '
                  '{"name": "search", "arguments": {"query": "paris"}}]'),
}

MALFORMED = {
    "hermes": [("<tool_call>calculator", "the tool call has no </tool_call>"),
               ('<tool_call>{"name": "calculator", "arguments": }</tool_call>', "the tool call is not valid JSON"),
               ("<tool_call>  </tool_call>", "the tool call is empty"),
               ("done</tool_call>", "</tool_call> without <tool_call>")],
    "qwen3": [("<tool_call>calculator 1+2</tool_call>", "the tool call is not valid JSON"),
              ('<tool_call>{"arguments": {}}</tool_call>', 'a JSON tool call needs {"name": ..., "arguments": {...}}')],
    "qwen3_coder": [("<tool_call><function=calculator><parameter=expression>1</parameter></tool_call>",
                     "a tool call needs <function=NAME>...</function>"),
                    ("<tool_call><function=calculator>1+2</function></tool_call>",
                     "calculator: text outside <parameter=KEY>...</parameter>")],
    "llama3_json": [('{"name": "calculator", "parameters": {"expression": "1+2"}', "the tool call is not valid JSON"),
                    ('{"name": "calculator", "parameters": {}} thanks', "text after the tool call: 'thanks'"),
                    ('{"name": "calculator", "parameters": [1]}', "the arguments of the tool call must be a JSON object")],
    "json_list": [('[{"name": "calculator", "arguments": {}}', "the tool call is not valid JSON"),
                  ("[]", "the list of tool calls is empty"),
                  ('[{"name": "calculator", "arguments": {}}, 7]', "each tool call must be a JSON object")],
}


def test_the_registry_lists_the_formats_with_their_facts():
    assert list_call_formats() == ["hermes", "json_list", "llama3_json", "qwen3", "qwen3_coder"]
    assert call_format_facts("hermes").call_close == "</tool_call>" and call_format_facts("json_list").call_close == ""
    with pytest.raises(ValueError) as err:
        get_call_format("mistral")
    assert "unknown call_format 'mistral'; valid names: hermes, json_list, llama3_json, qwen3, qwen3_coder" in str(err.value)
    loaded = get_call_format("tests.test_agent_call_formats:semicolons")
    assert loaded("calculator 1+2; search x", TOOLS) == [ToolCall("calculator", {"q": "1+2"}), ToolCall("search", {"q": "x"})]


def semicolons(text, tools):
    """A user's own format: `name arg; name arg`."""
    if ";" not in text:
        return []
    return [ToolCall(name, {"q": arg}) for name, arg in (part.strip().split(" ", 1) for part in text.split(";"))]


@pytest.mark.parametrize("name", sorted(GOOD))
def test_each_format_reads_its_calls_in_order(name):
    items = get_call_format(name)(GOOD[name], TOOLS)
    assert items == [ToolCall("calculator", ADD), ToolCall("search", {"query": "paris"})]
    assert get_call_format(name)("The answer is 3.", TOOLS) == []


@pytest.mark.parametrize("name,text,message", [(n, t, m) for n, cases in MALFORMED.items() for t, m in cases])
def test_each_format_answers_a_malformed_call_with_a_clear_error(name, text, message):
    """The malformed part is the turn's last item (a call written before it still runs)."""
    *calls, problem = get_call_format(name)(text, TOOLS)
    assert all(isinstance(c, ToolCall) for c in calls) and isinstance(problem, CallProblem)
    assert problem.kind == "malformed" and problem.message.startswith("Error: ")
    assert message in problem.message


@pytest.mark.parametrize("name", sorted(GOOD))
def test_the_tools_environment_shows_and_counts_malformed_and_unknown_calls(name):
    """The chosen format's malformed call and a call of a tool that is not there: the policy
    reads "Error: ..." for each (the episode goes on) and the metrics count one of each."""
    env = ToolEnvironment(tools=["calculator"], call_format=name, max_calls_per_turn=4)
    env.reset({"src": "q"})
    bad_text = MALFORMED[name][0][0]
    unknown = GOOD[name].replace("search", "nosuch")
    entries = []
    for text in (bad_text, unknown):
        obs, _, done, info = env.step(text)
        answers = [obs] if isinstance(obs, str) else [m["content"] for m in obs]
        assert not done and any(a.startswith("Error: ") for a in answers)
        entries += info["tool_calls"]
    assert answers == ["3", "Error: there is no tool 'nosuch' (tools: calculator)"]
    trajectory = type("T", (), {"tool_calls": entries, "num_turns": 2, "truncated": False, "stop_reason": "done"})
    metrics = agent_metrics([trajectory])
    assert metrics["agent/malformed_calls"] == 1.0 and metrics["agent/unknown_tool_calls"] == 1.0
    assert metrics["tool/calculator/calls"] == 1.0


def test_an_unknown_call_format_stops_the_run_before_models_load():
    problems = environment_problems("tools", {"call_format": "mistral"})
    assert len(problems) == 1 and "unknown call_format 'mistral'; valid names: hermes" in problems[0]
