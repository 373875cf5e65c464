"""`--help` and the argument file's own errors in well under two seconds: the stored argument table.

The argument dataclasses of the entry points subclass PaddleNLP's `TrainingArguments`, so
building them imports Paddle and PaddleNLP (several seconds, far more on a busy machine). The
file `argument_table.json` beside this module holds, per entry point (`entry_points.py`), what
parsing needs before that import: the `--help` page, the field names, and each option's type,
`nargs`, choices and whether it is required, read from PaddleNLP's own parser, and the valid
names and ranges of the values (`early_values`: `--policy_loss gspoo` gets "did you mean
'gspo'?"). `check_early`, called by every entry script before its imports, prints `--help` from
it, and refuses an argument file that cannot be read, unknown keys, values of the wrong type,
values outside their choices or ranges and missing required arguments in one message (exit
status 2), all without importing Paddle. Arguments that pass go on to the full start-up pass,
which checks them again with everything else.

The table records the installed PaddleNLP version and a hash of every file of this package that
defines the dataclasses (by its path inside the package: `ppo/entry/ppo_arguments.py`, wherever the
package is installed); when either differs (an argument added and the table not yet rebuilt),
the table is not used and the entry point parses as before. PaddleNLP's own files are keyed by
its version alone: they are not where the repository keeps them in another environment (a
user's virtual environment, `pip install -e .` into it). `python scripts/gen_args_doc.py`
rebuilds the table (with docs/arguments.md); a test fails while it is out of date.
"""
import hashlib
import json
import os
import re
import sys
from argparse import ArgumentTypeError
from types import SimpleNamespace

from .argument_files import REPO_ROOT
from .argument_help import help_body, usage_line, wants_help
from .argument_parsing import read_arguments
from .argument_problems import ArgumentError, joined_problems
from .early_values import given_values, value_problems, value_rules
from .entry_points import ENTRY_POINTS, entry_point

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "argument_table.json")
FORMAT_SOURCES = ("ppo/common/argument_help.py", "ppo/common/argument_table.py", "ppo/common/early_values.py",
                  "ppo/common/entry_points.py", "ppo/common/field_bounds.py", "ppo/common/validation.py")
"""Files besides the dataclasses' whose change changes the table."""
PACKAGES = ("ppo", "sft", "rm", "dpo", "rl", "scripts")
"""The top-level packages of this toolkit (setup.py installs them): the only files the table hashes."""


def strtobool(value):
    """PaddleNLP's `strtobool` (the `type` of its boolean options), without importing PaddleNLP."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if value.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise ArgumentTypeError(f"Truthy value expected: got {value} but expected one of yes/no, true/false, t/f, y/n, 1/0 "
                            "(case insensitive).")


TYPES = {"int": int, "float": float, "str": str, "strtobool": strtobool, "json": json.loads}
"""The option types of PaddleNLP's parser by the name the table stores."""


def type_name(option_type):
    for name, known in TYPES.items():
        if option_type is known or (name == "strtobool" and getattr(option_type, "__name__", "") == "strtobool"):
            return name
    return None  # left to the full parse


def paddlenlp_version():
    """The installed PaddleNLP's version, from the `Version:` line of the `paddlenlp-*.dist-info`
    beside the package (importing `importlib.metadata` would take a third of `--help`'s time);
    through `importlib.metadata` when there is no such directory (another kind of install). The
    path finder alone looks: `sys.meta_path`'s hooks (`lazy_paddlenlp`'s) see no import."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("paddlenlp")
    if spec is not None and spec.origin:
        site = os.path.dirname(os.path.dirname(spec.origin))
        infos = [n for n in os.listdir(site) if n.startswith("paddlenlp-") and n.endswith(".dist-info")]
        metadata = os.path.join(site, infos[0], "METADATA") if len(infos) == 1 else ""
        if os.path.isfile(metadata):
            with open(metadata, encoding="utf-8") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
    from .lazy_paddlenlp import _installed_version

    return _installed_version()


def file_hash(relative):
    path = os.path.join(REPO_ROOT, relative)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ----------------------------------------------------------------------------- building (imports PaddleNLP)

def import_classes(entry):
    import importlib

    classes = []
    for ref in entry.arguments:
        module, _, name = ref.partition(":")
        classes.append(getattr(importlib.import_module(module), name))
    return classes


def package_file(path):
    """`path` relative to the package root (`ppo/entry/ppo_arguments.py`) when it is a file of this
    toolkit's packages, else None (PaddleNLP's files, wherever its environment lives)."""
    path = os.path.abspath(path)
    if not path.startswith(REPO_ROOT + os.sep):
        return None
    relative = os.path.relpath(path, REPO_ROOT).replace(os.sep, "/")
    return relative if relative.split("/")[0] in PACKAGES else None


def source_files(classes):
    """The files of this toolkit's packages (paths inside the package root) that define `classes`
    and their bases, and the modules of the registry entries whose settings are their fields."""
    import inspect

    from .registry_settings import declarations_of, module_file

    found = set()
    for cls in classes:
        for base in cls.__mro__:
            try:
                relative = package_file(inspect.getsourcefile(base) or "")
            except TypeError:  # builtins
                continue
            if relative:
                found.add(relative)
    declaring = {module_file(found[1]) for found in declarations_of(classes).values()}  # registry entries' settings
    found |= {package_file(path) for path in declaring if path} - {None}
    return found


def entry_table(classes):
    """`(the stored facts of one entry point parsing `classes`, the source files of its value
    choices)`: options as `[type, nargs, choices, required]`, value `choices` and `ranges`."""
    from .argument_parsing import collecting_parser, fixed_field_names, valid_field_names

    parser = collecting_parser(classes)
    options = {}
    for flag, action in parser._option_string_actions.items():
        if flag.startswith("--"):
            choices = list(action.choices) if action.choices is not None else None
            options[flag] = [type_name(action.type), action.nargs, choices, bool(action.required)]
    rules, files = value_rules(classes, options)
    outside = sorted({name for cls in classes for name in getattr(cls, "outside_entries", ())})
    return dict({"help": help_body(classes), "valid": valid_field_names(classes), "outside_entries": outside,
                 "fixed_fields": sorted(fixed_field_names(classes)), "options": options}, **rules), files


HEADING = re.compile(r"(?=\n\n\S[^\n]*:\n)")
"""Where a `--help` page's sections start (a dataclass's name, PaddleNLP's fields)."""


def pooled(entries):
    """`entries` with each help page as a list of section numbers and each option as a kind number,
    plus the `sections` and `kinds` pools (the entry points share PaddleNLP's fields: stored once)."""
    sections, kinds, out = [], [], {}
    for command, entry in entries.items():
        ids = []
        for section in HEADING.split(entry["help"]):
            if section not in sections:
                sections.append(section)
            ids.append(sections.index(section))
        options = {}
        for flag, kind in entry["options"].items():
            if kind not in kinds:
                kinds.append(kind)
            options[flag] = kinds.index(kind)
        out[command] = dict(entry, help=ids, options=options)
    return out, sections, kinds


def build_table():
    """The whole table (every entry point with argument dataclasses), as `argument_table.json` holds it."""
    entries, sources = {}, set(FORMAT_SOURCES)
    for entry in ENTRY_POINTS:
        if entry.arguments:
            classes = import_classes(entry)
            entries[entry.command], files = entry_table(classes)
            sources |= source_files(classes) | {package_file(f) for f in files} - {None}
    entries, sections, kinds = pooled(entries)
    return {"paddlenlp": paddlenlp_version(), "sources": {path: file_hash(path) for path in sorted(sources)},
            "entries": entries, "sections": sections, "kinds": kinds}


def table_text(table):
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


# ----------------------------------------------------------------------------- reading (imports nothing heavy)

def load_entry_table(command):
    """The stored facts of `command`'s entry point (its help page whole, its options as `[type,
    nargs, choices, required]`), or None when the table is missing, was built with another
    PaddleNLP, or a source file changed since."""
    try:
        with open(TABLE_PATH, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError):
        return None
    if table.get("paddlenlp") != paddlenlp_version():
        return None
    if any(file_hash(path) != digest for path, digest in table.get("sources", {}).items()):
        return None
    entry = table.get("entries", {}).get(command)
    if entry is None:
        return None
    options = {flag: table["kinds"][kind] for flag, kind in entry["options"].items()}
    return dict(entry, help="".join(table["sections"][i] for i in entry["help"]), options=options)


def stored_actions(entry):
    """The table's options as the action-like objects `argument_parsing.read_arguments` takes."""
    actions = {}
    for flag, (name, nargs, choices, _) in entry["options"].items():
        actions[flag] = SimpleNamespace(type=TYPES.get(name), nargs=nargs, choices=choices)
    return actions


def converted(action, text):
    """The value of the command-line word `text` for the stored option `action` (None when it
    has no stored type or a list of values)."""
    if action is None or action.type is None or action.nargs not in (None, "?"):
        return None
    try:
        return action.type(text)
    except (ValueError, TypeError, ArgumentTypeError):
        return None


def early_problems(entry, argv):
    """The problems of `argv` the table can tell: the argument file, unknown keys, values of the
    wrong type or outside their choices and ranges, required arguments left out; none when a
    field of `outside_entries` names a module of one's own, whose entry may add arguments (the
    full pass checks them all). Raises ArgumentError for an unreadable argument file."""
    problems = []
    actions = stored_actions(entry)
    tokens = read_arguments(argv, set(entry["valid"]), set(entry["fixed_fields"]), actions, problems)
    values = given_values(tokens, lambda key, text: converted(actions.get(f"--{key}"), text))
    if any(":" in str(values.get(name, "")) for name in entry.get("outside_entries", ())):
        return []  # an outside entry (module.path:NAME) may declare arguments of its own: the full pass checks all
    problems += value_problems(entry, values)
    given = {token for token in tokens if token.startswith("--")}
    missing = [flag for flag, (_, _, _, required) in entry["options"].items() if required and flag not in given]
    if missing:
        problems.append(f"command line: the following arguments are required: {', '.join(missing)}")
    return problems


def check_early(command, argv=None):
    """Before an entry script imports Paddle: `--help` from the stored table (exit 0), or the
    problems `early_problems` finds as one message on stderr (exit 2). Returns when there is
    nothing to say, or when the table cannot be used (the full parse then does everything)."""
    entry = load_entry_table(entry_point(command).command)
    if entry is None:
        return
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        sys.stdout.write(usage_line() + entry["help"])
        sys.stdout.flush()
        raise SystemExit(0)
    from .process_exit import exit_on_usage_error

    try:
        problems = early_problems(entry, argv)
    except ArgumentError as error:
        exit_on_usage_error(error)
    if problems:
        exit_on_usage_error(ArgumentError(joined_problems(problems)))
