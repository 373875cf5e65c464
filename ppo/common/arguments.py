"""Parse flat JSON argument files plus command-line overrides into dataclasses.

`parse_arguments((ModelArgument, DataArgument, MyTrainingArguments))` reads
`sys.argv[1:]`: an optional first `*.json` file, then `--flag value` overrides
(command line wins). Unknown keys, in the file or on the command line, are an
error naming the key and the closest valid one. A relative JSON path that does
not exist from the working directory resolves against the repository root, so
`cd ppo && python run_ppo.py config/llama/ppo_argument.json` works too.
"""
import dataclasses
import difflib
import json
import os
import sys

SECRET_FIELDS = ("reward_server_token",)  # shown as "<hidden>" in resolved_arguments.json
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{where}: unknown argument '{key}'{hint}"


def read_json_arguments(path, valid):
    """Return the JSON file's keys as a `--key value` list; raise on unknown keys or bad JSON."""
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ArgumentError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    if not isinstance(data, dict):
        raise ArgumentError(f"{path}: the argument file must hold one JSON object, got {type(data).__name__}")
    argv = []
    for key, value in data.items():
        if key not in valid:
            raise ArgumentError(unknown_key_message(key, valid, path))
        if value is None:
            continue  # a null keeps the dataclass default
        if isinstance(value, list):
            argv.extend([f"--{key}", *[str(v) for v in value]])
        elif isinstance(value, dict):
            argv.extend([f"--{key}", json.dumps(value)])
        else:
            argv.extend([f"--{key}", str(value)])
    return argv


def parse_arguments(dataclass_types, argv=None):
    """Parse `[config.json] [--key value ...]` into one instance per dataclass type."""
    from paddlenlp.trainer import PdArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    valid = valid_field_names(dataclass_types)
    file_args = []
    if argv and argv[0].endswith(".json"):
        file_args = read_json_arguments(resolve_config_path(argv[0]), valid)
        argv = argv[1:]
    for token in argv:
        if token.startswith("--"):
            key = token[2:].split("=", 1)[0]
            if key not in valid:
                raise ArgumentError(unknown_key_message(key, valid, "command line"))
    parser = PdArgumentParser(dataclass_types)
    *parsed, remaining = parser.parse_args_into_dataclasses(
        args=file_args + argv, return_remaining_strings=True, look_for_args_file=False
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
