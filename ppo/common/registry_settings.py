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
import sys
from typing import Optional

from .validation import in_range, range_text


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
    if value is None:
        return None if setting.optional else f"{setting.name}=None (must be a value; None is not one of its values)"
    if setting.choices is not None and value not in setting.choices:
        return f"{setting.name} must be one of {setting.choices}, got {value!r}"
    if setting.bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not in_range(value, *setting.bounds):
            return f"{setting.name}={value!r} (must be {range_text(*setting.bounds)})"
    if setting.check is not None:
        text = setting.check(value)
        if text:
            return f"{setting.name}={value!r} ({text})"
    return None


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
