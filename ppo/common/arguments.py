"""Parse JSON or YAML argument files plus command-line overrides into dataclasses.

`parse_arguments((ModelArgument, DataArgument, MyTrainingArguments))` reads
`sys.argv[1:]`: an optional first `*.json` / `*.yaml` / `*.yml` file, then
`--flag value` overrides (command line wins). PaddleNLP's keys are read through
the table in `paddlenlp_keys` (renamed keys, keys accepted only with PaddleNLP's
default, unsupported keys). Every key that cannot be used, in the file and on the
command line, is reported in ONE `ArgumentError` listing them all, each with its
hint. A relative argument-file path that does not exist from the working directory
resolves against the repository root, so `cd ppo && python run_ppo.py
config/llama/ppo_argument.json` works too.
"""
import dataclasses
import difflib
import json
import os
import sys

from . import paddlenlp_keys as pk

SECRET_FIELDS = ("reward_server_token",)  # shown as "<hidden>" in resolved_arguments.json

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGUMENT_FILE_EXTENSIONS = (".json", ".yaml", ".yml")


class ArgumentError(ValueError):
    """A bad argument file or flag; the message names the file and the key."""


def resolve_config_path(path):
    """`path` as given if it exists, else relative to the repository root."""
    if os.path.exists(path) or os.path.isabs(path):
        if not os.path.exists(path):
            raise ArgumentError(f"argument file not found: {path}")
        return path
    candidate = os.path.join(REPO_ROOT, path)
    if os.path.exists(candidate):
        return candidate
    raise ArgumentError(f"argument file not found: {path} (also looked in {candidate})")


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
    if key in pk.UNSUPPORTED:
        return f"{where}: '{key}' is not supported here (PaddleNLP: {pk.UNSUPPORTED[key]})"
    return unknown_key_message(key, valid, where)


def load_argument_file(path):
    """The argument file's top-level mapping (JSON, or YAML for .yaml/.yml)."""
    if path.lower().endswith((".yaml", ".yml")):
        import yaml

        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ArgumentError(f"{path}: invalid YAML{where}: {getattr(e, 'problem', e)}") from e
    else:
        try:
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ArgumentError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    if not isinstance(data, dict):
        raise ArgumentError(f"{path}: the argument file must hold one mapping of keys to values, got {type(data).__name__}")
    return data


def translate_keys(data, valid, where, problems, fixed_fields=()):
    """`data` with PaddleNLP keys renamed to ours (values translated); accepted fixed-value
    keys dropped; every unusable key appended to `problems`. `fixed_fields`: fields of the
    entry point that run at `paddlenlp_keys.PPO_FIXED_VALUE`'s values only."""
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
            new_value = convert(value, data) if value is not None else None
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
            raise ArgumentError(f"command line: '{token}' comes before any --flag")
        else:
            out[key].append(token)
    return {k: (v[0] if len(v) == 1 else ("true" if not v else v)) for k, v in out.items()}


def joined_problems(problems):
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} arguments cannot be used:\n  " + "\n  ".join(problems)


def parse_arguments(dataclass_types, argv=None):
    """Parse `[args.json|args.yaml] [--key value ...]` into one instance per dataclass type."""
    from paddlenlp.trainer import PdArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    valid = set(valid_field_names(dataclass_types))
    fixed_fields = {k for dt in dataclass_types for k in getattr(dt, "paddlenlp_fixed_fields", ())}
    problems = []
    file_data = {}
    if argv and argv[0].lower().endswith(ARGUMENT_FILE_EXTENSIONS):
        path = resolve_config_path(argv[0])
        file_data = translate_keys(load_argument_file(path), valid, path, problems, fixed_fields)
        argv = argv[1:]
    cli_data = translate_keys(command_line_to_dict(argv), valid, "command line", problems, fixed_fields)
    if problems:
        raise ArgumentError(joined_problems(problems))
    parser = PdArgumentParser(dataclass_types)
    *parsed, remaining = parser.parse_args_into_dataclasses(
        args=file_arguments_to_argv(file_data) + file_arguments_to_argv(cli_data),
        return_remaining_strings=True,
        look_for_args_file=False,
    )
    if remaining:
        raise ArgumentError(f"command line: could not use {remaining}")
    return tuple(parsed)


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
