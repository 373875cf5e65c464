"""The pieces under the per-record environments and stateful tools, without a model: how a
record's env_name / env_kwargs combine with the run's, environments closed when a later one
fails to build, a stateful tool's life in the tools environment (create at reset, reward
read once, release once even when another tool's release raises) and its refusal of worker
processes."""
import pytest

from ppo.agents import AgentArguments, ToolEnvironment
from ppo.agents.record_env import build_environments, close_all, record_choice
from ppo.agents.tool_state import StatefulTool, ToolStates

EVENTS = []


class Box(StatefulTool):
    """Stores `put` values; reward: how many; release logs its name (or raises with `fail`)."""
    name, description = "put", "store a value"

    def __init__(self, fail=False):
        self.fail = fail

    def create(self, record, size=0):
        self.items, self.size = [], size
        EVENTS.append(("create", record["src"], size))

    def call(self, value):
        self.items.append(value)
        return f"{len(self.items)} of {self.size}"

    def reward(self):
        return float(len(self.items))

    def release(self):
        EVENTS.append(("release", len(self.items)))
        if self.fail:
            raise OSError("sandbox already gone")


class Boom(Box):
    name = "boom"

    def release(self):
        EVENTS.append(("boom-release",))
        raise RuntimeError("release failed")


def test_a_record_chooses_its_environment_and_its_arguments():
    args = AgentArguments(env_name="tools", env_kwargs='{"tools": ["calculator"], "max_output_chars": 10}')
    assert record_choice(args, {"src": "q"}) == ("tools", {"tools": ["calculator"], "max_output_chars": 10})
    assert record_choice(args, {"env_kwargs": {"max_output_chars": 3}}) == ("tools", {"tools": ["calculator"],
                                                                                      "max_output_chars": 3})
    assert record_choice(args, {"env_name": "m:E", "env_kwargs": '{"a": 1}'}) == ("m:E", {"a": 1})  # the run's left out
    with pytest.raises(ValueError, match="a record's env_kwargs must be a JSON object, got \\[1\\]"):
        record_choice(args, {"env_kwargs": [1]})
    with pytest.raises(ValueError, match="a record's env_name must be a string, got int 3"):
        record_choice(args, {"env_name": 3})


def test_built_environments_are_closed_when_a_later_one_fails():
    closed = []

    class Env:
        def __init__(self, i):
            self.i = i

        def close(self):
            closed.append(self.i)
            if self.i == 0:
                raise OSError("close failed")

    def factory(record):
        if record == 2:
            raise ValueError("bad record")
        return Env(record)

    with pytest.raises(ValueError, match="bad record"):
        build_environments(factory, [0, 1, 2, 3])
    assert closed == [0, 1]  # the first close raised: the second still ran
    assert close_all([Env(5), Env(0), object()]) == 1 and closed[-2:] == [5, 0]


def test_a_stateful_tool_lives_one_trajectory(monkeypatch):
    EVENTS.clear()
    env = ToolEnvironment(tools=[f"{__name__}:Box"], tool_options={f"{__name__}:Box": {"fail": True}})
    assert env.tools[0]["function"]["name"] == "put"
    assert env.tools[0]["function"]["parameters"] == {"type": "object", "properties": {"value": {"type": "string"}},
                                                      "required": ["value"]}
    env.reset({"src": "q1", "extra_info": {"tools_kwargs": {"put": {"create_kwargs": {"size": 2}}}}})
    obs, reward, done, info = env.step('<tool_call>{"name": "put", "arguments": {"value": "a"}}</tool_call>')
    assert (obs, reward, done, info["tool_calls"][0]["error"]) == ("1 of 2", 0.0, False, None)
    assert env.step("the answer")[1:3] == (1.0, True)
    assert env.episode_reward() == 0.0  # read once per episode
    with pytest.raises(OSError, match="sandbox already gone"):
        env.close()
    env.close()  # released once: nothing left to release
    assert EVENTS == [("create", "q1", 2), ("release", 1)]


def test_every_release_runs_when_one_raises():
    EVENTS.clear()
    states = ToolStates({"boom": (Boom, None), "put": (Box, None)})
    states.create({"src": "q"})
    with pytest.raises(RuntimeError, match="release failed"):
        states.release()
    assert EVENTS[-2:] == [("boom-release",), ("release", 0)]


def test_stateful_tools_refuse_worker_processes():
    with pytest.raises(ValueError, match="stateful tools \\(put\\) keep their state in this process: use "
                                         "tool_isolation thread"):
        ToolEnvironment(tools=["calculator", f"{__name__}:Box"], tool_isolation="process")
