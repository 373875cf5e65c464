"""Running every call of one policy turn and answering each, in the order written.

:func:`run_turn_calls` takes the items a call-format parser read (ppo/agents/call_formats.py:
ToolCall or CallProblem, in order) and gives one answer per item: the tool's answer for a call
that runs, the problem's message for one that cannot, and for the calls past
``max_calls_per_turn`` the error ``"too_many_calls"`` (the policy reads it; nothing runs).
Calls that run go concurrently (one thread each, under the run's cap on concurrent calls,
ppo/agents/tool_limits.py) when ``concurrent`` is set and the turn holds more than one, else
one after the other; the answers come back in the order written either way.
"""
import threading

from .tool_calls import CallProblem
from .tools import call_tool


def problem_entry(problem):
    return {"name": problem.name, "error": problem.kind, "timeout": False, "latency_ms": 0.0,
            "detail": problem.message[:200]}


def result_entry(name, result):
    entry = {"name": name, "error": result.error, "timeout": result.error == "timeout", "latency_ms": result.latency_ms}
    if result.error:
        entry["detail"] = result.text[:200]
    return entry


def _cap(items, max_calls):
    over = len(items) - max_calls
    if over <= 0:
        return list(items)
    message = (f"Error: at most {max_calls} tool call{'s' if max_calls > 1 else ''} per turn; this call was not run")
    return list(items[:max_calls]) + [CallProblem("too_many_calls", message, getattr(i, "name", None))
                                      for i in items[max_calls:]]


def run_turn_calls(items, specs, max_output_chars, isolation="thread", max_calls=1, concurrent=True):
    """``(answers, entries)``: the text the policy reads for each item of `items` and the
    ``info["tool_calls"]`` entry of each (see the module docstring); `specs` maps names to ToolSpecs."""
    items = _cap(items, max_calls)
    results = [None] * len(items)

    def run(i):
        call = items[i]
        results[i] = call_tool(specs[call.name], call.arguments, max_output_chars, isolation=isolation)

    runnable = [i for i, item in enumerate(items) if not isinstance(item, CallProblem)]
    if concurrent and len(runnable) > 1:
        threads = [threading.Thread(target=run, args=(i,), name=f"tool-call-{i}", daemon=True) for i in runnable]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in runnable:
            run(i)
    answers, entries = [], []
    for item, result in zip(items, results):
        if isinstance(item, CallProblem):
            answers.append(item.message)
            entries.append(problem_entry(item))
        else:
            answers.append(result.text)
            entries.append(result_entry(item.name, result))
    return answers, entries
