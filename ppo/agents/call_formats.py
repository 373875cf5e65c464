"""The tool-call format registry: one entry per name, a parser and its facts.

A parser reads the calls out of one policy turn::

    parse(text: str, tools: Mapping[str, ToolSpec]) -> List[ToolCall | CallProblem]

one item per call the text holds, in the order written (an empty list: the turn calls nothing,
it is a final answer). A call that cannot run is a :class:`CallProblem` in its place
("malformed" or "unknown_tool"): the policy reads its message as that call's answer and the
rollout counts it (``agent/malformed_calls``, ``agent/unknown_tool_calls``).

Built-in formats (the forms inference servers parse, e.g. vLLM's tool parsers):

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5),
  or the plain tagged form ``<tool_call>calculator 12*34</tool_call>``; any number of blocks;
- ``qwen3``: Qwen3's chat template form, the same tags with a JSON body only;
- ``qwen3_coder``: Qwen3-Coder's XML form ``<tool_call><function=NAME><parameter=KEY>VALUE
  </parameter></function></tool_call>`` (values read as JSON unless the schema says string);
- ``llama3_json``: Llama 3.1's JSON form, the whole message ``{"name": ..., "parameters":
  {...}}`` (after an optional ``<|python_tag|>``; several separated by ``;``);
- ``json_list``: the whole message a JSON list ``[{"name": ..., "arguments": {...}}, ...]``.

:class:`CallFormatFacts` say what callers need: ``call_close`` (the text that ends one call:
the rollout may stop a turn there when a turn holds one call) and an example. Formats are
registered with ``register_call_format`` or loaded from ``module.path:function``.
"""
import importlib
import json
import re
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from .tool_calls import CALL_CLOSE, CALL_OPEN, CallProblem, ToolCall, json_call, plain_call

_REGISTRY: Dict[str, Callable] = {}
_FACTS: Dict[str, "CallFormatFacts"] = {}
_LOCK = threading.Lock()
_END_TOKENS = re.compile(r"(\s|<\|[A-Za-z0-9_]+\|>|</s>)*")
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class CallFormatFacts:
    """What a registered format reads: a summary, ``call_close`` ("" when calls are the whole
    message) and an example call."""

    summary: str
    call_close: str = ""
    example: str = ""


def register_call_format(name: str, fn: Optional[Callable] = None, facts: Optional[CallFormatFacts] = None):
    """Register the parser ``fn`` (with its `facts`) as the format ``name``; usable as a decorator.
    The same function again is a no-op; another function under a taken name raises ValueError."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"call format name must be a non-empty string, got {name!r}")

    def decorator(func):
        if not callable(func):
            raise TypeError(f"call format {name!r} must be callable, got {type(func).__name__}")
        with _LOCK:
            existing = _REGISTRY.get(name)
            if existing is not None and existing is not func:
                raise ValueError(f"a different call format is already registered as {name!r}: {existing!r}")
            _REGISTRY[name] = func
            _FACTS[name] = facts or _FACTS.get(name) or CallFormatFacts(summary=name)
        return func

    return decorator(fn) if fn is not None else decorator


def list_call_formats() -> List[str]:
    with _LOCK:
        return sorted(_REGISTRY)


def get_call_format(name: str) -> Callable:
    """The parser registered as ``name`` or imported from ``module.path:function``."""
    with _LOCK:
        fn = _REGISTRY.get(name)
    if fn is not None:
        return fn
    if isinstance(name, str) and ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"cannot import module {module_name!r} for call format {name!r}: {err}") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise ValueError(f"call format {name!r}: module {module_name!r} has no function {attr!r}")
        return register_call_format(name, fn)
    raise ValueError(f"unknown call_format {name!r}; valid names: {', '.join(list_call_formats())} "
                     "(or 'module.path:function')")


def call_format_facts(name: str) -> CallFormatFacts:
    get_call_format(name)
    with _LOCK:
        return _FACTS[name]


def checked(call, problem, tools):
    """`call` as a ToolCall, or the CallProblem of a malformed call or of a tool not in `tools`."""
    if problem:
        return CallProblem("malformed", f"Error: {problem}")
    if call.name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        return CallProblem("unknown_tool", f"Error: there is no tool {call.name[:40]!r} (tools: {known})", call.name)
    return call


def tagged_blocks(text, read_body, tools):
    """Every ``<tool_call>BODY</tool_call>`` block of `text`, read by `read_body(body) -> (call, problem)`."""
    items, pos = [], 0
    while True:
        start, close = text.find(CALL_OPEN, pos), text.find(CALL_CLOSE, pos)
        if start < 0:
            if close >= 0:
                items.append(CallProblem("malformed", f"Error: {CALL_CLOSE} without {CALL_OPEN}"))
            return items
        if 0 <= close < start:
            items.append(CallProblem("malformed", f"Error: {CALL_CLOSE} without {CALL_OPEN}"))
        end = text.find(CALL_CLOSE, start)
        if end < 0:
            items.append(CallProblem("malformed", f"Error: the tool call has no {CALL_CLOSE}"))
            return items
        body = text[start + len(CALL_OPEN): end].strip()
        if not body:
            items.append(CallProblem("malformed", "Error: the tool call is empty"))
        else:
            items.append(checked(*read_body(body), tools))
        pos = end + len(CALL_CLOSE)


@register_call_format("hermes", facts=CallFormatFacts(
    "Hermes / Qwen2.5: <tool_call>JSON</tool_call> blocks, or <tool_call>NAME VALUE</tool_call> for a one-parameter tool",
    CALL_CLOSE, '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'))
def hermes(text, tools):
    return tagged_blocks(text, lambda body: json_call(body) if body.startswith("{") else plain_call(body, tools), tools)


@register_call_format("qwen3", facts=CallFormatFacts(
    "Qwen3's chat template: <tool_call>JSON</tool_call> blocks, JSON bodies only", CALL_CLOSE,
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'))
def qwen3(text, tools):
    return tagged_blocks(text, json_call, tools)


_FUNCTION = re.compile(r"^<function=([^>\s]+)>(.*)</function>$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


def _xml_call(body, tools):
    match = _FUNCTION.match(body)
    if not match:
        return None, "a tool call needs <function=NAME>...</function> around its parameters"
    name, inner = match.group(1), match.group(2)
    if _PARAMETER.sub("", inner).strip():
        return None, f"{name}: text outside <parameter=KEY>...</parameter> in the call"
    props = ((tools.get(name).schema if name in tools else {}) or {}).get("properties") or {}
    arguments = {}
    for key, raw in _PARAMETER.findall(inner):
        value = raw.strip("\n")
        if (props.get(key) or {}).get("type") != "string":
            try:
                value = json.loads(value)
            except ValueError:
                pass  # a bare word: the text itself (the schema check says whether it fits)
        arguments[key] = value
    return ToolCall(name, arguments), None


@register_call_format("qwen3_coder", facts=CallFormatFacts(
    "Qwen3-Coder: <tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>", CALL_CLOSE,
    "<tool_call>\n<function=calculator>\n<parameter=expression>\n12*34\n</parameter>\n</function>\n</tool_call>"))
def qwen3_coder(text, tools):
    return tagged_blocks(text, lambda body: _xml_call(body, tools), tools)


def _json_values(text, separator):
    """The JSON values of `text` one after another (`separator` between them), and the problem
    (None when every one parsed and only end-of-turn tokens follow)."""
    decoder, values, pos = json.JSONDecoder(), [], 0
    while True:
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError as err:
            return values, f"the tool call is not valid JSON ({err.msg} at character {err.pos})"
        values.append(value)
        rest = text[pos:].lstrip()
        if separator and rest.startswith(separator):
            pos = len(text) - len(rest) + len(separator)
            pos += len(text[pos:]) - len(text[pos:].lstrip())
            continue
        if _END_TOKENS.fullmatch(rest):
            return values, None
        return values, f"text after the tool call: {rest[:40]!r}"


def _object_call(obj):
    return json_call(json.dumps(obj)) if isinstance(obj, dict) else (None, "each tool call must be a JSON object")


@register_call_format("llama3_json", facts=CallFormatFacts(
    "Llama 3.1 JSON: the message is {\"name\": ..., \"parameters\": {...}} (after an optional <|python_tag|>; "
    "several separated by ;)", "", '{"name": "calculator", "parameters": {"expression": "12*34"}}'))
def llama3_json(text, tools):
    body = text.strip()
    body = body[len(_PYTHON_TAG):].lstrip() if body.startswith(_PYTHON_TAG) else body
    if not body.startswith("{"):
        return []
    values, problem = _json_values(body, ";")
    items = [checked(*_object_call(v), tools) for v in values]
    return items + [CallProblem("malformed", f"Error: {problem}")] if problem else items


@register_call_format("json_list", facts=CallFormatFacts(
    "a plain JSON list: the message is [{\"name\": ..., \"arguments\": {...}}, ...]", "",
    '[{"name": "calculator", "arguments": {"expression": "12*34"}}]'))
def json_list(text, tools):
    body = text.strip()
    if not body.startswith("["):
        return []
    values, problem = _json_values(body, "")
    if problem or len(values) != 1:
        return [CallProblem("malformed", f"Error: {problem or 'the message holds more than one JSON list'}")]
    if not values[0]:
        return [CallProblem("malformed", "Error: the list of tool calls is empty")]
    return [checked(*_object_call(v), tools) for v in values[0]]
