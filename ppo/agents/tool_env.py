"""``tools``: the tool-calling environment (registered on import).

    env = ToolEnvironment(tools=["calculator", "search"], tool_options={"search": {"corpus": "docs.jsonl"}})
    first = env.reset({"src": "What is 123*456?"})      # the user's message
    obs, reward, done, info = env.step('<tool_call>calculator 123*456</tool_call>')  # "56088"

Each policy turn is read by the parser of ``call_format`` (ppo/agents/call_formats.py:
``hermes`` by default, ``qwen3``, ``qwen3_coder``, ``llama3_json``, ``json_list``): a turn
without a call ends the episode (its final answer; reward 0 here, the run's scorers rate the
answer); every call of the turn runs its tool (ppo/agents/tool_runs.py, ``call_tool``: schema
check, the timeout, answers longer than ``max_output_chars`` cut) and each answer is its own
tool message, in the order written (one call: the observation is its text; several: a list of
``{"role": "tool", "content": ...}`` messages). A malformed call, an unknown tool, a call past
``max_calls_per_turn``, a tool that raises, times out or prints too much gives an answer that
starts with "Error:" and the episode goes on. ``info["tool_calls"]`` describes each call for the
rollout's counts (``tool/<name>/errors``, ``timeouts``, ``latency_ms``; ``detail``: the error
the policy read).

Where a turn stops: with ``max_calls_per_turn`` 1 (the default) at the format's ``call_close``
(``</tool_call>``, ``stop_strings``), so the turn holds one call; with more, a turn ends where
the model ends it (its end-of-turn / EOS token, or ``max_new_tokens``), so that it can write
several calls (``llama3_json`` and ``json_list`` have no closing text: turns end there always).
``concurrent_calls``: the calls of one turn run at once (else one after the other).
``tool_isolation``: "thread" runs the tools in this process, "process" in worker processes
(ppo/agents/tool_worker.py: a tool that hangs is killed at its timeout, one that ends its
process does not end the trainer). ``tool_config``: a JSON/YAML file of tools
(ppo/agents/tool_config.py), added to ``tools`` (which then defaults to none).
"""
import pickle
from typing import Any, Mapping, Optional, Sequence

from ..common.registry_settings import Setting, checked_values
from .environment import Environment, EnvironmentFacts, register_environment
from .call_formats import call_format_facts, get_call_format
from .tool_config import load_tool_config
from .tool_runs import run_turn_calls
from .tool_state import ToolStates, class_schema, stateful_tool_class
from .tools import ISOLATIONS, get_tool

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


def _call_format_problem(name):
    try:
        call_format_facts(name)
    except ValueError as err:
        return str(err)
    return None


SETTINGS = (
    Setting("tools", list, None, "Names (or module.path:function, module.path:Class of a StatefulTool) of the tools the "
            "policy may call; None: calculator, or none with tool_config."),
    Setting("tool_options", dict, None, "Per tool name, its options (e.g. {\"search\": {\"corpus\": \"docs.jsonl\"}}).",
            optional=True),
    Setting("max_output_chars", int, 4096, "Most characters of one tool answer; longer ones are cut.",
            bounds=(1, True, None, False)),
    Setting("prompt_key", str, None, "The record's field holding the user's message (None: the first of src, prompt, "
            "input, question, query)."),
    Setting("system_prompt", str, None, "A system message put before the user's (None: none)."),
    Setting("tool_isolation", str, "thread", "thread: the tools run in this process; process: in worker processes.",
            choices=ISOLATIONS),
    Setting("call_format", str, "hermes", "The parser of a turn's tool calls (ppo/agents/call_formats.py) or "
            "module.path:function.", check=_call_format_problem),
    Setting("max_calls_per_turn", int, 1, "Most tool calls of one turn (1: the turn stops at the format's closing "
            "text).", bounds=(1, True, None, False)),
    Setting("concurrent_calls", bool, True, "The calls of one turn run at once (false: one after the other)."),
    Setting("tool_config", str, None, "A JSON/YAML file of tools (ppo/agents/tool_config.py), added to tools."),
)


@register_environment("tools", facts=EnvironmentFacts(
    summary="the policy calls registered tools inside <tool_call></tool_call>; a turn without a call ends the episode",
    observation_role="tool", settings=SETTINGS))
class ToolEnvironment(Environment):
    """See the module docstring. ``tools``: names (or ``module.path:function``) of the tools the
    policy may call; ``tool_options``: per tool name, its options (e.g. search's corpus);
    ``system_prompt``: a system message put before the user's (None: none); ``tool_isolation``:
    "thread" or "process" (module docstring). A ``module.path:Class`` of a ``StatefulTool``
    in ``tools`` lives one trajectory (ppo/agents/tool_state.py): created at ``reset``, its
    ``reward()`` the reward of the episode's end, released at ``close``."""

    def __init__(self, tools: Optional[Sequence[str]] = None, tool_options: Optional[Mapping[str, Mapping]] = None,
                 max_output_chars: int = 4096, prompt_key: Optional[str] = None, system_prompt: Optional[str] = None,
                 tool_isolation: str = "thread", call_format: str = "hermes", max_calls_per_turn: int = 1,
                 concurrent_calls: bool = True, tool_config: Optional[str] = None):
        checked_values(SETTINGS, tool_isolation=tool_isolation, max_calls_per_turn=max_calls_per_turn)
        tools = list(tools) if tools is not None else ([] if tool_config else ["calculator"])
        tool_options = dict(tool_options or {})
        unknown = sorted(set(tool_options) - set(tools))
        if unknown:
            raise ValueError(f"tool_options for tools that are not listed in tools: {unknown}")
        self.specs, stateful, schemas = {}, {}, []
        specs = []
        for name in tools:
            cls = stateful_tool_class(name)  # a StatefulTool: one instance per trajectory (tool_state.py)
            if cls is not None:
                stateful[class_schema(cls)[0]] = (cls, tool_options.get(name))
                schemas.append(ToolStates({name: (cls, None)}).specs()[0].function_schema())
            else:
                specs.append(get_tool(name).with_options(tool_options.get(name)))
        for spec in specs + (load_tool_config(tool_config) if tool_config else []):
            if spec.name in self.specs or spec.name in stateful:
                raise ValueError(f"tool {spec.name!r} is given twice (tools and tool_config)")
            self.specs[spec.name] = spec
            schemas.append(spec.function_schema())
            if tool_isolation == "process":
                _check_picklable(spec)
        if stateful and tool_isolation == "process":
            raise ValueError(f"stateful tools ({', '.join(stateful)}) keep their state in this process: use "
                             "tool_isolation thread")
        self.states = ToolStates(stateful)
        self.parse_calls, close = get_call_format(call_format), call_format_facts(call_format).call_close
        self.max_calls_per_turn, self.concurrent_calls = max_calls_per_turn, bool(concurrent_calls)
        self._stop_strings = [close] if close and max_calls_per_turn == 1 else []
        self.tool_isolation = tool_isolation
        self.tools = schemas
        self.max_output_chars = int(max_output_chars)
        self.prompt_key = prompt_key
        self.system_prompt = system_prompt

    @property
    def stop_strings(self):
        """The format's ``call_close`` when a turn holds one call, else none (module docstring)."""
        return self._stop_strings

    def reset(self, record):
        self.specs.update(self.states.create(record))  # the stateful tools' instances for this trajectory
        user = {"role": "user", "content": record_prompt(record, self.prompt_key)}
        return [{"role": "system", "content": self.system_prompt}, user] if self.system_prompt else [user]

    def step(self, action_text):
        items = self.parse_calls(action_text, self.specs)
        if not items:
            return None, self.states.reward(), True, {"tool_calls": []}  # the final answer
        answers, entries = run_turn_calls(items, self.specs, self.max_output_chars, self.tool_isolation,
                                          self.max_calls_per_turn, self.concurrent_calls)
        observation = answers[0] if len(answers) == 1 else [{"role": "tool", "content": a} for a in answers]
        return observation, 0.0, False, {"tool_calls": entries}

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
