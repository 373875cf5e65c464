"""Several tool calls in one policy turn: every call runs and each answer is its own tool
message, in the order written (through ppo/run_ppo.py with an environment module outside the
package, and in a chat template's rendering); with ``max_calls_per_turn`` above 1 a turn ends
where the model ends it (its end-of-turn token), not at the first ``</tool_call>``; calls past
the cap are answered with an error and counted."""
import json

import pytest

from ppo.agents import AgentSettings, ChatTemplateFormat, ToolEnvironment, rollout_trajectories
from ppo.agents.metrics import agent_metrics
from ppo.data.encode import encode_exact
from ppo.rollout import RolloutEngine, SamplingParams
from tests.agent_helpers import chain_qwen2
from tests.agent_outside import agent_row, run_outside

TWO_CALLS = "<tool_call>lookup a</tool_call> then <tool_call>lookup b</tool_call>"


@pytest.mark.slow
def test_every_call_of_a_turn_runs_through_run_ppo(tiny_model_dir, tiny_data_dir, tmp_path):
    """A user's module (in tmp_path) whose turn holds two calls: both run, in order, on every
    row (16 calls over 8 rows); the policy reads both answers, each in its own tags."""
    kwargs = {"script": [TWO_CALLS], "tools": ["lookup"], "max_calls_per_turn": 2, "concurrent_calls": False}
    proc, metrics, tools, samples = run_outside(tmp_path, tiny_model_dir, tiny_data_dir, "two", kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = agent_row(metrics)
    assert row["tool/lookup/calls"] == 16.0 and row["tool/lookup/errors"] == 0.0
    assert row["agent/tool_calls_mean"] == 2.0 and row["agent/turns_mean"] == 2.0
    assert sorted(t["key"] for t in tools) == ["a"] * 8 + ["b"] * 8
    responses = [s["response"] for s in samples]
    assert responses and all("<tool_response>11</tool_response><tool_response>22</tool_response>" in r
                             for r in responses), responses


def test_the_calls_of_a_turn_run_at_once_or_in_order_and_answer_in_order():
    """Two calls of a tool that sleeps: concurrent_calls runs them at once (their intervals
    overlap), else one after the other (the second starts after the first ended); the answers
    are in the written order either way."""
    from ppo.agents.call_formats import get_call_format
    from ppo.agents.tool_runs import run_turn_calls
    from ppo.agents.tools import get_tool
    from tests.agent_helpers import SLEEPY_CALLS

    specs = {"test_sleepy": get_tool("test_sleepy")}
    items = get_call_format("hermes")("<tool_call>test_sleepy first</tool_call><tool_call>test_sleepy second</tool_call>",
                                      specs)
    for concurrent in (True, False):
        SLEEPY_CALLS.clear()
        answers, entries = run_turn_calls(items, specs, 100, max_calls=2, concurrent=concurrent)
        assert answers == ["first", "second"] and [e["error"] for e in entries] == [None, None]
        (_, s1, e1), (_, s2, e2) = sorted(SLEEPY_CALLS, key=lambda c: c[1])
        assert (s2 < e1) == concurrent
        if not concurrent:
            assert [c[0] for c in SLEEPY_CALLS] == ["first", "second"]


def test_calls_past_the_cap_are_answered_and_counted():
    """max_calls_per_turn 1 (the default) and a text with two calls: the first runs, the second
    is answered with an error the policy reads (not silently dropped) and counted."""
    env = ToolEnvironment(tools=["calculator"])
    env.reset({"src": "q"})
    obs, _, done, info = env.step("<tool_call>calculator 2+3</tool_call><tool_call>calculator 4*5</tool_call>")
    assert not done and obs == [{"role": "tool", "content": "5"}, {"role": "tool", "content":
                                "Error: at most 1 tool call per turn; this call was not run"}]
    trajectory = type("T", (), {"tool_calls": info["tool_calls"], "num_turns": 1, "truncated": False, "stop_reason": "done"})
    metrics = agent_metrics([trajectory])
    assert metrics["agent/too_many_calls"] == 1.0 and metrics["tool/calculator/calls"] == 1.0
    many = ToolEnvironment(tools=["calculator"], max_calls_per_turn=3)
    many.reset({"src": "q"})
    obs, _, _, info = many.step('<tool_call>calculator 2+3</tool_call> <tool_call>{"name": "calculator", '
                                '"arguments": {"expression": "4*5"}}</tool_call><tool_call>calculator 1+</tool_call>')
    assert [m["content"] for m in obs][:2] == ["5", "20"] and obs[2]["content"].startswith("Error: ")
    assert [c["error"] for c in info["tool_calls"]] == [None, None, "raised"]
    assert env.stop_strings == ["</tool_call>"] and many.stop_strings == []


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from ppo.tiny.bpe_tokenizers import build_qwen2_tokenizer

    return build_qwen2_tokenizer(str(tmp_path_factory.mktemp("qwen")), tool_calls=True)


@pytest.mark.parametrize("max_calls", [1, 2])
def test_the_turn_ends_at_the_models_end_of_turn_when_a_turn_may_hold_several_calls(qwen, max_calls):
    """A model that writes `<tool_call>sq 7</tool_call> ok` then `<|im_end|>`: with one call per
    turn the turn stops at `</tool_call>` (the end-of-turn token forced after it); with two it
    goes on to the model's own `<|im_end|>`, so the text after the call is the policy's."""
    tok = qwen
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    chain = encode_exact(tok, "\n") + encode_exact(tok, "<tool_call>sq 7</tool_call> ok") + [im_end]
    engine = RolloutEngine(chain_qwen2(len(tok), chain), eos_token_id=im_end, pad_token_id=tok.pad_token_id,
                           kernels="paddle")
    kwargs = {"tools": ["sq"], "max_calls_per_turn": max_calls}
    args = AgentSettings(env_name="tools", env_kwargs=json.dumps(kwargs), max_turns=2, max_total_len=900)
    import tests.agent_helpers  # noqa: F401 (registers sq)

    result = rollout_trajectories(engine, [{"src": "What is 7 squared?"}], args, ChatTemplateFormat(tok),
                                  SamplingParams(max_new_tokens=24, do_sample=False), seed=0)
    first = [s for s in result.trajectories[0].segments if s.kind == "policy"][0]
    expected = "<tool_call>sq 7</tool_call>" + (" ok" if max_calls == 2 else "") + "<|im_end|>"
    assert first.text == expected
    assert [c["name"] for c in result.trajectories[0].tool_calls] == ["sq"] * 2


def test_a_chat_template_renders_each_answer_as_its_own_tool_message(qwen):
    """Two answers after one turn: the segments' text is what the template renders for two tool
    messages after the assistant's (Qwen2.5: both in one user turn, each in <tool_response> tags)."""
    tok = qwen
    fmt = ChatTemplateFormat(tok)
    messages = [{"role": "tool", "content": "49"}, {"role": "tool", "content": "64"}]
    segments = fmt.messages_segments(messages, 0, 32)
    assert [s.kind for s in segments] == ["glue", "tool", "glue", "tool", "glue"]
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "CALL"}] + messages
    rendered = fmt.render(conversation, None, True)
    after_turn = rendered[rendered.index("CALL" + fmt.turn_end_text) + 4 + len(fmt.turn_end_text):]
    assert "".join(s.text for s in segments) == after_turn
    assert after_turn.count("<tool_response>") == 2 and after_turn.index("49") < after_turn.index("64")
