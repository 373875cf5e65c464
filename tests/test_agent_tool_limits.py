"""Async tools, the cap on concurrent tool calls and the per-call and per-trajectory timeouts of
the argument file (`max_concurrent_tool_calls`, `tool_timeout_s`, `trajectory_timeout_s`;
`step_timeout_s` is the per-step one): through ppo/run_ppo.py with an environment module
outside the package, and the pausing rollout, whose other rows decode while a row's async call
waits."""
import pytest

from ppo.agents import AgentArguments, AgentSettings, TaggedFormat, rollout_trajectories
from ppo.common.argument_problems import ArgumentError
from ppo.rollout import RolloutEngine, SamplingParams
from tests.agent_helpers import EOS, PAD, ScriptedToolEnv, tiny_llama
from tests.agent_outside import agent_row, run_outside

TWO_NAPS = '<tool_call>{"name": "nap", "arguments": {"seconds": 0.3}}</tool_call>' * 2
LONG_NAP = '<tool_call>{"name": "nap", "arguments": {"seconds": 20}}</tool_call>'


@pytest.fixture(scope="module")
def tags_model_dir(tmp_path_factory):
    """The tiny Llama with the tool tags as single tokens (room for three turns in 110 tokens)."""
    path = tmp_path_factory.mktemp("tags_llama")
    tiny_llama(path, tool_tags=True)
    return str(path)


@pytest.mark.slow
def test_async_tools_run_under_the_cap_and_time_out_per_call(tags_model_dir, tiny_data_dir, tmp_path):
    """A user's async tool (a coroutine function in a module in tmp_path): turn 1 makes two
    0.3 s calls on each of the 8 rows, never more than max_concurrent_tool_calls=2 running at
    once (and 2 reached); turn 2 calls it for 20 s and tool_timeout_s=1 cancels each call: 8
    timeouts counted, the policy reads the timeout and the episode goes on."""
    kwargs = {"script": [TWO_NAPS, LONG_NAP], "tools": ["nap"], "max_calls_per_turn": 2}
    proc, metrics, tools, samples = run_outside(tmp_path, tags_model_dir, tiny_data_dir, "naps", kwargs,
                                                "--max_concurrent_tool_calls", "2", "--tool_timeout_s", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = agent_row(metrics)
    assert row["tool/nap/calls"] == 24.0 and row["tool/nap/timeouts"] == 8.0 and row["tool/nap/errors"] == 8.0
    assert row["agent/turns_mean"] == 3.0 and row["agent/trajectory_timeouts"] == 0.0, (row, samples[:1])
    assert len(tools) == 24 and max(t["running"] for t in tools) == 2
    assert all("<tool_response>ok</tool_response>" * 2 in s["response"] for s in samples)
    assert all("<tool_response>Error: nap timed out after 1 s</tool_response>" in s["response"] for s in samples)


@pytest.mark.slow
def test_a_trajectory_past_its_timeout_ends_and_is_counted(tiny_model_dir, tiny_data_dir, tmp_path):
    """trajectory_timeout_s=3 and a tool call of 20 s on every row (its own timeout 30 s, the
    step's 600 s): each row ends at its trajectory's deadline (trajectory_timeout, truncated),
    not as an environment failure."""
    kwargs = {"script": [LONG_NAP], "tools": ["nap"]}
    proc, metrics, tools, _ = run_outside(tmp_path, tiny_model_dir, tiny_data_dir, "late", kwargs,
                                          "--trajectory_timeout_s", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = agent_row(metrics)
    assert row["agent/trajectory_timeouts"] == 8.0 and row["agent/truncated_frac"] == 1.0
    assert row["agent/env_errors"] == 0.0 and row["agent/turns_mean"] == 1.0 and len(tools) == 8


def test_the_limits_are_checked():
    with pytest.raises(ArgumentError) as err:
        AgentArguments(tool_timeout_s=-1, trajectory_timeout_s=-2, max_concurrent_tool_calls=-3)
    for name in ("tool_timeout_s", "trajectory_timeout_s", "max_concurrent_tool_calls"):
        assert f"{name} must be >= 0 (0: none)" in str(err.value)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama"))


def test_other_rows_decode_while_an_async_call_waits(llama):
    """Row 0's async call sleeps 3 s; the other rows make their (instant) calls and write all
    their turns before it returns; the turn-synchronous baseline makes them wait for it."""
    tok, model = llama
    records = [{"src": f"Reverse: {'abcdef'[: 2 + i]}", "actions": [f"<tool_call>test_async_nap {3 if i == 0 else 0}"
                "</tool_call>", "<tool_call>test_async_nap 0</tool_call>"]} for i in range(4)]
    args = AgentSettings(max_turns=4, max_total_len=120)
    for pause in ("row", "batch"):
        result = rollout_trajectories(
            RolloutEngine(model, eos_token_id=EOS, pad_token_id=PAD, kernels="paddle"), records, args,
            TaggedFormat(tok, "USER: {input} ASSISTANT:"), SamplingParams(max_new_tokens=4, min_new_tokens=4),
            seed=1, env_factory=lambda: ScriptedToolEnv(tools=["test_async_nap"]), pause=pause)
        slow_back = result.trajectories[0].tool_calls[0]["end"]
        others_last = max(t.token_times[-1] for t in result.trajectories[1:])
        assert all(c["error"] is None for t in result.trajectories for c in t.tool_calls)
        assert [t.num_turns for t in result.trajectories] == [3] * 4
        assert (others_last < slow_back) == (pause == "row")


def test_an_async_call_is_cancelled_at_its_timeout_and_runs_in_a_worker_too():
    """tool_timeout_s 0.5 over a 30 s async sleep: the call is a timeout and the coroutine is
    cancelled (a thread could only be left running); in a worker process it runs as well."""
    from ppo.agents import call_tool, get_tool, set_tool_limits
    from tests.agent_helpers import ASYNC_EVENTS

    spec = get_tool("test_async_watch")
    set_tool_limits(0, 0.5)
    try:
        result = call_tool(spec, {"seconds": "30"})
    finally:
        set_tool_limits(0, 0.0)
    assert (result.error, result.text) == ("timeout", "Error: test_async_watch timed out after 0.5 s")
    assert ASYNC_EVENTS == ["cancelled"]  # wait_for awaits the cancelled coroutine before it gives up
    assert call_tool(spec, {"seconds": "0"}, isolation="process").text == "woke"
    assert call_tool(spec, {"seconds": "0"}).text == "woke"
