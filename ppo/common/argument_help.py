"""`--help` of the entry points: every argument with its type, default and help text.

The toolkit's own arguments come first, one section per dataclass; the fields inherited
from PaddleNLP's `TrainingArguments` follow in a section of their own (they keep
PaddleNLP's meaning and defaults).
"""
import argparse
import dataclasses
import os
import re
import sys
import textwrap
import typing

HELP_FLAGS = ("-h", "--help")

NEGATIVE_NUMBER = re.compile(r"^-(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
"""A command-line word that is a negative number, exponent forms included (`-1e-07`, `-2.5E+3`).
argparse's own pattern (`^-\d+$|^-\d*\.\d+$`) leaves out exponents, so `--learning_rate -1e-4`
read `-1e-4` as an unknown flag ("expected one argument")."""


def accept_negative_numbers(parser):
    """Make `parser` (an argparse parser without flags that look like numbers) take every
    negative number as a value, exponent forms included; returns it."""
    parser._negative_number_matcher = NEGATIVE_NUMBER
    return parser


def wants_help(argv):
    return any(token in HELP_FLAGS for token in argv)


def default_text(f):
    """The field's default as it would be written in an argument file."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    value = getattr(value, "value", value)  # enums
    return repr(value) if isinstance(value, str) else str(value)


def type_text(annotation):
    """`int`, `Optional[int]`, `List[str]`, ... as the field declares it (`annotation`: its
    resolved type hint; PaddleNLP's parser rewrites `Field.type` in place, dropping `Optional`)."""
    if getattr(annotation, "__origin__", None) is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", None) or str(annotation)


def field_lines(f, annotation=None, width=100):
    """`--name TYPE (default: X)` and the help text indented under it (`annotation`: the field's
    type hint, default `f.type`)."""
    head = f"  --{f.name} {type_text(f.type if annotation is None else annotation)} (default: {default_text(f)})"
    text = " ".join(str(f.metadata.get("help", "")).split())
    body = textwrap.wrap(text, width=width, initial_indent="      ", subsequent_indent="      ") if text else []
    return [head, *body]


def inherited_from_paddlenlp(cls):
    """Names of the fields `cls` inherits from PaddleNLP's `TrainingArguments` unchanged."""
    try:
        from paddlenlp.trainer import TrainingArguments
    except ImportError:
        return set()
    if not issubclass(cls, TrainingArguments):
        return set()
    return {f.name for f in dataclasses.fields(TrainingArguments)}


def usage_line(program=None):
    """The first line of an entry point's `--help` page (`program`: default the running script)."""
    program = program or os.path.basename(sys.argv[0] or "run.py")
    return f"usage: {program} [ARGUMENT_FILE.json|.yaml] [--name value ...]\n"


def help_text(dataclass_types, program=None):
    """The `--help` page of an entry point parsing `dataclass_types`: `usage_line` and `help_body`."""
    return usage_line(program) + help_body(dataclass_types)


def help_body(dataclass_types):
    """The `--help` page after its usage line: every argument with its type, default and help."""
    lines = [
        "",
        "Arguments come from an optional JSON/YAML file of {name: value}; --name value flags override it.",
    ]
    paddlenlp_fields = []
    for cls in dataclass_types:
        inherited = inherited_from_paddlenlp(cls)
        hints = typing.get_type_hints(cls)
        own = [f for f in dataclasses.fields(cls) if f.init and f.name not in inherited]
        paddlenlp_fields += [(f, hints.get(f.name)) for f in dataclasses.fields(cls) if f.init and f.name in inherited]
        lines += ["", f"{cls.__name__}:"]
        for f in own:
            lines += field_lines(f, hints.get(f.name))
    if paddlenlp_fields:
        lines += ["", "PaddleNLP TrainingArguments (PaddleNLP's meaning and defaults):"]
        for f, annotation in paddlenlp_fields:
            lines += field_lines(f, annotation)
    return "\n".join(lines) + "\n"


def doc_summary(doc):
    """The first paragraph of a module docstring as one line: a script's `--help` description
    (its first line alone may stop mid-sentence)."""
    paragraph = (doc or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split())


def print_help_and_exit(dataclass_types):
    sys.stdout.write(help_text(dataclass_types))
    sys.stdout.flush()
    raise SystemExit(0)


class OneMessageArgumentParser(argparse.ArgumentParser):
    """`argparse` for the small command lines (reward server, LoRA merge): `--help` as usual;
    an error is one `prog: error: message` line on stderr and exit status 2, without the
    usage dump. Negative numbers in exponent form are values (`NEGATIVE_NUMBER`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        accept_negative_numbers(self)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")
