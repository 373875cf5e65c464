"""Argument fields and checks generated from the settings registry entries declare.

A registry entry (a policy loss, an advantage estimator) declares its own settings beside it as
`ppo.algos.Setting` objects (name, type, default, help, valid values). From those declarations
alone:

- `settings_dataclass` builds the argument dataclass holding one field per setting (its help and
  default; the declaration itself in the class's `setting_declarations`), so PaddleNLP's
  `PdArgumentParser` reads them from the argument file, `--help` and `scripts/gen_args_doc.py` list them and the stored argument table
  checks their values before Paddle loads (`early_values`);
- `setting_problems` checks their values in the start-up pass;
- `with_settings` derives, at parse time, the dataclass with the settings of an entry from a
  module of one's own (`policy_loss: my_module:MY_LOSS`) added, so that its settings are keys of
  the argument file too.
"""
import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Optional


def _setting_module():
    """`ppo.algos.setting` (a leaf module: no imports), loaded from its file when `ppo.algos` is not
    imported yet, so that the registries that declare settings at import (scorers, environments)
    keep Paddle out of `--help` and of the argument errors; `ppo.algos` then finds this module in
    `sys.modules` and uses it, so there is one `Setting` class."""
    name = "ppo.algos.setting"
    if name in sys.modules or "ppo.algos" in sys.modules:
        return importlib.import_module(name)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos", "setting.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


Setting = _setting_module().Setting
declared_settings = _setting_module().declared_settings
in_range, range_text = _setting_module().in_range, _setting_module().range_text


def collect_settings(*registries):
    """name -> `Setting` of every setting the entries of `registries` (dicts name -> entry whose
    `declared` holds its `Setting`s) declare, in registry order; entries may share a declaration,
    a name declared twice differently raises ValueError."""
    found, owners = {}, {}
    for registry in registries:
        for entry in registry.values():
            for setting in getattr(entry, "declared", ()):
                if setting.name in found and not found[setting.name].same_as(setting):
                    raise ValueError(f"setting {setting.name!r} is declared twice, differently: by "
                                     f"{owners[setting.name]} and by {entry.name}")
                found.setdefault(setting.name, setting)
                owners.setdefault(setting.name, entry.name)
    return found


def setting_origins(*registries):
    """name -> `(module, owners)` of every declared setting of `registries` (pairs `(registry,
    what)`, e.g. `(POLICY_LOSSES, "policy_loss")`): the module of the first entry's function that
    reads it (the stored argument table watches that file) and the entries that read it, as
    `policy_loss ppo_clip / gspo` (the argument reference says so)."""
    modules, owners = {}, {}
    for registry, what in registries:
        for entry in registry.values():
            for setting in getattr(entry, "declared", ()):
                modules.setdefault(setting.name, getattr(entry.fn, "__module__", None))
                owners.setdefault(setting.name, {}).setdefault(what, []).append(entry.name)
    return {name: (modules[name], "; ".join(f"{what} {' / '.join(names)}" for what, names in owners[name].items()))
            for name in modules}


def setting_field(setting):
    """`(name, annotation, dataclasses.field)` of one `Setting` (PaddleNLP's parser hands a field's
    metadata to argparse, so it holds the help alone; the declaration itself is the class's
    `setting_declarations`)."""
    annotation = Optional[setting.type] if setting.optional else setting.type
    return setting.name, annotation, dataclasses.field(default=setting.default, metadata={"help": setting.help})


def settings_dataclass(name, settings, bases, module, doc, frozen=False, origins=None):
    """The dataclass `name` (in `module`, documented by `doc`) deriving from `bases` with one field
    per `Setting` of `settings` (an iterable). Its `setting_declarations` (name -> `(Setting,
    module, owners)`, its bases' included; `origins`: name -> `(module, owners)` as
    `setting_origins` gives) tell the start-up checks, the stored argument table and the argument
    reference where each field comes from."""
    settings, origins = list(settings), origins or {}
    declarations = declarations_of(bases)
    declarations.update({s.name: (s, *origins.get(s.name, (None, ""))) for s in settings})
    return dataclasses.make_dataclass(name, [setting_field(s) for s in settings], bases=tuple(bases), frozen=frozen,
                                      namespace={"__module__": module, "__doc__": doc,
                                                 "setting_declarations": declarations})


def declarations_of(classes):
    """name -> `(Setting, module, owners)` of the generated fields of `classes`."""
    found = {}
    for cls in classes:
        for base in reversed(cls.__mro__):
            found.update(vars(base).get("setting_declarations", {}))
    return found


def with_settings(cls, settings, module=None, owner=""):
    """`cls` when it has a field for each `Setting` of `settings`, else a dataclass of the same name
    deriving from it with the missing ones added (an outside entry's settings: `module` declares
    them, `owner` names the entry)."""
    have = {f.name for f in dataclasses.fields(cls)}
    missing = [s for s in settings if s.name not in have]
    if not missing:
        return cls
    return settings_dataclass(cls.__name__, missing, (cls,), cls.__module__, cls.__doc__,
                              origins={s.name: (module, owner) for s in missing})


def value_problem(setting, value):
    """What is wrong with `value` for `setting` (one line naming the key), or None."""
    return setting.problem(value)


def setting_problems(args, settings):
    """One line per `Setting` of `settings` whose value on `args` is not one of its values (a
    setting `args` lacks: one line saying that the argument is missing)."""
    problems = []
    for setting in settings:
        if not hasattr(args, setting.name):
            problems.append(f"{setting.name}: no such argument here (an outside entry's settings are added when the "
                            "argument file is parsed)")
            continue
        problem = value_problem(setting, getattr(args, setting.name))
        if problem:
            problems.append(problem)
    return problems


def module_file(module):
    """The source file of the module named `module` (already imported), or None."""
    return getattr(sys.modules.get(module or ""), "__file__", None)


def options_of(settings):
    """name -> default of `settings` (`Setting`s): the options an entry takes, as a dict."""
    return {s.name: s.default for s in settings}


def type_text(kind):
    """`float`, `str or list` of a `Setting`'s type (a type or a tuple of types)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(getattr(k, "__name__", str(k)) for k in kinds)


def _has_type(value, kind):
    """Whether `value` (as a JSON object gives it: unconverted) is of `kind`: an int is a float,
    a bool is no number, a tuple is a list."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    for k in kinds:
        if k is bool and isinstance(value, bool):
            return True
        if k in (int, float) and isinstance(value, bool):
            continue
        if (k is float and isinstance(value, (int, float))) or (k is list and isinstance(value, (list, tuple))):
            return True
        if isinstance(k, type) and isinstance(value, k):
            return True
    return False


def typed_value_problem(setting, value):
    """`value_problem`, with the type checked first (a value of a JSON object, which no argument
    parser converted)."""
    if value is not None and not _has_type(value, setting.type):
        return f"{setting.name}={value!r} (must be {type_text(setting.type)})"
    return value_problem(setting, value)


def option_problems(settings, options, what):
    """One line per key of `options` (a mapping given for `what`, e.g. "scorer 'format'") that no
    `Setting` of `settings` declares (with the closest declared name) or whose value its
    declaration refuses."""
    import difflib

    declared, problems = {s.name: s for s in settings}, []
    for key, value in options.items():
        setting = declared.get(key)
        if setting is None:
            close = difflib.get_close_matches(str(key), declared, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{what} has no option {key!r}{hint}; its options: {', '.join(declared)}")
            continue
        problem = typed_value_problem(setting, value)
        if problem:
            problems.append(f"{what}: {problem}")
    return problems


def signature_problem(fn, settings, what):
    """Why `fn` (a function or class) does not take each `Setting` of `settings` as a keyword with
    the declared default (None when it does): the declaration is the one place of a setting, the
    signature must agree with it."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    for s in settings:
        p = params.get(s.name)
        if p is None and takes_any:
            continue
        if p is None or p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return f"{what} declares the setting {s.name!r}, but {getattr(fn, '__qualname__', fn)} takes no such keyword"
        if p.default is not p.empty and p.default != s.default:
            return (f"{what} declares {s.name!r} with default {s.default!r}, but {getattr(fn, '__qualname__', fn)} "
                    f"defaults it to {p.default!r}")
    return None


def settings_rows(entries, what):
    """Markdown rows `| entry | setting | type | default | values | help |` of `entries` (pairs
    `(name, settings)`), for the generated tables of the docs."""
    rows = [f"| {what} | setting | type | default | values | help |", "|---|---|---|---|---|---|"]
    for name, settings in entries:
        for s in settings:
            values = " / ".join(map(repr, s.choices)) if s.choices else (range_text(*s.bounds) if s.bounds else "-")
            default = f"`{s.default!r}`"
            cells = (f"`{name}`", f"`{s.name}`", type_text(s.type) + (" or None" if s.optional else ""), default, values,
                     s.help)
            rows.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(rows)


def checked_values(settings, **values):
    """Raise ValueError (the problems joined) when a value of `values` is not one its `Setting` of
    `settings` allows: a constructor's guard for callers that build it directly, from the same
    declarations as the start-up check."""
    declared = {s.name: s for s in settings}
    problems = [p for name, value in values.items() for p in [typed_value_problem(declared[name], value)] if p]
    if problems:
        raise ValueError("; ".join(problems))
