"""The scorer registry: one entry per name, a pure function and its facts.

A scorer is a PURE function ``score(src: str, tgt: str, response: str) -> float`` (decoded
prompt, the prompt's label, decoded completion; see ``ppo/scorers/``). Its
:class:`ScorerFacts` say what callers need to know without reading its code: the values it
gives, what the label must hold, when it gives its lowest value (a wrong or unreadable answer:
a legitimate score) and when it raises (the reward cannot be computed), the score at which an
answer counts as correct (pass@k, maj@k), and its options: `settings`, each declared once as a
``ppo.algos.Setting``, from which the defaults, the check of a given option (one line naming it)
and the rows of docs/verifiers.md come; the build function's keywords must agree with them.

A scorer may also carry ``extract_answer(src, response) -> str | None``, the answer it read
(majority votes compare those), and ``score_batch(src, tgt, response) -> list`` to score a whole
batch in one call (a model-based judge: one forward for all items); `WeightedScorer` uses it when
present. Callers read the facts and attributes, never the name.

The built-in entries live in ``ppo/verifiers/`` (and the model judge in ``ppo/judge/scorer.py``);
they register themselves here when their package is imported, which ``ppo.scorers`` (the
scorers' public module) does.
"""
import importlib
import importlib.util
import json
import math
import numbers
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..common.plugins import import_plugin_module
from ..common.registry_settings import declared_settings, option_problems, options_of, signature_problem

Scorer = Callable[[str, str, str], float]

_REGISTRY: Dict[str, Scorer] = {}
_FACTS: Dict[str, "ScorerFacts"] = {}
_REGISTRY_LOCK = threading.Lock()


@dataclass(frozen=True)
class ScorerFacts:
    """What a registered scorer gives, needs and takes (see the module docstring). `settings`: the
    options of `build` as `ppo.algos.Setting`s (`options`, name -> default, comes from them; a
    plain `options` dict without declarations is still taken, its values unchecked)."""

    summary: str
    values: str = "a finite number"
    label: str = "-"
    lowest_when: str = ""
    raises_when: str = "never"
    correct_at: Optional[float] = None
    options: Mapping[str, Any] = field(default_factory=dict)
    build: Optional[Callable[..., Scorer]] = None
    check: Optional[Callable[..., List[str]]] = None
    """`check(**options) -> problems` (every option given, defaults filled in): what `build` would
    fail on, found without building (a model directory that is not there, a template unknown), so
    that a run refuses it before any model loads."""

    settings: tuple = ()

    def __post_init__(self):
        _, declared = declared_settings(self.settings)
        if declared and self.options:
            raise ValueError(f"scorer facts {self.summary!r}: give settings (declared) or options, not both")
        if declared:
            object.__setattr__(self, "settings", declared)
            object.__setattr__(self, "options", options_of(declared))
        if self.options and self.build is None:
            raise ValueError(f"scorer facts {self.summary!r}: options need a build function")
        problem = signature_problem(self.build, declared, f"scorer facts {self.summary!r}") if declared else None
        if problem:
            raise ValueError(problem)


def register_scorer(name: str, fn: Optional[Scorer] = None, facts: Optional[ScorerFacts] = None):
    """Register ``fn`` (with its `facts`) as the scorer called ``name``; usable as a decorator.

    ``@register_scorer("mine")`` above a function, or ``register_scorer("mine", fn)``.
    Registering the same function again under the same name is a no-op (so a module imported
    twice does not fail); a different function under a taken name raises ValueError. Returns
    the function unchanged.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"scorer name must be a non-empty string, got {name!r}")

    def decorator(func: Scorer) -> Scorer:
        if not callable(func):
            raise TypeError(f"scorer {name!r} must be callable, got {type(func).__name__}")
        with _REGISTRY_LOCK:
            existing = _REGISTRY.get(name)
            if existing is not None and existing is not func:
                raise ValueError(f"a different scorer is already registered as {name!r}: {existing!r}")
            _REGISTRY[name] = func
            if facts is not None:
                _FACTS[name] = facts
        return func

    if fn is not None:
        return decorator(fn)
    return decorator


def list_scorers() -> List[str]:
    """Names of the registered scorers, sorted."""
    with _REGISTRY_LOCK:
        return sorted(_REGISTRY)


def scorer_facts(name: str) -> Optional[ScorerFacts]:
    """The facts registered with `name` (None for a scorer registered without them)."""
    with _REGISTRY_LOCK:
        return _FACTS.get(name)


def import_scorer_module(module_name):
    """The module `module_name`: importable as it is, or a file of that name (`my_rewards.py`,
    `pkg/my_rewards.py` for `pkg.my_rewards`) in the directory the process started from."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        path = os.path.join(os.getcwd(), *module_name.split(".")) + ".py"
        if err.name != module_name.split(".")[0] or not os.path.isfile(path):
            raise
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]  # as the import system does: no half-run module stays behind
        raise
    return module


def load_scorer(spec: str) -> Scorer:
    """Import ``module.path:function``, register it under ``spec`` and return it."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"scorer spec {spec!r} must look like 'module.path:function'")
    module = import_plugin_module(module_name, f"scorer {spec!r}", import_scorer_module)
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (scorer {spec!r})") from None
    if not callable(obj):
        raise ValueError(f"scorer {spec!r} is not callable (got {type(obj).__name__})")
    with _REGISTRY_LOCK:  # registered by its module under a name with facts: the same facts here
        facts = next((_FACTS[n] for n, f in _REGISTRY.items() if f is obj and n in _FACTS), None)
    return register_scorer(spec, obj, facts)


def get_scorer(name: str) -> Scorer:
    """The scorer registered as ``name``, or imported from ``module.path:function``.

    Raises ValueError naming the valid choices when ``name`` is unknown.
    """
    with _REGISTRY_LOCK:
        fn = _REGISTRY.get(name)
    if fn is not None:
        return fn
    if isinstance(name, str) and ":" in name:
        return load_scorer(name)
    raise ValueError(f"unknown scorer {name!r}; valid names: {', '.join(list_scorers())} "
                     "(or 'module.path:function' for your own)")


def option_problem(name, options):
    """Why `options` cannot configure the scorer `name`, in one line (None when they can or a
    registered name is unknown). A `module.path:function` is imported first (ValueError when it
    cannot be); declared settings check each option's name, type and values."""
    if not options:
        return None
    if isinstance(name, str) and ":" in name:
        get_scorer(name)
    facts = scorer_facts(name)
    if facts is None or not facts.options:
        return f"scorer {name!r} takes no options, got {sorted(options)}"
    if facts.settings:
        return "; ".join(option_problems(facts.settings, options, f"scorer {name!r}")) or None
    unknown = sorted(set(options) - set(facts.options))
    if unknown:
        return f"scorer {name!r} has no option {', '.join(map(repr, unknown))}; its options: {', '.join(facts.options)}"
    return None


def build_scorer(name: str, options: Optional[Mapping[str, Any]] = None) -> Scorer:
    """The scorer `name`, configured with `options` (its facts' build function) when given."""
    if not options:
        return get_scorer(name)
    get_scorer(name)
    problem = option_problem(name, options)
    if problem:
        raise ValueError(problem)
    facts = scorer_facts(name)
    return facts.build(**{**facts.options, **options})


class ScorerError(ValueError):
    """A scorer raised, or returned a non-finite / non-number value, on one item."""

    def __init__(self, message, scorer_name, item, bad_value=False):
        super().__init__(message)
        self.scorer_name, self.item, self.bad_value = scorer_name, item, bad_value


def is_real_number(value):
    """True for int/float and numpy integer/floating scalars (anything `numbers.Real`), not bools."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class ScorerEntry:
    """One scorer of a weighted combination: its name, weight and options."""

    name: str
    weight: float
    options: Mapping[str, Any]


def _weight(name, w):
    try:
        value = float(w)
    except (TypeError, ValueError):
        raise ValueError(f"weight {w!r} of scorer {name!r} is not a number") from None
    if isinstance(w, bool) or not math.isfinite(value):
        raise ValueError(f"weight {w!r} of scorer {name!r} is not a finite number")
    return value


def _mapping_entries(mapping):
    """`{"math_boxed": 1.0, "format": {"weight": 0.2, "answer_tag": "solution"}}` -> entries."""
    entries = []
    for name, value in mapping.items():
        if isinstance(value, Mapping):
            options = {k: v for k, v in value.items() if k != "weight"}
            entries.append(ScorerEntry(str(name).strip(), _weight(name, value.get("weight", 1.0)), options))
        else:
            entries.append(ScorerEntry(str(name).strip(), _weight(name, value), {}))
    return entries


def _as_mapping(scorers):
    """The mapping form of `scorers` (a dict, or a string holding a JSON object), else None."""
    if isinstance(scorers, Mapping):
        return scorers
    if isinstance(scorers, str) and scorers.strip().startswith("{"):
        try:
            value = json.loads(scorers)
        except ValueError as err:
            raise ValueError(f"scorer spec {scorers!r} starts with '{{' but is not a JSON object: {err}") from None
        if not isinstance(value, dict):
            raise ValueError(f"scorer spec {scorers!r} must be a JSON object of name -> weight")
        return value
    return None


def parse_scorer_spec(scorers, weights=None) -> List[ScorerEntry]:
    """The scorers of a weighted combination, in order, with their weights and options.

    Two forms: names ``"kk,math"`` (or a list) with weights ``"1,0.5"`` (or a list; 1 each by
    default), or a mapping name -> weight, or name -> ``{"weight": w, option: value, ...}``
    (a dict, or that JSON object as a string, as an argument file gives it), with no separate
    weights. An empty or repeated name, a weight count that differs from the names', a weight
    that is no finite number, and options a registered scorer does not take raise ValueError.
    """
    mapping = _as_mapping(scorers)
    if mapping is not None:
        if weights not in (None, "", []):
            raise ValueError("give weights inside the scorer mapping, not as a separate list")
        entries = _mapping_entries(mapping)
    else:
        names = [n.strip() for n in scorers.split(",")] if isinstance(scorers, str) else [str(n).strip() for n in scorers]
        if weights is None or (isinstance(weights, str) and not weights.strip()) or (not isinstance(weights, str) and not weights):
            raw = [1.0] * len(names)
        else:
            raw = weights.split(",") if isinstance(weights, str) else list(weights)
            if len(raw) != len(names):
                raise ValueError(f"{len(raw)} weights ({weights!r}) for {len(names)} scorers ({', '.join(names)}); "
                                 "give one per scorer")
        entries = [ScorerEntry(n, _weight(n, w), {}) if n else ScorerEntry(n, 0.0, {}) for n, w in zip(names, raw)]
    names = [e.name for e in entries]
    if not names or any(not n for n in names):
        raise ValueError(f"scorer list {scorers!r} has an empty name; write names separated by commas, e.g. 'kk,math'")
    if len(set(names)) != len(names):
        raise ValueError(f"scorer list {scorers!r} names a scorer twice")
    for e in entries:
        problem = option_problem(e.name, e.options)
        if problem:
            raise ValueError(problem)
        facts = scorer_facts(e.name)
        found = facts.check(**{**facts.options, **e.options}) if facts is not None and facts.check else []
        if found:
            raise ValueError(f"scorer {e.name!r}: " + "; ".join(found))
    return entries


def parse_scorer_list(scorers, weights=None):
    """``"kk,math"``, ``"1,0.5"`` -> ``(["kk", "math"], [1.0, 0.5])``; any form of
    :func:`parse_scorer_spec` (options are checked, then left out of the answer)."""
    entries = parse_scorer_spec(scorers, weights)
    return [e.name for e in entries], [e.weight for e in entries]


class WeightedScorer:
    """Scorers with weights: the total of an item is ``sum_k w_k * score_k``.

    ``WeightedScorer("reverse")``, ``WeightedScorer("kk,math", "1,0.5")``, with lists, or a
    mapping ``{"math_boxed": 1.0, "format": {"weight": 0.2, "allow_outside": true}}`` (see
    :func:`parse_scorer_spec`). Unknown names or options raise ValueError at construction.
    """

    def __init__(self, names, weights=None):
        self.entries = parse_scorer_spec(names, weights)
        self.names = [e.name for e in self.entries]
        self.weights = [e.weight for e in self.entries]
        self.functions = [build_scorer(e.name, e.options) for e in self.entries]
        self.facts = [scorer_facts(e.name) for e in self.entries]

    @property
    def spec(self):
        return ",".join(self.names)

    def score_batch(self, src, tgt, response):
        """Score every item with every scorer.

        Returns ``(totals, per_function)``: ``totals`` a list of floats (one per item),
        ``per_function`` a dict name -> list of that scorer's raw scores. Raises
        :class:`ScorerError` naming the scorer and item on the first failure.
        """
        if not len(src) == len(tgt) == len(response):
            raise ValueError(f"src, tgt and response have {len(src)}, {len(tgt)}, {len(response)} items; they must match")
        per_function = {n: [] for n in self.names}
        totals = []
        batched = self._batched_scores(src, tgt, response)
        for i, (s, t, r) in enumerate(zip(src, tgt, response)):
            total = 0.0
            for name, fn, w in zip(self.names, self.functions, self.weights):
                try:
                    value = batched[name][i] if name in batched else fn(s, t, r)
                except Exception as err:  # the scorer's bug or a broken label: report, never guess
                    raise ScorerError(
                        f"scorer '{name}' raised on item {i}: {type(err).__name__}: {err}", name, i
                    ) from err
                if not is_real_number(value) or not math.isfinite(float(value)):
                    raise ScorerError(
                        f"scorer '{name}' returned {value!r} for item {i}; a score must be a finite number",
                        name, i, bad_value=True,
                    )
                per_function[name].append(float(value))
                total += w * float(value)
            totals.append(total)
        return totals, per_function

    def _batched_scores(self, src, tgt, response):
        """`{name: scores}` of the scorers that score a whole batch in one call (a `score_batch`
        attribute, e.g. a model-based judge); raises ScorerError naming the scorer."""
        out = {}
        for name, fn in zip(self.names, self.functions):
            batch = getattr(fn, "score_batch", None)
            if batch is None:
                continue
            try:
                values = list(batch(list(src), list(tgt), list(response)))
            except Exception as err:  # the scorer's bug or a broken label: report, never guess
                raise ScorerError(f"scorer '{name}' raised on a batch of {len(src)} items: {type(err).__name__}: {err}",
                                  name, 0) from err
            if len(values) != len(src):
                raise ScorerError(f"scorer '{name}' returned {len(values)} scores for {len(src)} items", name, 0,
                                  bad_value=True)
            out[name] = values
        return out

    @property
    def judges_correctness(self):
        """True when a scorer of the combination says which answers are correct (`correct_at`)."""
        return any(f is not None and f.correct_at is not None for f in self.facts)

    def verdicts(self, per_function):
        """Per item: True when every scorer with a `correct_at` reaches it (penalties and scorers
        without one do not vote); raises ValueError when none has one."""
        judges = [(n, f.correct_at) for n, f in zip(self.names, self.facts) if f is not None and f.correct_at is not None]
        if not judges:
            raise ValueError(f"none of the scorers {self.spec} says which answers are correct (no correct_at in their "
                             "facts); name a verifier such as math_boxed, gsm8k or reverse")
        count = len(per_function[judges[0][0]])
        return [all(per_function[n][i] >= at for n, at in judges) for i in range(count)]

    def answers(self, src, responses):
        """The answer each response gives, as the first scorer with `extract_answer` reads it
        (None where it reads none); the stripped response when no scorer extracts answers."""
        for fn in self.functions:
            extract = getattr(fn, "extract_answer", None)
            if extract is not None:
                return [extract(s, r) for s, r in zip(src, responses)]
        return [r.strip() for r in responses]
