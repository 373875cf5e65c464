"""Parse JSON or YAML argument files plus command-line overrides into dataclasses.

`parse_arguments((ModelArgument, DataArgument, MyTrainingArguments), validate=...)` reads
`sys.argv[1:]`: an optional first `*.json` / `*.yaml` / `*.yml` file (`argument_files`),
then `--flag value` overrides (command line wins); `--help` prints every argument with its
help and exits 0. PaddleNLP's keys are read through the table in `paddlenlp_keys`
(renamed keys, keys accepted only with PaddleNLP's default, unsupported keys). Every
problem (an unknown key, a value of the wrong type, a dataclass check, PaddleNLP's own
refusal, the entry point's `validate` pass) is reported in ONE `ArgumentError` listing
them all. `~` is expanded in path arguments. A relative argument-file path that does not
exist from the working directory resolves against the repository root, so `cd ppo &&
python run_ppo.py config/llama/ppo_argument.json` works too.
"""
import dataclasses
import difflib
import json
import logging
import os
import sys
from argparse import ArgumentTypeError

from . import paddlenlp_keys as pk
from .argument_files import (  # noqa: F401  (REPO_ROOT, load_argument_file: part of this module's interface)
    ARGUMENT_FILE_EXTENSIONS,
    REPO_ROOT,
    argument_file_token_problem,
    load_argument_file,
    resolve_config_path,
)
from .argument_help import accept_negative_numbers, print_help_and_exit, wants_help
from .argument_problems import ArgumentError, collecting_problems, joined_problems
from .training_world import unlaunched_degree_notes

logger = logging.getLogger("ppo")

SECRET_FIELDS = ("reward_server_token",)  # shown as "<hidden>" in resolved_arguments.json
PATH_FIELDS = ("output_dir", "logging_dir", "resume_from_checkpoint", "lora_path")
"""Path arguments besides every `*_name_or_path`; `~` is expanded in all of them."""


def valid_field_names(dataclass_types):
    return sorted({f.name for dt in dataclass_types for f in dataclasses.fields(dt) if f.init})


def unknown_key_message(key, valid, where):
    """`where: unknown argument 'key'` with a close valid name (or mappable PaddleNLP key) as hint."""
    names = list(valid) + [k for k, (target, _, _) in pk.RENAMED.items() if target in valid]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{where}: unknown argument '{key}'{hint}"


def key_problem(key, value, valid, where):
    """None when `key` (not a field) is usable here, else the message saying why not."""
    if key in pk.RENAMED:
        target, _, what = pk.RENAMED[key]
        if target in valid:
            return None
        return f"{where}: '{key}' is PaddleNLP's name for '{target}' ({what}), which this entry point does not have"
    if key in pk.FIXED_VALUE:
        if pk.fixed_value_matches(key, value):
            return None
        expected, does = pk.FIXED_VALUE[key]
        return f"{where}: '{key}: {value}' is not supported here (PaddleNLP: {does}); only {expected!r} is"
    if key in pk.SAME_RESULT:
        return None
    if key in pk.UNSUPPORTED:
        return f"{where}: '{key}' is not supported here (PaddleNLP: {pk.UNSUPPORTED[key]})"
    if key in pk.PPO_ONLY:
        return f"{where}: '{key}' is an argument of PPO/GRPO (ppo/run_ppo.py) only; this entry point does not have it"
    return unknown_key_message(key, valid, where)


def translate_keys(data, valid, where, problems, fixed_fields=(), context=None):
    """`data` with PaddleNLP keys renamed to ours (values translated); accepted fixed-value
    keys dropped; every unusable key appended to `problems`. `fixed_fields`: fields of the
    entry point that run at `paddlenlp_keys.PPO_FIXED_VALUE`'s values only. `context`: the
    other keys a translation may read (the argument file's under the command line's); `data`."""
    context = data if context is None else context
    out = {}
    for key, value in data.items():
        if key in valid:
            problem = pk.ppo_fixed_value_problem(key, value, where) if key in fixed_fields else None
            if problem:
                problems.append(problem)
                continue
            out[key] = pk.VALUE_ALIASES.get(key, {}).get(value, value) if isinstance(value, str) else value
            continue
        problem = key_problem(key, value, valid, where)
        if problem:
            problems.append(problem)
            continue
        if key not in pk.RENAMED:
            continue  # a FIXED_VALUE key at the value we run with
        target, convert, _ = pk.RENAMED[key]
        try:
            new_value = convert(value, context) if value is not None else None
        except ValueError as e:
            problems.append(f"{where}: {key}: {e}")
            continue
        if target in data and data[target] is not None and new_value is not None and data[target] != new_value:
            problems.append(f"{where}: '{key}' (PaddleNLP's name for '{target}') conflicts with '{target}' given too")
            continue
        out[target] = new_value
        if value is not None:
            for extra_key, extra_value in pk.extra_mapped_keys(key, value, valid).items():
                out.setdefault(extra_key, extra_value)
    return out


def file_arguments_to_argv(data):
    """`{key: value}` as a `--key value` list (a null keeps the dataclass default)."""
    argv = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, list):
            argv.extend([f"--{key}", *[str(v) for v in value]])
        elif isinstance(value, dict):
            argv.extend([f"--{key}", json.dumps(value)])
        else:
            argv.extend([f"--{key}", str(value)])
    return argv


def read_json_arguments(path, valid):
    """Return the argument file's keys as a `--key value` list; raise on unusable keys or a bad file."""
    problems = []
    data = translate_keys(load_argument_file(path), valid, path, problems)
    if problems:
        raise ArgumentError(joined_problems(problems))
    return file_arguments_to_argv(data)


def command_line_to_dict(argv):
    """`--key v [v ...]` / `--key=v` tokens as `{key: value or [values]}` (flags with no value: "true")."""
    out, key = {}, None
    for token in argv:
        if token.startswith("--"):
            key, eq, value = token[2:].partition("=")
            out[key] = [value] if eq else []
        elif key is None:
            raise ArgumentError(argument_file_token_problem(token) or f"command line: '{token}' comes before any --flag")
        else:
            out[key].append(token)
    return {k: (v[0] if len(v) == 1 else ("true" if not v else v)) for k, v in out.items()}


def expand_user_paths(data):
    """`data` with `~` expanded in path arguments (`*_name_or_path` and `PATH_FIELDS`)."""
    out = dict(data)
    for key, value in data.items():
        if isinstance(value, str) and (key.endswith("_name_or_path") or key in PATH_FIELDS):
            out[key] = os.path.expanduser(value)
    return out


TYPE_NAMES = {int: ("an integer", "integers"), float: ("a number", "numbers"), str: ("a string", "strings"),
              json.loads: ("a JSON object", "JSON objects")}
"""How a message names the values of a parser option's `type`: (one, a list)."""


def expected_type(action):
    """What the option `action` takes, as a message says it: "an integer", "a list of strings", "one of ..."."""
    if action.choices:
        return "one of " + ", ".join(repr(c) for c in action.choices)
    if getattr(action.type, "__name__", "") == "strtobool":
        one, many = "true or false", "true/false values"
    else:
        one, many = TYPE_NAMES.get(action.type, (f"a {getattr(action.type, '__name__', 'value')}", "values"))
    return f"a list of {many}" if action.nargs in ("+", "*") else one


def value_problem(action, value, key, where):
    """Why `value` (from a file or the command line) cannot be given to `--key`, else None."""
    many = action.nargs in ("+", "*")
    if isinstance(value, (list, tuple)) and not many:
        return f"{where}: {key}: expected {expected_type(action)}, got a list {list(value)!r}"
    if isinstance(value, dict) or action.type is None:
        return None
    for item in value if isinstance(value, (list, tuple)) else [value]:
        try:
            converted = action.type(str(item)) if not isinstance(item, bool) or action.choices else action.type(item)
        except (ValueError, TypeError, ArgumentTypeError):
            return f"{where}: {key}: expected {expected_type(action)}, got {item!r}"
        if action.choices and converted not in action.choices:
            return f"{where}: {key}: expected {expected_type(action)}, got {item!r}"
    return None


def usable_arguments(actions, data, where, problems):
    """`data` as `--key value` tokens, leaving out (and adding to `problems`) every value the
    parser could not convert, so the other problems are still found. `actions`: the parser's
    option actions by flag (`--name`)."""
    kept = {}
    for key, value in data.items():
        action = actions.get(f"--{key}")
        problem = value_problem(action, value, key, where) if action is not None and value is not None else None
        if problem:
            problems.append(problem)
        else:
            kept[key] = value
    return file_arguments_to_argv(kept)


def split_argument_file(argv, valid, fixed_fields, problems):
    """(translated keys of the argument file, its path, the remaining argv) for `argv` whose
    first word may name an argument file; its unusable keys are added to `problems`. A first
    word that cannot be one, or a file that cannot be read, raises ArgumentError at once: its
    own error alone (every argument it holds would otherwise be reported missing too)."""
    if not argv or argv[0].startswith("--"):
        return {}, None, argv
    problem = argument_file_token_problem(argv[0])
    if problem:
        raise ArgumentError(problem)
    path = resolve_config_path(argv[0])
    data = translate_keys(load_argument_file(path), valid, path, problems, fixed_fields)
    return expand_user_paths(data), path, argv[1:]


def collecting_parser(dataclass_types):
    """PaddleNLP's `PdArgumentParser` for `dataclass_types` whose argparse errors raise
    ArgumentError (collected with the other problems) instead of printing the usage and exiting,
    and which reads negative numbers in exponent form (`-1e-07`) as values."""
    from paddlenlp.trainer import PdArgumentParser

    class Parser(PdArgumentParser):
        def error(self, message):
            raise ArgumentError(f"command line: {message}")

    return accept_negative_numbers(Parser(dataclass_types))


def run_validation(validate, parsed, problems):
    """Add `validate(*parsed)`'s problems; a crash of the checks on values already reported
    as problems is logged at debug level instead of hiding them."""
    try:
        problems += validate(*parsed)
    except Exception:  # noqa: BLE001 - the values were refused above; their reported problems are the message
        if not problems:
            raise
        logger.debug("start-up checks stopped on values already refused", exc_info=True)


def read_arguments(argv, valid, fixed_fields, actions, problems):
    """The `--key value` tokens of `argv` (`[args.json|args.yaml] [--key value ...]`, the command
    line overriding the file) that `actions` (option actions by flag) can convert; every unknown
    key and unconvertible value is added to `problems`. An argument file that cannot be read
    raises ArgumentError with its own error alone."""
    file_data, path, argv = split_argument_file(argv, valid, fixed_fields, problems)
    try:
        cli = command_line_to_dict(argv)
        cli_data = expand_user_paths(translate_keys(cli, valid, "command line", problems, fixed_fields, {**file_data, **cli}))
    except ArgumentError as err:
        problems.append(str(err))
        cli_data = {}
    return usable_arguments(actions, file_data, path, problems) + usable_arguments(actions, cli_data, "command line", problems)


def fixed_field_names(dataclass_types):
    return {k for dt in dataclass_types for k in getattr(dt, "paddlenlp_fixed_fields", ())}


def given_keys(argv):
    """The argument file's keys and the command line's as given (untranslated; `{}` for what
    cannot be read: the parse itself reports it)."""
    given = {}
    try:
        if argv and not argv[0].startswith("--") and not argument_file_token_problem(argv[0]):
            given.update(load_argument_file(resolve_config_path(argv[0])))
            argv = argv[1:]
        given.update(command_line_to_dict(argv))
    except (ArgumentError, OSError, ValueError):
        pass
    return given


def with_outside_settings(dataclass_types, argv):
    """`dataclass_types` with each one that names outside entries (`with_outside_settings`, e.g.
    `policy_loss: my_module:MY_LOSS`) replaced by its dataclass with those entries' settings
    as fields, so that they are keys of the argument file."""
    if not any(hasattr(dt, "with_outside_settings") for dt in dataclass_types):
        return tuple(dataclass_types)
    given = given_keys(argv)
    return tuple(dt.with_outside_settings(given) if hasattr(dt, "with_outside_settings") else dt for dt in dataclass_types)


def parse_collecting(dataclass_types, argv=None, validate=None):
    """`(instances or None, problems)` for `[args.json|args.yaml] [--key value ...]`: one instance
    per dataclass type (None when they could not be built) and every problem found, the entry
    point's `validate(*instances) -> list[str]` pass included. An argument file that cannot be
    read raises ArgumentError at once; `--help` prints the arguments and exits 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print_help_and_exit(dataclass_types)
    problems = []
    dataclass_types = with_outside_settings(dataclass_types, argv)
    parser = collecting_parser(dataclass_types)
    tokens = read_arguments(argv, set(valid_field_names(dataclass_types)), fixed_field_names(dataclass_types),
                            parser._option_string_actions, problems)
    parsed = None
    with collecting_problems(problems):
        try:
            *parsed, remaining = parser.parse_args_into_dataclasses(args=tokens, return_remaining_strings=True, look_for_args_file=False)
            if remaining:
                problems.append(f"command line: could not use {remaining}")
        except ArgumentError as err:
            problems.append(str(err))
    if parsed is not None and validate is not None:
        run_validation(validate, parsed, problems)
    if parsed is not None and not problems:
        for note in unlaunched_degree_notes(given_keys(argv)):
            logger.warning(note)
    return (None if parsed is None else tuple(parsed)), problems


def parse_arguments(dataclass_types, argv=None, validate=None):
    """Parse `[args.json|args.yaml] [--key value ...]` into one instance per dataclass type;
    `validate(*instances) -> list[str]` is the entry point's start-up pass. Raise one
    ArgumentError listing every problem; `--help` prints the arguments and exits 0."""
    parsed, problems = parse_collecting(dataclass_types, argv, validate)
    if problems:
        raise ArgumentError(joined_problems(problems))
    return parsed


def arguments_to_dict(*instances):
    """`{ClassName: {field: value}}` for JSON output; unserialisable values become strings."""
    out = {}
    for inst in instances:
        fields = {f.name: getattr(inst, f.name) for f in dataclasses.fields(inst) if f.init}
        fields.update({k: "<hidden>" for k in SECRET_FIELDS if fields.get(k)})
        out[type(inst).__name__] = json.loads(json.dumps(fields, default=str))
    return out


def save_resolved_arguments(output_dir, *instances):
    """Write `resolved_arguments.json` (every field after parsing) into `output_dir`."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "resolved_arguments.json")
    with open(path, "w") as f:
        json.dump(arguments_to_dict(*instances), f, indent=2, sort_keys=True)
    return path
