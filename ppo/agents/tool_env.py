"""``tools``: the tool-calling environment (registered on import).

    env = ToolEnvironment(tools=["calculator", "search"], tool_options={"search": {"corpus": "docs.jsonl"}})
    first = env.reset({"src": "What is 123*456?"})      # the user's message
    obs, reward, done, info = env.step('<tool_call>calculator 123*456</tool_call>')  # "56088"

Each policy turn is read with :func:`ppo.agents.tool_calls.parse_tool_call`: a turn without a
call ends the episode (its final answer; reward 0 here, the run's scorers rate the answer); a
call runs its tool (``call_tool``: schema check, the tool's timeout, answers longer than
``max_output_chars`` cut) and its answer is the observation. A malformed call, an unknown tool,
a tool that raises, times out or prints too much gives an observation that starts with
"Error:" and the episode goes on. ``info["tool_calls"]`` describes the call for the rollout's
counts (``tool/<name>/errors``, ``timeouts``, ``latency_ms``; ``detail``: the error the policy
read). Turns end at ``</tool_call>`` (``stop_strings``). ``tool_isolation``: "thread" runs the
tools in this process, "process" in worker processes (ppo/agents/tool_worker.py: a tool that
hangs is killed at its timeout, one that ends its process does not end the trainer).
"""
import pickle
from typing import Any, Mapping, Optional, Sequence

from .environment import Environment, EnvironmentFacts, register_environment
from .tool_calls import CALL_CLOSE, parse_tool_call
from .tool_state import ToolStates, class_schema, stateful_tool_class
from .tools import ISOLATIONS, call_tool, get_tool

PROMPT_KEYS = ("src", "prompt", "input", "question", "query")


def record_prompt(record: Mapping[str, Any], prompt_key: Optional[str] = None) -> str:
    """The user's message of a dataset record: ``record[prompt_key]``, else the first of
    PROMPT_KEYS it has (the last turn when it holds a list of turns)."""
    if isinstance(record, str):
        return record
    keys = [prompt_key] if prompt_key else [k for k in PROMPT_KEYS if k in record]
    if not keys or keys[0] not in record:
        raise ValueError(f"the record has no prompt field ({prompt_key or ' / '.join(PROMPT_KEYS)}): {sorted(record)}")
    value = record[keys[0]]
    return str(value[-1] if isinstance(value, (list, tuple)) else value)


@register_environment("tools", facts=EnvironmentFacts(
    summary="the policy calls registered tools inside <tool_call></tool_call>; a turn without a call ends the episode",
    observation_role="tool",
    options={"tools": ["calculator"], "tool_options": {}, "max_output_chars": 4096, "prompt_key": None,
             "system_prompt": None, "tool_isolation": "thread"}))
class ToolEnvironment(Environment):
    """See the module docstring. ``tools``: names (or ``module.path:function``) of the tools the
    policy may call; ``tool_options``: per tool name, its options (e.g. search's corpus);
    ``system_prompt``: a system message put before the user's (None: none); ``tool_isolation``:
    "thread" or "process" (module docstring). A ``module.path:Class`` of a ``StatefulTool``
    in ``tools`` lives one trajectory (ppo/agents/tool_state.py): created at ``reset``, its
    ``reward()`` the reward of the episode's end, released at ``close``."""

    stop_strings = [CALL_CLOSE]

    def __init__(self, tools: Sequence[str] = ("calculator",), tool_options: Optional[Mapping[str, Mapping]] = None,
                 max_output_chars: int = 4096, prompt_key: Optional[str] = None, system_prompt: Optional[str] = None,
                 tool_isolation: str = "thread"):
        if tool_isolation not in ISOLATIONS:
            raise ValueError(f"tool_isolation must be one of {ISOLATIONS}, got {tool_isolation!r}")
        tool_options = dict(tool_options or {})
        unknown = sorted(set(tool_options) - set(tools))
        if unknown:
            raise ValueError(f"tool_options for tools that are not listed in tools: {unknown}")
        self.specs, stateful, schemas = {}, {}, []
        for name in tools:
            cls = stateful_tool_class(name)  # a StatefulTool: one instance per trajectory (tool_state.py)
            if cls is not None:
                stateful[class_schema(cls)[0]] = (cls, tool_options.get(name))
                schemas.append(ToolStates({name: (cls, None)}).specs()[0].function_schema())
                continue
            spec = get_tool(name).with_options(tool_options.get(name))
            self.specs[spec.name] = spec
            schemas.append(spec.function_schema())
            if tool_isolation == "process":
                _check_picklable(spec)
        if stateful and tool_isolation == "process":
            raise ValueError(f"stateful tools ({', '.join(stateful)}) keep their state in this process: use "
                             "tool_isolation thread")
        self.states = ToolStates(stateful)
        self.tool_isolation = tool_isolation
        self.tools = schemas
        self.max_output_chars = int(max_output_chars)
        self.prompt_key = prompt_key
        self.system_prompt = system_prompt

    def reset(self, record):
        self.specs.update(self.states.create(record))  # the stateful tools' instances for this trajectory
        user = {"role": "user", "content": record_prompt(record, self.prompt_key)}
        return [{"role": "system", "content": self.system_prompt}, user] if self.system_prompt else [user]

    def step(self, action_text):
        call, problem = parse_tool_call(action_text, self.specs)
        if call is None and problem is None:  # the final answer: the stateful tools' reward
            return None, self.states.reward(), True, {"tool_calls": []}
        if problem is not None:
            entry = {"name": None, "error": problem.kind, "timeout": False, "latency_ms": 0.0,
                     "detail": problem.message[:200]}
            return problem.message, 0.0, False, {"tool_calls": [entry]}
        result = call_tool(self.specs[call.name], call.arguments, self.max_output_chars, isolation=self.tool_isolation)
        entry = {"name": call.name, "error": result.error, "timeout": result.error == "timeout",
                 "latency_ms": result.latency_ms}
        if result.error:
            entry["detail"] = result.text[:200]
        return result.text, 0.0, False, {"tool_calls": [entry]}

    def episode_reward(self):
        """The stateful tools' reward of an episode the rollout cut before its final answer."""
        return self.states.reward()

    def close(self):
        """Release the stateful tools' instances (once; also after an error or a timeout)."""
        self.states.release()


def _check_picklable(spec):
    """ValueError when `spec`'s function cannot travel to a worker process (a lambda, a closure)."""
    try:
        pickle.dumps(spec.fn)
    except Exception as err:  # noqa: BLE001 - pickle raises several types
        raise ValueError(f"tool {spec.name!r} cannot run with tool_isolation process: its function must be "
                         f"importable by name from a module ({type(err).__name__}: {err})") from None
