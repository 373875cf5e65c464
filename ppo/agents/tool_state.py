"""Stateful tools: one instance per trajectory, with a life (create, call, reward, release).

    class Scratch(StatefulTool):
        name, description = "note", "append a line to this episode's scratch file"
        def create(self, record, **create_kwargs): self.path = tempfile.mkstemp()[1]
        def call(self, line): open(self.path, "a").write(line + "\\n"); return "ok"
        def reward(self): return float(open(self.path).read().count("\\n") == 2)
        def release(self): os.remove(self.path)

    env_kwargs {"tools": ["calculator", "my_pkg.tools:Scratch"], "tool_options": {"note": {...}}}

The shape of verl's ``BaseTool`` (verl/tools/base_tool.py: ``create(instance_id, **kwargs)``,
``execute(instance_id, parameters)``, ``calc_reward(instance_id)``, ``release(instance_id)``),
with one Python object per trajectory in place of instance ids. In the ``tools`` environment
(ppo/agents/tool_env.py), for each trajectory:

- the class is built with the tool's ``tool_options`` (once per trajectory), and ``create(record,
  **create_kwargs)`` runs at ``env.reset``: ``record`` is the dataset record (with its own
  fields, ppo/agents/record_env.py); ``create_kwargs`` are verl's per-record
  ``tools_kwargs[<name>]["create_kwargs"]`` (read from the record or its ``extra_info``);
- ``call(**arguments) -> str`` runs each call of the policy like a function tool (schema check
  against ``parameters``, ``timeout_s``, ``max_output_chars``; in the rollout's thread, so
  ``tool_isolation`` must be "thread");
- ``reward() -> float`` is read when the episode ends (the turn without a call, or the rollout
  cutting it at ``max_turns`` / ``max_total_len``): the sum over the trajectory's stateful tools
  is the environment's reward of that turn (ppo/trainer/env_reward.py says how it meets the
  scorers'); a reward that raises is counted as an environment error and gives 0;
- ``release()`` runs exactly once when the environment closes, after an error or a timeout
  too (the rollout closes every environment in a ``finally``).
"""
import importlib
import inspect
from typing import Any, Dict, List, Mapping, Optional

from ..common.plugins import describe_import_error
from .tools import DEFAULT_TIMEOUT_S, ToolSpec, signature_schema


class StatefulTool:
    """Base class of the stateful tools (see the module docstring). Class attributes: ``name``,
    ``description``, ``parameters`` (a JSON-schema object; None: from ``call``'s signature, string
    arguments) and ``timeout_s``; the constructor takes the tool's ``tool_options``."""

    name: str = ""
    description: str = ""
    parameters: Optional[Mapping[str, Any]] = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    def create(self, record: Mapping[str, Any], **create_kwargs):
        """Set up this trajectory's state (a sandbox, a session, a file)."""

    def call(self, **arguments) -> str:
        raise NotImplementedError

    def reward(self) -> float:
        """The trajectory's reward from this tool's state at the end of the episode."""
        return 0.0

    def release(self):
        """Free what `create` and the calls took; runs once, also after errors and timeouts."""


def stateful_tool_class(name: str):
    """The `StatefulTool` subclass that ``module.path:Class`` names, or None when `name` is not
    one (a registered function tool, or a ``module.path:function``)."""
    if not isinstance(name, str) or ":" not in name:
        return None
    module_name, _, attr = name.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr, None)
    except ImportError:
        return None  # the function-tool path reports the import error
    except Exception as err:  # noqa: BLE001 - the user's module failed at import: one message naming it
        raise ValueError(f"cannot import module {module_name!r} for tool {name!r}: {describe_import_error(err)}") from None
    return obj if inspect.isclass(obj) and issubclass(obj, StatefulTool) else None


def class_schema(cls):
    """`ToolSpec`-style `(name, schema, description)` of a stateful tool class; ValueError when it
    has no name."""
    if not isinstance(cls.name, str) or not cls.name or any(c.isspace() for c in cls.name):
        raise ValueError(f"stateful tool {cls.__qualname__} needs a class attribute name (no spaces), got {cls.name!r}")
    if cls.parameters is not None:
        schema = dict(cls.parameters)
    else:
        schema = signature_schema(cls.call)  # of the unbound method: without its self
        schema = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "self"},
                  "required": [k for k in schema["required"] if k != "self"]}
    return cls.name, schema, cls.description or (inspect.getdoc(cls) or "").split("\n")[0]


def create_kwargs(record, tool_name):
    """verl's per-record ``tools_kwargs[tool_name]["create_kwargs"]`` (in the record or its
    ``extra_info``), {} when absent."""
    record = record if isinstance(record, Mapping) else {}
    holder = record.get("tools_kwargs") or (record.get("extra_info") or {}).get("tools_kwargs") or {}
    kwargs = (holder.get(tool_name) or {}).get("create_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"tools_kwargs[{tool_name!r}]['create_kwargs'] must be an object, got {kwargs!r}")
    return dict(kwargs)


class ToolStates:
    """The stateful tools of one environment: their classes (`classes`: name -> (class, options)),
    and per trajectory their instances (`create`), rewards (`reward`) and release (`release`)."""

    def __init__(self, classes: Mapping[str, tuple]):
        self.classes = dict(classes)
        self.instances: Dict[str, StatefulTool] = {}
        self.rewarded = False

    def specs(self) -> List[ToolSpec]:
        """One ToolSpec per stateful tool, for the chat template's tool slot (no instance yet)."""
        return [ToolSpec(*_spec_fields(cls)) for cls, _ in self.classes.values()]

    def create(self, record) -> Dict[str, ToolSpec]:
        """Build and create every stateful tool for the trajectory of `record` (releasing the
        previous episode's first); returns their callable specs by name."""
        self.release()
        specs = {}
        for name, (cls, options) in self.classes.items():
            tool = cls(**dict(options or {}))
            self.instances[name] = tool
            tool.create(record, **create_kwargs(record, name))
            tool_name, _, schema, description, timeout_s = _spec_fields(cls)
            specs[name] = ToolSpec(tool_name, tool.call, schema, description, timeout_s)
        self.rewarded = False
        return specs

    def reward(self) -> float:
        """The sum of the tools' rewards, read once per episode (0.0 after the first read)."""
        if self.rewarded:
            return 0.0
        self.rewarded = True
        return float(sum(float(tool.reward()) for tool in self.instances.values()))

    def release(self):
        """`release()` every instance once (each runs even when another raises; the first error
        is raised after all ran)."""
        instances, self.instances, first = list(self.instances.values()), {}, None
        for tool in instances:
            try:
                tool.release()
            except Exception as err:  # noqa: BLE001 - the others still release
                first = first or err
        if first is not None:
            raise first


def _spec_fields(cls):
    name, schema, description = class_schema(cls)
    return name, None, schema, description, float(cls.timeout_s)
