"""Argument problems collected into one error instead of raised one at a time.

Every argument dataclass checks itself in `__post_init__` inside `problem_scope()`: the
problems of its fields (and of its mixins, whose scopes nest) are raised together as one
`ArgumentError` when the instance is built in code. While an entry point parses its
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


PADDLENLP_REFUSALS = (ValueError, AssertionError, NotImplementedError, TypeError)
"""What PaddleNLP's `TrainingArguments.__post_init__` raises on values it refuses."""


def paddlenlp_refusal(error):
    """The problem line for an exception raised by PaddleNLP's `TrainingArguments.__post_init__`."""
    text = str(error).strip() or type(error).__name__
    return f"PaddleNLP TrainingArguments refused the values: {text}"
