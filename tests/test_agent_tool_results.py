"""What a tool call gives back (ppo/agents/tools.py): results that are not text as JSON text or
as the tool's error, an answer cut with its notice inside the budget (characters and tokens),
tools in worker processes (`tool_isolation process`, ppo/agents/tool_worker.py) that may exit,
hang or print without touching the trainer, and the stop message of a tool pool that keeps
failing (one message naming the tool's last error)."""
import os
import time

import pytest

from ppo.agents import Segment, TaggedFormat, ToolEnvironment, Trajectory, call_tool, get_tool
from ppo.agents.tools import TRUNCATED
from ppo.common.process_exit import STOPPED_EXIT_CODE, run_and_exit
from ppo.trainer.agent_rollout import ToolFailureWatch, ToolPoolError
from tests import agent_helpers  # noqa: F401 (registers the test tools)


@pytest.mark.parametrize("isolation", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_results_that_are_not_text(isolation):
    def returns(kind):
        return call_tool(get_tool("test_returns"), {"kind": kind}, **({"isolation": isolation} if isolation != "thread" else {}))

    assert (returns("dict").text, returns("dict").error) == ('{"b": 1, "a": [1.5, "x"]}', None)
    assert (returns("number").text, returns("bytes").text) == ("7", "caf\u00e9")
    for kind, said in [("none", "returned NoneType, not text or JSON"), ("set", "returned set, not text or JSON"),
                       ("bad_bytes", "returned bytes that are not UTF-8 text")]:
        result = returns(kind)
        assert result.error == "bad_result" and result.text == f"Error: test_returns {said}", kind


def test_a_cut_answer_keeps_its_notice_inside_the_budget(tmp_path):
    loud = call_tool(get_tool("test_loud"), {"x": "1"}, max_chars=40)
    assert loud.error == "too_long" and len(loud.text) == 40 and loud.text == "y" * 26 + TRUNCATED
    from ppo.tiny.factory import build_tokenizer

    tok = build_tokenizer(str(tmp_path), tool_tags=True)
    fmt = TaggedFormat(tok, "USER: {input} ASSISTANT:")
    segments = fmt.observation_segments("y" * 100, "tool", 0, 20)
    body = segments[1]
    assert body.kind == "tool" and len(body.token_ids) == 20 and body.text == "y" * 6 + TRUNCATED
    assert body.token_ids == tok(body.text, add_special_tokens=False)["input_ids"]
    short = fmt.observation_segments("y" * 20, "tool", 0, 20)[1]
    assert short.text == "y" * 20


@pytest.mark.slow
def test_a_tool_that_exits_or_hangs_in_a_worker_process_leaves_the_trainer_running():
    """`os._exit(3)` in the tool ends its worker only (the call is "crashed"); a tool that sleeps
    past its 1 s timeout is killed with its worker; the next calls get a new worker."""
    env = ToolEnvironment(tools=["test_exit", "test_hang", "test_chatty", "calculator"], tool_isolation="process")
    obs, _, done, info = env.step("<tool_call>test_exit x</tool_call>")
    assert obs == "Error: test_exit ended its worker process (exit status 3)" and not done
    assert info["tool_calls"][0]["error"] == "crashed" and info["tool_calls"][0]["detail"] == obs
    start = time.monotonic()
    obs, _, _, info = env.step("<tool_call>test_hang x</tool_call>")
    assert obs == "Error: test_hang timed out after 1 s" and info["tool_calls"][0]["timeout"]
    assert time.monotonic() - start < 60
    assert env.step("<tool_call>calculator 6*7</tool_call>")[0] == "42"
    assert env.step("<tool_call>test_chatty hi</tool_call>")[0] == '{"answer": "hi", "n": [1, 2]}'  # prints kept out
    assert os.getpid() > 0  # this process is still here


def test_tool_isolation_is_checked():
    with pytest.raises(ValueError, match="tool_isolation must be one of"):
        ToolEnvironment(tools=["calculator"], tool_isolation="container")
    from ppo.agents import register_tool

    register_tool("test_closure", lambda x: x)  # a lambda cannot travel to a worker process
    with pytest.raises(ValueError, match="'test_closure' cannot run with tool_isolation process"):
        ToolEnvironment(tools=["test_closure"], tool_isolation="process")


def _trajectory(calls, stop_reason):
    return Trajectory(segments=[Segment("prompt", [1])], stop_reason=stop_reason, tool_calls=calls)


def test_the_stop_message_names_the_tools_last_error():
    """Every row called a tool that raised and then ran out of turns (stop_reason max_turns):
    the message names the tool and what it raised, not max_turns."""
    raised = {"name": "calculator", "error": "raised", "detail": "Error: calculator raised ZeroDivisionError: division by zero"}
    rows = [_trajectory([{"name": "calculator", "error": None}, raised], "max_turns") for _ in range(4)]
    watch = ToolFailureWatch(0.5, 2)
    assert watch.check(rows, 1) == 1.0
    with pytest.raises(ToolPoolError) as err:
        watch.check(rows, 2)
    message = str(err.value)
    assert "last failure: tool calculator: raised: Error: calculator raised ZeroDivisionError: division by zero" in message
    assert "max_turns" not in message
    hung = [_trajectory([], "env_timeout")]
    with pytest.raises(ToolPoolError, match="the environment: env.step did not return within step_timeout_s"):
        ToolFailureWatch(0.5, 1).check(hung, 1)


def test_the_stop_is_one_message_without_a_traceback(capsys):
    def main():
        raise ToolPoolError("step 2: the tools failed on 8 of 8 rows; last failure: tool x: raised: boom")

    with pytest.raises(SystemExit) as stop:
        run_and_exit(main)
    assert stop.value.code == STOPPED_EXIT_CODE == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.endswith("error: step 2: the tools failed on 8 of 8 rows; last failure: tool x: raised: boom\n")


def _running(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_a_worker_ends_when_its_trainer_is_killed():
    """A trainer killed with SIGKILL while its worker runs a hanging call: the worker notices its
    parent is gone and ends itself (nothing is left running)."""
    import signal
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = ("import sys, threading, time\n"
              "from ppo.agents import call_tool, get_tool, tool_worker\n"
              "import tests.agent_helpers\n"
              "threading.Thread(target=call_tool, args=(get_tool('test_hang'), {'x': '1'}),\n"
              "                 kwargs={'timeout_s': 600, 'isolation': 'process'}, daemon=True).start()\n"
              "while not tool_worker._POOL.started:\n    time.sleep(0.1)\n"
              "print(tool_worker._POOL.started[0].proc.pid, flush=True)\n"
              "time.sleep(600)\n")
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=repo, stdout=subprocess.PIPE, text=True)
    worker = int(trainer.stdout.readline())
    time.sleep(1.0)
    assert _running(worker)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 60
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(worker)
