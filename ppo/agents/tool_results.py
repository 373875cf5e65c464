"""What a tool's function gives back, as text: the one conversion shared by the tools' thread
(ppo/agents/tools.py) and their worker processes (ppo/agents/tool_worker.py).

A tool returns text; a dict, list, number or bool becomes JSON text, bytes UTF-8 text, and
anything else (None, a set, an object, bytes that are not UTF-8) is the tool's error
"bad_result". :func:`call_outcome` runs a function and says what happened in a small picklable
tuple; :func:`cut_with_notice` cuts an answer with its TRUNCATED notice inside the budget.
"""
import asyncio
import inspect
import json

TRUNCATED = "...(truncated)"


class ToolTimeout(Exception):
    """Raised by a tool whose own work ran out of time (e.g. a sandboxed program killed at its
    wall-clock limit): counted as a timeout, like a call that outlives the tool's timeout."""


def result_text(value):
    """``(text, None)`` for a tool's return value, or ``(message, "bad_result")`` when it is
    not text: str as it is, bytes as UTF-8, a dict/list/number/bool as JSON text."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8"), None
        except UnicodeDecodeError:
            return "returned bytes that are not UTF-8 text", "bad_result"
    if value is not None and isinstance(value, (dict, list, tuple, int, float, bool)):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False), None
        except (TypeError, ValueError) as err:
            return f"returned a {type(value).__name__} that is not JSON ({err})", "bad_result"
    return f"returned {type(value).__name__}, not text or JSON", "bad_result"


def call_outcome(fn, arguments):
    """fn(**arguments) as a picklable outcome: ``("ok", text, error)`` (``result_text``),
    ``("raised", type name, message)`` or ``("timeout", message)`` (a ToolTimeout)."""
    try:
        value = fn(**arguments)
        if inspect.iscoroutine(value):  # an async tool outside the shared loop (a worker process)
            value = asyncio.run(value)
    except ToolTimeout as err:
        return ("timeout", str(err))
    except BaseException as err:  # noqa: BLE001 - reported to the policy as the tool's error
        return ("raised", type(err).__name__, str(err)[:200])
    return ("ok", *result_text(value))


def cut_with_notice(text, max_chars):
    """`text` cut to `max_chars` characters with the TRUNCATED notice inside them."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - len(TRUNCATED), 0)
    return (text[:keep] + TRUNCATED)[:max_chars]
