"""The tool registry: one entry per name, a function, its JSON schema and its facts.

A tool is one function of keyword arguments that returns text; a dict, list, number or bool is
sent as JSON text, bytes as UTF-8 text, and anything else (None, an object) is the tool's error
("bad_result"). Declared with a decorator::

    @register_tool("weather", schema={"type": "object", "properties": {"city": {"type": "string"}},
                                      "required": ["city"]},
                   description="Today's weather in a city.")
    def weather(city):
        return {"Paris": "sunny"}.get(city, "unknown city")

``schema`` is the JSON schema of the arguments (an object schema, as in OpenAI's and Qwen's
function specs); ``ToolSpec.function_schema()`` is the form chat templates take. A tool can
also be named ``module.path:function`` (a registered one, or a plain function whose
signature then gives a schema of string parameters).

:func:`call_tool` runs a tool on arguments parsed from the policy's text: it checks them
against the schema, runs the function with the tool's timeout and never raises: bad
arguments, an exception, a timeout, a result that is not text and an answer longer than
``max_chars`` come back as a :class:`ToolResult` with ``error`` set and a short text the
policy reads. ``isolation`` "thread" (the default) runs the function in a daemon thread of this
process: a thread that does not return in time is left running (Python cannot stop a thread)
and a tool that ends its process (``os._exit``, a crash) ends the trainer. "process" runs it
in a worker process (ppo/agents/tool_worker.py): killed at the timeout, replaced when it dies
("crashed"). The ``python`` tool runs its code in a sandboxed child either way (ppo/sandbox/).
An ``async def`` tool runs on the shared event loop of ppo/agents/tool_limits.py (cancelled at
its timeout), which also holds the run's cap on concurrent calls and its per-call timeout.
"""
import functools
import inspect
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..common.plugins import import_plugin_module
from .tool_results import TRUNCATED, ToolTimeout, call_outcome, cut_with_notice, result_text  # noqa: F401
from .tool_limits import call_slot, call_timeout, is_async, run_async
from .tool_worker import run_in_worker

DEFAULT_TIMEOUT_S = 10.0
ISOLATIONS = ("thread", "process")
_REGISTRY: Dict[str, "ToolSpec"] = {}
_LOCK = threading.Lock()
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: its function, argument schema, description and timeout."""

    name: str
    fn: Callable[..., Any]
    schema: Mapping[str, Any]
    description: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    options: Mapping[str, Any] = field(default_factory=dict)

    def function_schema(self):
        """``{"type": "function", "function": {"name", "description", "parameters"}}``."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.schema)}}

    @property
    def required(self):
        return list(self.schema.get("required", []))

    def with_options(self, options: Optional[Mapping[str, Any]] = None) -> "ToolSpec":
        """This tool with its keyword-only options set (`options` over the registered defaults);
        an unknown option, or a required one (default None) left unset, raises ValueError."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            takes = ", ".join(self.options) or "none"
            raise ValueError(f"tool {self.name!r} has no option {', '.join(unknown)} (its options: {takes})")
        merged = {**self.options, **options}
        unset = [k for k, v in merged.items() if v is None]
        if unset:
            raise ValueError(f"tool {self.name!r} needs the option {', '.join(unset)}")
        if not merged:
            return self
        return replace(self, fn=functools.partial(self.fn, **merged), options=merged)


@dataclass
class ToolResult:
    """What one call gave: the text the policy reads, and what went wrong (``error``: None,
    "bad_arguments", "raised", "timeout", "crashed" (its worker process died), "bad_result" (not
    text, see the module docstring) or "too_long"; the text is still usable for "too_long")."""

    text: str
    error: Optional[str] = None
    latency_ms: float = 0.0


def signature_schema(fn):
    """An object schema of string parameters from `fn`'s positional-or-keyword parameters
    (those without a default are required; keyword-only ones are options)."""
    params = inspect.signature(fn).parameters.values()
    named = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    return {"type": "object", "properties": {p.name: {"type": "string"} for p in named},
            "required": [p.name for p in named if p.default is p.empty]}


def register_tool(name: str, fn: Optional[Callable] = None, schema: Optional[Mapping] = None, description: str = "",
                  timeout_s: float = DEFAULT_TIMEOUT_S, options: Optional[Mapping[str, Any]] = None):
    """Register ``fn`` as the tool ``name``; usable as a decorator (see the module docstring).

    Without ``schema`` the signature gives one (string parameters). ``options``: keyword-only
    parameters of ``fn`` set per environment (``ToolSpec.with_options``) with their defaults
    (None: required), e.g. the corpus of ``search``. The same function again under the same
    name is a no-op; another function under a taken name raises ValueError."""
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"tool name must be a non-empty string without spaces, got {name!r}")
    if not timeout_s > 0:
        raise ValueError(f"tool {name!r}: timeout_s must be > 0, got {timeout_s}")

    def decorator(func):
        if not callable(func):
            raise TypeError(f"tool {name!r} must be callable, got {type(func).__name__}")
        spec_schema = dict(schema) if schema is not None else signature_schema(func)
        if spec_schema.get("type", "object") != "object":
            raise ValueError(f"tool {name!r}: the schema must describe an object of arguments")
        doc = description or (inspect.getdoc(func) or "").split("\n")[0]
        spec = ToolSpec(name, func, spec_schema, doc, float(timeout_s), dict(options or {}))
        with _LOCK:
            existing = _REGISTRY.get(name)
            if existing is not None and existing.fn is not func:
                raise ValueError(f"a different tool is already registered as {name!r}: {existing.fn!r}")
            _REGISTRY[name] = spec
        return func

    return decorator(fn) if fn is not None else decorator


def list_tools() -> List[str]:
    with _LOCK:
        return sorted(_REGISTRY)


def _load(spec):
    module_name, _, attr = spec.partition(":")
    module = import_plugin_module(module_name, f"tool {spec!r}")
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"tool {spec!r}: module {module_name!r} has no function {attr!r}")
    with _LOCK:
        for registered in _REGISTRY.values():
            if registered.fn is fn:
                return registered
    register_tool(spec, fn)
    with _LOCK:
        return _REGISTRY[spec]


def get_tool(name: str) -> ToolSpec:
    """The tool registered as ``name`` or imported from ``module.path:function``."""
    with _LOCK:
        spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    if isinstance(name, str) and ":" in name:
        return _load(name)
    raise ValueError(f"unknown tool {name!r}; valid names: {', '.join(list_tools())} (or 'module.path:function')")


def argument_problem(spec: ToolSpec, arguments):
    """Why `arguments` do not fit `spec.schema` (None when they do): an object, every
    required key, no key outside ``properties`` (when the schema lists them), simple types."""
    if not isinstance(arguments, Mapping):
        return f"the arguments of {spec.name} must be a JSON object, got {type(arguments).__name__}"
    props = spec.schema.get("properties")
    missing = [k for k in spec.required if k not in arguments]
    if missing:
        return f"{spec.name} needs {', '.join(missing)}"
    if props is not None:
        unknown = [k for k in arguments if k not in props]
        if unknown:
            return f"{spec.name} takes no argument {', '.join(unknown)} (it takes {', '.join(props) or 'none'})"
        for key, value in arguments.items():
            expected = _JSON_TYPES.get((props.get(key) or {}).get("type"))
            if expected and (not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool)):
                return f"{spec.name}: {key} must be a {props[key]['type']}"
    return None


def _run_in_thread(fn, arguments, timeout_s):
    """The outcome of fn(**arguments) (``call_outcome``), or None when it did not return
    within timeout_s seconds."""
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("out", call_outcome(fn, arguments)), name="tool-call",
                              daemon=True)
    worker.start()
    worker.join(timeout_s)
    return box.get("out")


def call_tool(spec: ToolSpec, arguments, max_chars: int = 4096, timeout_s: Optional[float] = None,
              isolation: str = "thread") -> ToolResult:
    """Run `spec` on `arguments` (see the module docstring); never raises. `timeout_s` (None:
    ``tool_timeout_s`` of the run, else the tool's own) and the run's cap on concurrent calls
    come from ppo/agents/tool_limits.py."""
    start = time.perf_counter()

    def result(text, error=None):
        return ToolResult(text, error, (time.perf_counter() - start) * 1000.0)

    problem = argument_problem(spec, arguments)
    if problem:
        return result(f"Error: {problem}", "bad_arguments")
    limit = call_timeout(spec.timeout_s) if timeout_s is None else timeout_s
    if isolation not in ISOLATIONS:
        raise ValueError(f"tool_isolation must be one of {ISOLATIONS}, got {isolation!r}")
    with call_slot():
        start = time.perf_counter()  # a call's latency and timeout start once it holds a slot
        if isolation == "process":
            outcome = run_in_worker(spec.fn, dict(arguments), limit)
        elif is_async(spec.fn):
            outcome = run_async(spec.fn, dict(arguments), limit, call_outcome)
        else:
            outcome = _run_in_thread(spec.fn, dict(arguments), limit)
    if outcome is None:
        return result(f"Error: {spec.name} timed out after {limit:g} s", "timeout")
    kind, *rest = outcome
    if kind == "timeout":
        return result(f"Error: {spec.name} timed out: {rest[0]}", "timeout")
    if kind == "raised":
        return result(f"Error: {spec.name} raised {rest[0]}: {rest[1]}", "raised")
    if kind == "crashed":
        return result(f"Error: {spec.name} {rest[0]}", "crashed")
    text, error = rest
    if error:
        return result(f"Error: {spec.name} {text}", error)
    if len(text) > max_chars:
        return result(cut_with_notice(text, max_chars), "too_long")
    return result(text)
