"""Choices and ranges of argument values, kept in the stored argument table and checked before
Paddle loads (`argument_table.check_early`), so that `--policy_loss gspoo` or a negative learning
rate is refused in a fraction of a second, not after the tokenizer and the datasets.

Choices: an argument dataclass declares its fields' valid names in a class attribute
`field_choices`, each field mapped to `"module:NAME"` of the tuple, list or registry dict that its
own check reads (or to `("module:NAME", form)` when a value of that `form`, such as
`module.path:NAME` of one's own, is accepted too); a subclass's entry wins over its bases'.
Ranges: the sizes, rates and coefficients, each with the rule declared on its field
(`field_bounds.ranged_field`; PaddleNLP's fields: `field_bounds.PADDLENLP_BOUNDS`) and the start-up
pass's messages. A field generated from a registry entry's `ppo.algos.Setting`
(`registry_settings.declarations_of`) carries its own `choices` and `bounds`. The full start-up pass checks the same values again.
"""
import difflib
import importlib
import inspect

from .field_bounds import PADDLENLP_BOUNDS, bounds_of, rule_problem
from .registry_settings import declarations_of

LEFT_TO_THE_FULL_PASS = ("num_train_epochs",)
"""Range fields whose rule depends on other values (`num_train_epochs` counts only without `max_steps`).
A class may name more in its attribute `full_pass_ranges` (fields whose start-up messages are its own
wording, e.g. the DPO trainer's `beta must be positive, got ...`)."""


# ----------------------------------------------------------------------------- building (imports the modules named)

def declared_choices(classes):
    """field -> `(reference, accepted form or None)` of the `field_choices` of `classes` and their bases."""
    found = {}
    for cls in classes:
        for base in reversed(cls.__mro__):
            for name, rule in (vars(base).get("field_choices") or {}).items():
                found[name] = (rule, None) if isinstance(rule, str) else tuple(rule)
    return found


def resolve(reference):
    """`(the values named by "module:NAME" as a list of strings, the module's source file)`."""
    module_name, _, attr = reference.partition(":")
    module = importlib.import_module(module_name)
    return [str(v) for v in getattr(module, attr)], inspect.getsourcefile(module)


def value_rules(classes, options):
    """`(rules, source files)`: the table's `choices` and `ranges` of an entry point parsing
    `classes` whose parser options (flag -> `[type, nargs, choices, required]`) are `options`."""
    fields = {flag[2:]: kind for flag, kind in options.items()}
    choices, files = {}, set()
    for name, (reference, form) in declared_choices(classes).items():
        if name in fields:
            values, file = resolve(reference)
            choices[name] = [values, form]
            files.add(file)
    declared = {name: found[0] for name, found in declarations_of(classes).items()}
    for name, setting in declared.items():
        if name in fields and name not in choices and setting.choices:
            choices[name] = [[str(v) for v in setting.choices], None]
    own = {name: rule for cls in classes for name, rule in bounds_of(cls).items()}
    left = set(LEFT_TO_THE_FULL_PASS) | {name for cls in classes for base in cls.__mro__
                                         for name in vars(base).get("full_pass_ranges", ())}
    ranges = {}
    for name, kind in fields.items():
        if kind[0] not in ("int", "float") or kind[1] is not None or name in left:
            continue
        if name in declared and declared[name].bounds:
            ranges[name] = ["range", *declared[name].bounds]
        elif name in own or name in PADDLENLP_BOUNDS:
            ranges[name] = list(own.get(name) or PADDLENLP_BOUNDS[name])
    return {"choices": choices, "ranges": ranges}, files


# ----------------------------------------------------------------------------- checking (imports nothing heavy)

def given_values(tokens, convert):
    """field -> value of the `--key value` tokens (the last one wins) that carry exactly one value;
    `convert(field, text)` gives the value of a command-line word (None when it has no type)."""
    values, key, words = {}, None, []
    for token in list(tokens) + ["--"]:
        if token.startswith("--"):
            if key is not None and len(words) == 1:
                values[key] = convert(key, words[0])
            elif key is not None:
                values.pop(key, None)
            key, words = token[2:] or None, []
        else:
            words.append(token)
    return values


def choice_problem(name, value, choices, form=None):
    """The message for `value` outside `choices` (None when it is one), with the closest choice."""
    if not isinstance(value, str) or value in choices or (form and ":" in value):
        return None
    also = f" or {form}" if form else ""
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{name} must be one of {', '.join(map(repr, choices))}{also}, got {value!r}{hint}"


def value_problems(entry, values):
    """Every choice and range problem of `values` (field -> value) under the table `entry`."""
    problems = []
    for name, value in values.items():
        if name in entry.get("choices", {}):
            choices, form = entry["choices"][name]
            problems.append(choice_problem(name, value, choices, form))
        elif name in entry.get("ranges", {}):
            problems.append(rule_problem(name, value, entry["ranges"][name]))
    return [p for p in problems if p]
