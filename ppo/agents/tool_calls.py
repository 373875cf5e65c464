"""Reading a tool call out of the policy's text.

The policy calls a tool by writing ``<tool_call>BODY</tool_call>`` (Qwen2.5's / Hermes' tags),
where BODY is either

- JSON: ``{"name": "calculator", "arguments": {"expression": "12*34"}}`` (the form Qwen's chat
  template describes to the model; ``arguments`` may also be a JSON string holding the object,
  as some models write it), or
- the plain tagged form: ``calculator 12*34`` -- the tool's name, a space, and the value of its
  one required parameter (short enough for a tiny model to learn).

Text before ``CALL_OPEN`` is free (reasoning). :func:`parse_tool_call` returns the turn's last
call, or why there is none that can run (a :class:`CallProblem`: "malformed" or
"unknown_tool"), or ``(None, None)`` when the turn calls nothing (a final answer). The tools
environment reads every call of a turn with a parser of ppo/agents/call_formats.py (``hermes``
reads these forms), ``json_call`` and ``plain_call`` are its readers of one body.
"""
import json
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


@dataclass
class ToolCall:
    name: str
    arguments: Dict[str, Any]


@dataclass
class CallProblem:
    """Why the text's call cannot run: ``kind`` "malformed" or "unknown_tool"; ``message`` is
    what the policy reads back."""

    kind: str
    message: str
    name: Optional[str] = None


def _json_call(body):
    try:
        obj = json.loads(body)
    except ValueError as err:
        return None, f"the tool call is not valid JSON ({err.msg} at character {err.pos})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, 'a JSON tool call needs {"name": ..., "arguments": {...}}'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None, "the arguments of the tool call are a string that is not a JSON object"
    if not isinstance(args, dict):
        return None, "the arguments of the tool call must be a JSON object"
    return ToolCall(obj["name"], args), None


def _plain_call(body, tools):
    name, _, value = body.partition(" ")
    spec = tools.get(name)
    if spec is None:
        return ToolCall(name, {}), None  # reported as an unknown tool by the caller
    params = list(spec.required) or list((spec.schema.get("properties") or {}))
    if len(params) != 1:
        return None, f"{name} takes {len(params)} arguments: write them as JSON {{\"name\": ..., \"arguments\": {{...}}}}"
    return ToolCall(name, {params[0]: value}), None


def parse_tool_call(text: str, tools: Mapping[str, Any]) -> Tuple[Optional[ToolCall], Optional[CallProblem]]:
    """The call in `text` (see the module docstring); `tools` maps names to ToolSpecs."""
    start = text.rfind(CALL_OPEN)
    if start < 0:
        if CALL_CLOSE in text:
            return None, CallProblem("malformed", f"Error: {CALL_CLOSE} without {CALL_OPEN}")
        return None, None
    end = text.find(CALL_CLOSE, start)
    if end < 0:
        return None, CallProblem("malformed", f"Error: the tool call has no {CALL_CLOSE}")
    body = text[start + len(CALL_OPEN): end].strip()
    if not body:
        return None, CallProblem("malformed", "Error: the tool call is empty")
    call, problem = _json_call(body) if body.startswith("{") else _plain_call(body, tools)
    if problem:
        return None, CallProblem("malformed", f"Error: {problem}")
    if call.name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        return None, CallProblem("unknown_tool", f"Error: there is no tool {call.name[:40]!r} (tools: {known})", call.name)
    return call, None


json_call, plain_call = _json_call, _plain_call
