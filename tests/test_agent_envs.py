"""The environment registry (ppo/agents/environment.py), the agent arguments and their start-up
check (ppo/agents/arguments.py through ppo/common/startup_checks.py), and faults inside a
rollout: a malformed call, an unknown tool, a tool that raises, times out or prints megabytes,
an environment that raises or hangs -- each row gets an error observation (or ends) and the
others go on, and the counts come back."""
import json

import pytest

from ppo import kernels
from ppo.agents import (
    AgentArguments,
    AgentSettings,
    Environment,
    EnvironmentFacts,
    TaggedFormat,
    agent_problems,
    environment_facts,
    get_environment,
    list_environments,
    make_environment,
    register_environment,
    rollout_trajectories,
)
from ppo.agents.tool_env import ToolEnvironment
from ppo.common.argument_parsing import parse_collecting
from ppo.common.argument_problems import ArgumentError
from ppo.common.startup_checks import StartupPass
from ppo.rollout import RolloutEngine, SamplingParams
from tests import agent_helpers
from tests.agent_helpers import EOS, PAD, EchoEnv, HangingEnv, RaisingEnv, ScriptedToolEnv, tiny_llama


def test_registry_by_name_and_by_module_path():
    assert "tools" in list_environments() and get_environment("tools") is ToolEnvironment
    assert environment_facts("tools").observation_role == "tool"

    @register_environment("echo_test", facts=EnvironmentFacts(summary="echo", observation_role="user"))
    class Echo(EchoEnv):
        pass

    assert get_environment("echo_test") is Echo and environment_facts("echo_test").observation_role == "user"
    register_environment("echo_test", Echo)  # the same class again: fine
    with pytest.raises(ValueError, match="already registered"):
        register_environment("echo_test", EchoEnv)
    assert get_environment("tests.agent_helpers:EchoEnv") is agent_helpers.EchoEnv
    assert isinstance(make_environment("tests.agent_helpers:NeedsArgEnv", {"level": 2}), agent_helpers.NeedsArgEnv)


@pytest.mark.parametrize("name, kwargs, message", [
    ("nope", {}, "unknown environment 'nope'; valid names: .*tools"),
    ("tests.agent_helpers:Missing", {}, "has no attribute 'Missing'"),
    ("tests.no_such_module:Env", {}, "cannot import module 'tests.no_such_module'"),
    ("tests.agent_helpers:NoStepEnv", {}, r"lacks step\(\)"),
    ("tests.agent_helpers:plain_function", {}, "must be a class"),
    ("tests.agent_helpers:NeedsArgEnv", {}, "do not fit .*missing a required argument: 'level'"),
    ("tools", {"tools": ["calculator"], "colour": "red"}, "env_kwargs has no option 'colour'; its options: tools, "),
    ("tools", {"max_calls_per_turn": 0}, r"env_kwargs: max_calls_per_turn=0 \(must be >= 1\)"),
    ("tools", {"tools": ["no_such_tool"]}, "could not be built .*unknown tool 'no_such_tool'"),
])
def test_environment_problems_are_named(name, kwargs, message):
    args = AgentArguments(env_name=name, env_kwargs=json.dumps(kwargs))
    problems = agent_problems(args)
    assert len(problems) == 1 and problems[0].startswith(f"env_name {name}:"), problems
    import re

    assert re.search(message, problems[0]), problems[0]
    with pytest.raises(ValueError):
        make_environment(name, kwargs) if "could not be built" not in message else ToolEnvironment(**kwargs)


def test_base_class_methods_do_not_count_as_implemented():
    class Half(Environment):
        def reset(self, record):
            return ""

    with pytest.raises(TypeError, match=r"lacks step\(\)"):
        register_environment("half_test", Half)


def test_arguments_from_a_file_and_the_start_up_pass_refuses_before_any_model_loads(tmp_path):
    """The argument file's keys parse into AgentArguments; every problem (values and the
    environment) is listed at once by the start-up pass, and the model loader never runs."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"env_name": "tools", "env_kwargs": {"tools": ["calculator"]}, "max_turns": 3,
                                "max_tool_response_len": 64, "max_total_len": 256, "turn_reward_mode": "per_turn",
                                "step_timeout_s": 12.5}))
    (args,), problems = parse_collecting((AgentArguments,), [str(good)])
    assert not problems and args.env_options == {"tools": ["calculator"]} and args.turn_reward_mode == "per_turn"
    assert args.step_timeout_s == 12.5
    assert agent_problems(args) == []

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"env_name": "tests.agent_helpers:NoStepEnv", "max_turns": 0, "turn_reward_mode": "often",
                               "step_timeout_s": 0}))
    loaded = []
    startup = StartupPass()
    (args,) = startup.parse((AgentArguments,), [str(bad)], lambda a: agent_problems(a))
    if not startup.failed:
        loaded.append("model")
    with pytest.raises(ArgumentError) as err:
        startup.finish()
    text = str(err.value)
    assert "max_turns must be >= 1" in text and "turn_reward_mode must be one of" in text and "lacks step()" in text
    assert "step_timeout_s must be > 0, got 0" in text
    assert loaded == []
    with pytest.raises(ArgumentError, match="env_kwargs must be a JSON object"):
        AgentArguments(env_kwargs="[1, 2]")


# ---------------------------------------------------------------- faults inside a rollout
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    kernels.ensure_built()  # the rollouts below run the compiled ops: build them on a fresh clone
    return tiny_llama(tmp_path_factory.mktemp("llama"), tool_tags=True)


def _rollout(llama, records, env_factory, **args):
    tok, model = llama
    engine = RolloutEngine(model, eos_token_id=EOS, pad_token_id=PAD, kernels="custom")
    agent_args = AgentSettings(**{"max_turns": 3, "max_total_len": 128, "max_tool_response_len": 60, **args})
    params = SamplingParams(max_new_tokens=4, min_new_tokens=4)
    return rollout_trajectories(engine, records, agent_args, TaggedFormat(tok, "USER: {input} ASSISTANT:"), params,
                                seed=0, env_factory=env_factory)


def test_every_tool_fault_gives_an_error_observation_and_the_rows_go_on(llama):
    calls = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"</tool_call>',  # malformed JSON
        "<tool_call>weather Paris</tool_call>",  # unknown tool
        "<tool_call>test_boom x</tool_call>",  # raises
        "<tool_call>test_slow x</tool_call>",  # times out (0.3 s)
        "<tool_call>test_loud x</tool_call>",  # megabytes
        "<tool_call>calculator 6*7</tool_call>",  # fine
    ]
    records = [{"src": "What is 6*7?", "actions": [c]} for c in calls]
    tools = ["calculator", "test_boom", "test_slow", "test_loud"]
    result = _rollout(llama, records, lambda: ScriptedToolEnv(tools=tools, max_output_chars=100_000))
    answers = [[s.text for s in t.segments if s.kind == "tool"] for t in result.trajectories]
    assert all(len(a) == 1 for a in answers)
    assert [a[0].startswith("Error:") for a in answers] == [True, True, True, True, False, False]
    assert "not valid JSON" in answers[0][0] and "no tool 'weather'" in answers[1][0]
    assert "the tool broke" in answers[2][0] and "timed out" in answers[3][0]
    assert answers[4][0] == "y" * 46 + "...(truncated)" and answers[5][0] == "42"  # cut to 60 tokens, notice included
    for t in result.trajectories:
        assert t.stop_reason == "done" and t.num_turns == 2  # each row went on to its final answer
    m = result.metrics
    assert m["agent/malformed_calls"] == 1 and m["agent/unknown_tool_calls"] == 1
    assert m["tool/test_boom/errors"] == 1 and m["tool/test_slow/timeouts"] == 1 and m["tool/test_slow/errors"] == 1
    assert m["tool/test_loud/errors"] == 1 and m["tool/calculator/errors"] == 0 and m["tool/calculator/calls"] == 1
    assert 250 <= m["tool/test_slow/latency_ms"] < 3000 and m["agent/tool_calls_mean"] == 1.0


def test_an_environment_that_raises_or_hangs_ends_only_its_row(llama):
    """`step_timeout_s` is the argument's (0.5 s here): the hanging row ends within it."""
    records = [{"src": f"q{i}", "i": i} for i in range(3)]
    envs = iter([RaisingEnv(), HangingEnv(), EchoEnv(turns=2)])
    result = _rollout(llama, records, lambda: next(envs), step_timeout_s=0.5)
    reasons = [t.stop_reason for t in result.trajectories]
    assert reasons == ["env_error", "env_timeout", "done"]
    assert "environment bug" in result.trajectories[0].tool_calls[0]["detail"]
    assert result.trajectories[2].num_turns == 2 and result.metrics["agent/env_errors"] == 2
