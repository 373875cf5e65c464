"""The agents' tools (ppo/agents/tools.py, builtin_tools.py), reading calls out of the policy's
text (tool_calls.py), and the sandbox the python tool runs in (ppo/sandbox/): its limits,
its clean environment, and writes outside its directory refused."""
import json
import os
import time

import pytest

from ppo.agents import ToolEnvironment, call_tool, get_tool, list_tools, register_tool
from ppo.agents.builtin_tools import NotArithmetic, bm25_search, calculate
from ppo.agents.tool_calls import parse_tool_call
from ppo.sandbox import SandboxLimits, run_python
from tests import agent_helpers  # noqa: F401 (registers the test tools)


@pytest.mark.parametrize("expression, value", [
    ("12*34", 408), ("2**10", 1024), ("(1+2)*-3", -9), ("7/2", 3.5), ("17//5", 3), ("17 % 5", 2), ("1.5e3 + 1", 1501.0),
    ("123456789*987654321", 121932631112635269),
])
def test_calculator_computes_arithmetic(expression, value):
    assert calculate(expression) == value
    assert call_tool(get_tool("calculator"), {"expression": expression}).text == str(value)


@pytest.mark.parametrize("expression", [
    "__import__('os').system('echo hi')", "abs(-1)", "x + 1", "(1).real", "[1, 2]", "1 if 1 else 2", "1 < 2",
    "lambda: 1", "'a' * 3", "9**9**9", "10**400 * 10**400", "1" * 201, "2 +", "",
])
def test_calculator_refuses_everything_but_arithmetic(expression):
    with pytest.raises(NotArithmetic):
        calculate(expression)
    result = call_tool(get_tool("calculator"), {"expression": expression})
    assert result.error == "raised" and result.text.startswith("Error: calculator raised NotArithmetic")


def test_calculator_never_evaluates(monkeypatch):
    import builtins

    monkeypatch.setattr(builtins, "eval", lambda *a, **k: pytest.fail("eval was called"))
    assert calculate("6*7") == 42


def test_call_tool_reports_every_fault_as_text():
    boom = call_tool(get_tool("test_boom"), {"x": "1"})
    assert boom.error == "raised" and "RuntimeError: the tool broke" in boom.text
    start = time.monotonic()
    slow = call_tool(get_tool("test_slow"), {"x": "1"})
    assert slow.error == "timeout" and time.monotonic() - start < 3 and "timed out after 0.3 s" in slow.text
    loud = call_tool(get_tool("test_loud"), {"x": "1"}, max_chars=100)
    assert loud.error == "too_long" and loud.text == "y" * 86 + "...(truncated)"  # the notice inside the 100
    missing = call_tool(get_tool("test_boom"), {})
    assert missing.error == "bad_arguments" and "needs x" in missing.text
    extra = call_tool(get_tool("calculator"), {"expression": "1", "mode": "x"})
    assert extra.error == "bad_arguments" and "no argument mode" in extra.text
    typed = call_tool(get_tool("calculator"), {"expression": 12})
    assert typed.error == "bad_arguments" and "must be a string" in typed.text


def test_a_user_tool_is_one_decorated_function():
    @register_tool("shout_test", description="Shout a word.")
    def shout(word):
        return word.upper() + "!"

    spec = get_tool("shout_test")
    assert "shout_test" in list_tools() and spec.required == ["word"]
    assert spec.function_schema()["function"]["parameters"]["properties"] == {"word": {"type": "string"}}
    assert call_tool(spec, {"word": "hi"}).text == "HI!"
    with pytest.raises(ValueError, match="already registered"):
        register_tool("shout_test", lambda word: word)
    plain = get_tool("tests.agent_helpers:plain_function")  # module.path:function, schema from its signature
    assert plain.required == ["city"] and call_tool(plain, {"city": "Paris"}).text == "Paris: 21 C"
    with pytest.raises(ValueError, match="unknown tool"):
        get_tool("no_such_tool")


def test_tool_options_are_checked():
    with pytest.raises(ValueError, match="needs the option corpus"):
        get_tool("search").with_options({})
    with pytest.raises(ValueError, match="has no option"):
        get_tool("calculator").with_options({"precision": 3})


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    passages = ["Paris is the capital of France.", "The Nile is the longest river in Africa.",
                "Mount Everest is the highest mountain on Earth.", "France borders Spain and Italy.",
                "Cats sleep for most of the day."]
    path.write_text("\n".join(json.dumps({"text": p}) for p in passages))
    return str(path)


def test_search_ranks_passages_with_bm25(corpus):
    hits = bm25_search("capital of France", corpus, top_k=3)
    assert hits[0][1].startswith("Paris") and hits[0][0] > hits[1][0] > 0
    assert [p for _, p in hits] == ["Paris is the capital of France.", "France borders Spain and Italy."]
    spec = get_tool("search").with_options({"corpus": corpus, "top_k": 1})
    assert call_tool(spec, {"query": "highest mountain"}).text == "[1] Mount Everest is the highest mountain on Earth."
    assert call_tool(spec, {"query": "zebra"}).text == "No results."
    assert call_tool(spec, {"query": "the of"}).text == "No results."  # stopwords only


@pytest.mark.parametrize("text, name, arguments, problem", [
    ('I will compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>',
     "calculator", {"expression": "2*3"}, None),
    ('<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}\n</tool_call>',
     "calculator", {"expression": "1+1"}, None),
    ("<tool_call>calculator 12*34</tool_call>", "calculator", {"expression": "12*34"}, None),
    ("The answer is 408.", None, None, None),
    ("<tool_call>{'name': 'calculator'}</tool_call>", None, None, "malformed"),
    ('<tool_call>{"arguments": {}}</tool_call>', None, None, "malformed"),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', None, None, "malformed"),
    ("<tool_call>calculator 1+1", None, None, "malformed"),
    ("<tool_call>   </tool_call>", None, None, "malformed"),
    ("calculator 1+1</tool_call>", None, None, "malformed"),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', None, None, "unknown_tool"),
    ("<tool_call>weather Paris</tool_call>", None, None, "unknown_tool"),
])
def test_parse_tool_call(text, name, arguments, problem):
    tools = {"calculator": get_tool("calculator")}
    call, found = parse_tool_call(text, tools)
    if problem:
        assert call is None and found.kind == problem and found.message.startswith("Error:")
    elif name:
        assert found is None and (call.name, call.arguments) == (name, arguments)
    else:
        assert call is None and found is None


def test_tool_environment_steps():
    env = ToolEnvironment(tools=["calculator", "test_boom"], system_prompt="Use tools.")
    assert env.reset({"src": ["earlier", "What is 6*7?"]})[-1] == {"role": "user", "content": "What is 6*7?"}
    assert [t["function"]["name"] for t in env.tools] == ["calculator", "test_boom"]
    obs, reward, done, info = env.step("<tool_call>calculator 6*7</tool_call>")
    assert (obs, reward, done) == ("42", 0.0, False) and info["tool_calls"][0]["name"] == "calculator"
    obs, _, done, info = env.step("<tool_call>test_boom x</tool_call>")
    assert obs.startswith("Error: test_boom raised") and not done and info["tool_calls"][0]["error"] == "raised"
    assert env.step("It is 42.")[2] is True
    with pytest.raises(ValueError, match="unknown tool"):
        ToolEnvironment(tools=["nope"])
    with pytest.raises(ValueError, match="not listed"):
        ToolEnvironment(tools=["calculator"], tool_options={"search": {"corpus": "x"}})


# ---------------------------------------------------------------- the python tool and its sandbox
PY = get_tool("python").with_options({"wall_s": 3.0, "cpu_s": 2})


def test_python_tool_runs_code_and_reports_failures():
    assert call_tool(PY, {"code": "print(sum(range(10)))"}).text == "45\n"
    failed = call_tool(PY, {"code": "print('a')\nraise ValueError('bad')"})
    assert failed.error is None and failed.text.startswith("a\n") and "ValueError: bad" in failed.text
    assert failed.text.endswith("(exit status 1)")


def test_python_tool_is_killed_with_its_children_at_the_wall_clock_limit():
    code = "import os, time\npid = os.fork()\nprint(pid, flush=True)\ntime.sleep(60)"
    result = call_tool(PY, {"code": code})
    assert result.error == "timeout" and "killed" in result.text


def test_sandbox_refuses_writes_outside_its_directory(tmp_path):
    target = tmp_path / "outside.txt"
    code = (f"import os\nopen('inside.txt', 'w').write('x')\nopen('/dev/null', 'w').write('x')\nprint('inside ok', flush=True)\n"
            f"for op in (lambda: open({str(target)!r}, 'w'), lambda: os.mkdir('/tmp/ppo_sandbox_escape'),\n"
            f"           lambda: os.remove({__file__!r}), lambda: open('/dev/shm/ppo_escape', 'w')):\n"
            "    try:\n        op()\n        print('escaped')\n    except OSError as err:\n        print('refused', err.errno)")
    result = run_python(code, limits=SandboxLimits(wall_s=5, cpu_s=2))
    if not result.fs_isolated:
        pytest.skip("no Landlock on this kernel: the sandbox says so (fs_isolated False)")
    assert result.stdout.splitlines() == ["inside ok"] + ["refused 13"] * 4, result.stdout
    assert not target.exists() and os.path.exists(__file__) and not os.path.exists("/tmp/ppo_sandbox_escape")


def test_sandbox_can_require_write_isolation():
    result = run_python("print('ok')", limits=SandboxLimits(require_fs_isolation=True, wall_s=5, cpu_s=2))
    assert result.fs_isolated and result.ok


def test_python_tool_limits_memory_output_and_environment(monkeypatch):
    monkeypatch.setenv("PPO_SECRET_FOR_TEST", "s3cret")
    big = call_tool(get_tool("python").with_options({"memory_mb": 256}), {"code": "x = bytearray(1 << 30)"})
    assert "MemoryError" in big.text
    loud = call_tool(get_tool("python").with_options({"output_bytes": 1000}), {"code": "print('z' * 10**6)"})
    assert loud.text.startswith("z" * 1000) and not loud.text.startswith("z" * 1001) and "File too large" in loud.text
    env = call_tool(PY, {"code": "import os; print(sorted(os.environ))"}).text
    assert "PPO_SECRET_FOR_TEST" not in env and "s3cret" not in env
    spin = call_tool(get_tool("python").with_options({"wall_s": 20.0, "cpu_s": 1}), {"code": "while True: pass"})
    assert spin.text.endswith("(CPU time limit)")
