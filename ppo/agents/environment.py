"""The environment registry: one entry per name, a class and its facts.

An environment is what a policy talks to during a multi-turn rollout, one instance per
trajectory, with two methods (the Gym shape, on text):

- ``reset(record) -> observation``: the first observation of an episode for one dataset
  record (a dict: ``src``, ``tgt`` and the record's other fields, ppo/agents/record_env.py):
  the user's message as a string, or a list of chat messages
  (``[{"role": "system", ...}, {"role": "user", ...}]``);
- ``step(action_text) -> (observation, reward, done, info)``: the policy's turn as text (up to
  and including the stop string that ended it); the observation that follows (a tool's answer,
  a user's next message, a list of messages -- ``{"role", "content"}`` dicts, one per tool call
  of the turn, in order -- or None when ``done``), the reward of that turn, whether the episode
  ended, and a dict of facts (``info["tool_calls"]``: one dict per call with ``name``,
  ``error``, ``timeout``, ``latency_ms``; ``info["role"]`` overrides the observation's role).

An environment may also have ``tools`` (JSON schemas of the functions the policy may call,
given to the chat template's tool slot), ``stop_strings`` (texts that end a policy turn besides
the stop tokens, e.g. ``</tool_call>``), ``close()`` and ``episode_reward()`` (the reward of
an episode the rollout cut at ``max_turns`` / ``max_total_len`` before ``done``). ``step`` runs in a worker thread of
the rollout (ppo/agents/rollout.py), one call at a time per instance.

:class:`EnvironmentFacts` say what callers need to know: the role of its observations
(``"tool"`` or ``"user"``) and the options its constructor takes (``env_kwargs``): its
``settings``, each declared once as a ``ppo.algos.Setting`` (name, type, default, help, valid
values), from which the options' defaults, the start-up check of ``env_kwargs`` (each key's name,
type and values, one line naming it, before any model loads) and the rows of docs/agents.md are
generated; the constructor's keywords must agree with them (checked when the class registers).
Environments are registered with ``@register_environment("name")`` or loaded from
``module.path:Class`` (a class its module registered with facts keeps them); callers read the
facts, never the name.
"""
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from ..common.plugins import import_plugin_module
from ..common.registry_settings import option_problems as declared_option_problems
from ..common.registry_settings import declared_settings, options_of, signature_problem

REQUIRED_METHODS = ("reset", "step")
OBSERVATION_ROLES = ("tool", "user")

_REGISTRY: Dict[str, type] = {}
_FACTS: Dict[str, "EnvironmentFacts"] = {}
_LOCK = threading.Lock()


class Environment:
    """Base class of the environments (see the module docstring); subclasses override
    ``reset`` and ``step`` and may set ``tools``."""

    tools: List[dict] = []
    stop_strings: List[str] = []

    def reset(self, record: Mapping[str, Any]):
        raise NotImplementedError

    def step(self, action_text: str):
        raise NotImplementedError

    def close(self):
        """Release what the episode holds (processes, files); called once after the episode."""


@dataclass(frozen=True)
class EnvironmentFacts:
    """What a registered environment gives and takes. `settings`: the constructor's options as
    `ppo.algos.Setting` declarations (`options`, name -> default, is derived from them; a plain
    `options` dict without declarations is still taken, and the signature alone checks it)."""

    summary: str
    observation_role: str = "tool"
    options: Mapping[str, Any] = field(default_factory=dict)
    startup_resets: int = 8
    """How many training prompts (the longest) the start-up check starts with ``reset`` to measure
    them (ppo/agents/prompt_room.py); 0 for an environment whose ``reset`` costs a session elsewhere."""

    settings: tuple = ()

    def __post_init__(self):
        _, declared = declared_settings(self.settings)
        if declared and self.options:
            raise ValueError(f"environment facts {self.summary!r}: give settings (declared) or options, not both")
        if declared:
            object.__setattr__(self, "settings", declared)
            object.__setattr__(self, "options", options_of(declared))
        if self.observation_role not in OBSERVATION_ROLES:
            raise ValueError(f"observation_role must be one of {OBSERVATION_ROLES}, got {self.observation_role!r}")


def register_environment(name: str, cls: Optional[type] = None, facts: Optional[EnvironmentFacts] = None):
    """Register ``cls`` (with its `facts`) as the environment ``name``; usable as a class decorator.

    The same class again under the same name is a no-op; a different class under a taken name
    raises ValueError; a class without ``reset``/``step`` raises TypeError. Returns the class.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"environment name must be a non-empty string, got {name!r}")

    def decorator(klass):
        problem = class_problem(name, klass)
        if not problem and facts is not None and facts.settings:
            problem = signature_problem(klass, facts.settings, f"environment {name!r}")
        if problem:
            raise TypeError(problem)
        with _LOCK:
            existing = _REGISTRY.get(name)
            if existing is not None and existing is not klass:
                raise ValueError(f"a different environment is already registered as {name!r}: {existing!r}")
            _REGISTRY[name] = klass
            if facts is not None:
                _FACTS[name] = facts
        return klass

    return decorator(cls) if cls is not None else decorator


def list_environments() -> List[str]:
    """Names of the registered environments, sorted."""
    with _LOCK:
        return sorted(_REGISTRY)


def environment_facts(name: str) -> EnvironmentFacts:
    """The facts of `name` (a plain tool-answer environment without options when none were given)."""
    get_environment(name)
    with _LOCK:
        return _FACTS.get(name) or EnvironmentFacts(summary=name)


def class_problem(name, klass):
    """Why `klass` cannot be the environment `name` (None when it can)."""
    if not inspect.isclass(klass):
        return f"environment {name!r} must be a class, got {type(klass).__name__}"
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(klass, m, None))
               or getattr(klass, m) is getattr(Environment, m)]
    if missing:
        return f"environment {name!r} ({klass.__module__}.{klass.__qualname__}) lacks {', '.join(missing)}(): " \
               "an environment needs reset(record) and step(action_text)"
    return None


def _load(spec):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"environment spec {spec!r} must look like 'module.path:Class'")
    module = import_plugin_module(module_name, f"environment {spec!r}")
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (environment {spec!r})")
        obj = getattr(obj, part)
    with _LOCK:  # registered by its module under a name with facts: the same facts here
        facts = next((_FACTS[n] for n, c in _REGISTRY.items() if c is obj and n in _FACTS), None)
    try:
        return register_environment(spec, obj, facts)
    except TypeError as err:
        raise ValueError(str(err)) from None


def get_environment(name: str) -> type:
    """The environment class registered as ``name``, or imported from ``module.path:Class``.

    Raises ValueError naming the valid choices when ``name`` is unknown, and when an imported
    class lacks ``reset``/``step``."""
    with _LOCK:
        cls = _REGISTRY.get(name)
    if cls is not None:
        return cls
    if isinstance(name, str) and ":" in name:
        return _load(name)
    raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(list_environments())} "
                     "(or 'module.path:Class' for your own)")


def option_problems(name, kwargs):
    """Why `kwargs` cannot build the environment `name`: one line per key its declared settings
    refuse (name, type, values), else what its constructor's signature refuses."""
    cls = get_environment(name)
    with _LOCK:
        facts = _FACTS.get(name)
    if facts is not None and facts.settings:
        problems = declared_option_problems(facts.settings, dict(kwargs or {}), "env_kwargs")
        if problems:
            return problems
    try:
        inspect.signature(cls).bind(**dict(kwargs or {}))
    except TypeError as err:
        return [f"env_kwargs {dict(kwargs or {})} do not fit environment {name!r}: {err}"]
    except ValueError:  # a signature inspect cannot read (a C type): the constructor will tell
        return []
    return []


def environment_problems(name, kwargs=None, construct=True):
    """Every reason why the environment `name` with `kwargs` cannot be built (an empty list
    when it can): unknown name, an import that fails, a class without reset/step, options its
    constructor does not take, and (`construct`) a constructor that raises on them (e.g. a tool
    that does not exist), the instance closed again. Run before any model loads."""
    try:
        cls = get_environment(name)
    except ValueError as err:
        return [str(err)]
    problems = option_problems(name, kwargs)
    if problems or not construct:
        return problems
    try:
        env = cls(**dict(kwargs or {}))
    except Exception as err:  # noqa: BLE001 - the user's constructor: any failure is the problem to report
        return [f"environment {name!r} could not be built with env_kwargs {dict(kwargs or {})}: "
                f"{type(err).__name__}: {err}"]
    close = getattr(env, "close", None)
    if callable(close):
        close()
    return []


def make_environment(name: str, kwargs: Optional[Mapping[str, Any]] = None) -> Environment:
    """A new instance of the environment `name` built with `kwargs`."""
    problems = environment_problems(name, kwargs, construct=False)
    if problems:
        raise ValueError("; ".join(problems))
    return get_environment(name)(**dict(kwargs or {}))


def environment_settings_table():
    """The Markdown rows of every declared setting (`env_kwargs` key) of every environment this
    package registers (name, type, default, values, help), generated from its declarations."""
    from ..common.registry_settings import settings_rows

    with _LOCK:
        entries = [(name, _FACTS[name].settings) for name in sorted(_FACTS)
                   if _REGISTRY[name].__module__.startswith("ppo.") and ":" not in name]
    return settings_rows(entries, "environment")
