"""Ranges of argument fields, declared on the field itself.

A field of this repository's argument dataclasses that has a range is declared with
`ranged_field(default, help=..., <rule>)`, the rule one of

- `range=(low, low included, high, high included)` (None: no bound on that side): rates,
  coefficients, sampling settings (`kl_coeff`, `gamma`, `top_p`, ...);
- `minimum=n`: an integer >= n (sizes and counts: `rollout_n`, `max_dec_len`, ...);
- `above=x`: a number > x (`reward_server_timeout`, `divergence_factor`).

The rule sits in the field's metadata (`bounds_of`); the start-up pass (`bound_problems`, run by
`validation.size_problems` before any model loads) and the stored argument table's early check
(`early_values.value_rules`) read it there, with the messages of `rule_problem`. A registry entry's
settings carry theirs in their `ppo.algos.Setting`. PaddleNLP's own fields cannot carry our
metadata: the ones we bound are listed once, in `PADDLENLP_BOUNDS`. A class that takes a field of
another class keeps its declaration: `shared_field` (as it is) or `default_override` (another default).
"""
import dataclasses

from .registry_settings import in_range, range_text

BOUNDS_KEY = "bounds"


class FieldMetadata(dict):
    """A field's metadata with our keys: PaddleNLP's parser passes `field.metadata.copy()` to
    argparse's `add_argument`, so `copy` leaves out the bounds (argparse takes `help` only)."""

    def copy(self):
        return {k: v for k, v in self.items() if k != BOUNDS_KEY}


def ranged_field(default=dataclasses.MISSING, *, help, range=None, minimum=None, above=None,
                 default_factory=dataclasses.MISSING):
    """A `dataclasses.field` with `help` and exactly one bounds rule (`range`, `minimum` or
    `above`, see the module's docstring) in its metadata."""
    rules = [rule for rule in (range and ("range", *range), minimum is not None and ("min", minimum),
                               above is not None and ("above", above)) if rule]
    if len(rules) != 1:
        raise ValueError(f"ranged_field needs exactly one of range, minimum, above; got {len(rules)}")
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata=FieldMetadata(help=help, **{BOUNDS_KEY: rules[0]}))


def kept_metadata(metadata):
    """A field's metadata to give another field (another default of a shared field), bounds kept."""
    return FieldMetadata(metadata)


def default_override(group, name, default):
    """Field `name` of the argument group `group` with another default (its help and range kept):
    how an entry point gives a shared field its own default without declaring it a second time."""
    shared = group.__dataclass_fields__[name]
    if default == shared.default:
        raise ValueError(f"default_override({group.__name__}, {name!r}, {default!r}) repeats the group's default: "
                         "use shared_field")
    return dataclasses.field(default=default, metadata=kept_metadata(shared.metadata))


def shared_field(group, name):
    """Field `name` of the argument class `group` as it is declared there (default, help, range), for
    a class that takes that one field without the rest of `group`."""
    shared = group.__dataclass_fields__[name]
    return dataclasses.field(default=shared.default, default_factory=shared.default_factory, metadata=kept_metadata(shared.metadata))


PADDLENLP_BOUNDS = {
    "learning_rate": ("range", 0.0, True, None, False),
    "weight_decay": ("range", 0.0, True, None, False),
    "warmup_steps": ("range", 0, True, None, False),
    "adam_beta1": ("range", 0.0, True, 1.0, False),
    "adam_beta2": ("range", 0.0, True, 1.0, False),
    "adam_epsilon": ("range", 0.0, True, None, False),
    "num_train_epochs": ("range", 0.0, True, None, False),
    "per_device_train_batch_size": ("min", 1),
    "per_device_eval_batch_size": ("min", 1),
    "gradient_accumulation_steps": ("min", 1),
    "save_steps": ("min", 0),
    "logging_steps": ("min", 1),
    "eval_steps": ("min", 0),
}
"""The PaddleNLP fields we bound: fields PaddleNLP's `TrainingArguments` declares, which cannot carry
our metadata, so their rules live in this one table (every field of our own carries its rule in its
declaration, `ranged_field`; tests/test_house_rules.py holds both). Out of range, each fails late (a
negative learning rate after the models load, inside the scheduler; a batch size of -1 gives no
mini-batches). PaddleNLP checks `warmup_ratio` itself."""


def bounds_of(args):
    """field -> bounds rule of the fields of `args` (a dataclass or its instance) declared with
    `ranged_field`, in declaration order; {} for anything else."""
    if not dataclasses.is_dataclass(args):
        return {}
    return {f.name: tuple(f.metadata[BOUNDS_KEY]) for f in dataclasses.fields(args) if BOUNDS_KEY in f.metadata}


def rules_of(args):
    """field -> bounds rule of every bounded field of `args`: the PaddleNLP fields it has
    (`PADDLENLP_BOUNDS`) first, then its own declared ones (`bounds_of`)."""
    own = bounds_of(args)
    rules = {name: rule for name, rule in PADDLENLP_BOUNDS.items() if name not in own and hasattr(args, name)}
    rules.update(own)
    return rules


def rule_problem(name, value, rule):
    """`name=value (must be ...)` for `value` outside `rule`, or None (None, bools and non-numbers
    are left to the parser and the other checks)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    kind, *bounds = rule
    if kind == "range" and not in_range(value, *bounds):
        return f"{name}={value!r} (must be {range_text(*bounds)})"
    if kind == "min" and (value != int(value) or value < bounds[0]):
        return f"{name}={value!r} (must be an integer >= {bounds[0]})"
    if kind == "above" and not value > bounds[0]:
        return f"{name}={value!r} (must be > {bounds[0]:g})"
    return None


def bound_problems(args):
    """One problem per bounded field of `args` (`rules_of`) whose value is outside its rule."""
    problems = []
    for name, rule in rules_of(args).items():
        if name == "num_train_epochs" and getattr(args, "max_steps", -1) > 0:
            continue  # max_steps > 0 replaces it (PaddleNLP's grpo_32b_argument.yaml: max_steps 1000, num_train_epochs -1)
        problem = rule_problem(name, getattr(args, name, None), rule)
        if problem:
            problems.append(problem)
    return problems
