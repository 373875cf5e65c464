"""Argument problems collected into one error instead of raised one at a time.

Every argument dataclass is checked in one pass when it is built: the root of its kind (the
training, model or data arguments, `ppo/entry/argument_groups.py`) has the only `__post_init__`,
which runs `group_problems`: the `resolve_group` of every group class among its bases, each
declared in that group's own body (base first), which fills what the group derives from other
fields and returns its problems. They are raised together as one `ArgumentError` when the
instance is built in code. While an entry point parses its
arguments inside `collecting_problems(problems)`, they are appended to that list instead,
so unknown keys, bad values, PaddleNLP's own refusals and cross-field checks of all the
dataclasses end in ONE message (`joined_problems`).
"""
import contextvars
from contextlib import contextmanager

_SINK = contextvars.ContextVar("argument_problem_sink", default=None)


class UsageError(ValueError):
    """The arguments or the data are wrong: an entry point reports it as one message with exit
    status 2, without a traceback (`ppo.common.process_exit`). `ArgumentError` and the data
    layer's errors (`ppo.data.base.DataError`, `UnknownDatasetError`) are usage errors."""


class ArgumentError(UsageError):
    """A bad argument file, flag or combination of values; the message names every problem."""


def joined_problems(problems, heading="arguments cannot be used"):
    """One message: the problem itself, or a count, `heading` and one indented line per problem."""
    problems = list(dict.fromkeys(problems))
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} {heading}:\n  " + "\n  ".join(problems)


def report_problems(problems):
    """Add `problems` to the active collection (`collecting_problems` or an enclosing
    `problem_scope`), or raise them as one ArgumentError when none is active."""
    problems = [p for p in problems if p]
    if not problems:
        return
    sink = _SINK.get()
    if sink is None:
        raise ArgumentError(joined_problems(problems))
    sink.extend(problems)


@contextmanager
def collecting_problems(problems):
    """Inside the block, argument problems are appended to the list `problems`."""
    token = _SINK.set(problems)
    try:
        yield problems
    finally:
        _SINK.reset(token)


@contextmanager
def problem_scope():
    """Collect the problems reported in the block (and the list it yields) and report them
    together when it ends: to the enclosing collection, or raised as one ArgumentError."""
    found = []
    token = _SINK.set(found)
    try:
        yield found
    finally:
        _SINK.reset(token)
    report_problems(found)


def group_problems(args):
    """The problems of every argument group of `args`: `resolve_group(args)` of each class of
    `type(args).__mro__` that declares one in its own body, bases first (as a `__post_init__`
    chain calling `super()` first ran them), each filling what its group derives."""
    problems = []
    for cls in reversed(type(args).__mro__):
        resolve = vars(cls).get("resolve_group")
        if resolve is not None:
            problems += resolve(args) or []
    return problems


def resolve_arguments(args):
    """The one `__post_init__` of the argument dataclasses (the roots name it: no `super()`
    chain): `group_problems(args)` in one `problem_scope`, raised together when `args` is built
    in code, collected while an entry point parses."""
    with problem_scope() as problems:
        problems += group_problems(args)


PADDLENLP_REFUSALS = (ValueError, AssertionError, NotImplementedError, TypeError)
"""What PaddleNLP's `TrainingArguments.__post_init__` raises on values it refuses."""


def paddlenlp_refusal(error):
    """The problem line for an exception raised by PaddleNLP's `TrainingArguments.__post_init__`."""
    text = str(error).strip() or type(error).__name__
    return f"PaddleNLP TrainingArguments refused the values: {text}"
