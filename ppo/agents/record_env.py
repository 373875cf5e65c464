"""Per-record environments: a dataset record's own data and its own environment.

A record's fields beyond the prompt and answer (a Jsonfile record's other keys, e.g. test
cases, a database id, verl's ``extra_info`` / ``tools_kwargs``) reach ``env.reset(record)``
as they are, as verl's ``tools_kwargs`` reach its tools and rLLM's ``Env.from_dict`` reads its
``extra_info``. Two keys also choose how the environment is built (as SkyRL's ``env_class``):

- ``env_name``: the record's environment (a registered name or ``module.path:Class``) in place
  of the run's ``env_name``;
- ``env_kwargs``: a JSON object of constructor arguments for this record, over the run's
  ``env_kwargs`` when the record keeps the run's environment, alone when it names another.

:func:`record_environment_problems` checks every distinct (environment, arguments) pair of a
dataset at start-up, before any model loads.
"""
import inspect
import json
import logging
from typing import Any, Mapping

from .environment import environment_facts, environment_problems, make_environment

logger = logging.getLogger("ppo.agents")


def record_choice(args, record: Mapping[str, Any]):
    """`(env_name, kwargs)` of `record` under the run's `args` (module docstring); ValueError
    when the record's `env_name` / `env_kwargs` have the wrong type."""
    record = record if isinstance(record, Mapping) else {}
    name, kwargs = record.get("env_name") or args.env_name, record.get("env_kwargs") or {}
    if not isinstance(name, str):
        raise ValueError(f"a record's env_name must be a string, got {type(name).__name__} {name!r}")
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except ValueError as err:
            raise ValueError(f"a record's env_kwargs must be a JSON object, got {kwargs!r} ({err})") from None
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"a record's env_kwargs must be a JSON object, got {kwargs!r}")
    base = args.env_options if name == args.env_name else {}
    return name, {**base, **kwargs}


def rollout_record(src, label, extra=None):
    """The record a trajectory starts from (``env.reset``'s argument): the dataset item's own
    fields (`extra`), then its prompt `src` and answer `label` as ``src`` / ``tgt``."""
    return {**(extra or {}), "src": src, "tgt": label}


def record_environment(args, record):
    """A new environment for `record` (its own `env_name` / `env_kwargs`, else the run's)."""
    return make_environment(*record_choice(args, record))


def record_role(args, record):
    """The observation role (``"tool"`` / ``"user"``) of `record`'s environment."""
    return environment_facts(record_choice(args, record)[0]).observation_role


def build_environments(factory, records):
    """One environment per record from `factory` (called with the record, or with nothing when
    it takes no argument); when one fails to build, those already built are closed first."""
    takes_record = _takes_argument(factory)
    built = []
    try:
        for record in records:
            built.append(factory(record) if takes_record else factory())
    except BaseException:
        close_all(built)
        raise
    return built


def close_all(envs):
    """`close()` every environment that has one, each even when another raised; a close that
    raises is logged as a warning (never raised: it would hide the error that ended a rollout).
    Returns how many raised."""
    failed = 0
    for env in envs:
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception as err:  # noqa: BLE001 - the others still release what they hold
                failed += 1
                logger.warning("closing environment %s failed: %s: %s", type(env).__qualname__, type(err).__name__, err)
    return failed


def _takes_argument(fn):
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def record_environment_problems(args, dataset, what="train_datasets"):
    """Every distinct per-record environment choice of `dataset` (items with `extra`) that
    cannot be built, one message each naming the record (empty when all can)."""
    if not getattr(args, "env_name", "") or dataset is None:
        return []
    problems, seen = [], set()
    for index in range(len(dataset)):
        extra = dataset[index].get("extra") or {}
        if "env_name" not in extra and "env_kwargs" not in extra:
            continue
        try:
            name, kwargs = record_choice(args, extra)
        except ValueError as err:
            problems.append(f"{what} record {index}: {err}")
            continue
        key = (name, json.dumps(kwargs, sort_keys=True, default=str))
        if key in seen:
            continue
        seen.add(key)
        problems += [f"{what} record {index}: env_name {name}: {p}" for p in environment_problems(name, kwargs)]
    return problems
