"""Reading one argument file (JSON, or YAML for .yaml/.yml) into its top-level mapping.

Errors name the file and the line: invalid syntax, a byte that is not UTF-8, a key given
twice (JSON and YAML would silently keep the last value), a top level that is not a
mapping. A UTF-8 byte-order mark (some Windows editors write one) is accepted. A relative
path that does not exist from the working directory resolves against the repository root,
and `~` is expanded.
"""
import json
import os
import re

from .argument_problems import ArgumentError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGUMENT_FILE_EXTENSIONS = (".json", ".yaml", ".yml")


def resolve_config_path(path):
    """`path` as given (after `~`) if it exists, else relative to the repository root."""
    path = os.path.expanduser(path)
    if os.path.exists(path) or os.path.isabs(path):
        if not os.path.exists(path):
            raise ArgumentError(f"argument file not found: {path}")
        return path
    candidate = os.path.join(REPO_ROOT, path)
    if os.path.exists(candidate):
        return candidate
    raise ArgumentError(f"argument file not found: {path} (also looked in {candidate})")


def argument_file_token_problem(token):
    """Why a first command-line word that is no `--flag` cannot be an argument file (None
    when it names a .json/.yaml/.yml file, which `resolve_config_path` then looks up)."""
    expanded = os.path.expanduser(token)
    if os.path.isdir(expanded) or os.path.isdir(os.path.join(REPO_ROOT, expanded)):
        return f"{token} is a directory; give the argument file inside it (a .json, .yaml or .yml file)"
    if token.lower().endswith(ARGUMENT_FILE_EXTENSIONS):
        return None
    if os.path.isfile(expanded):
        return (f"{token}: argument files are read by their extension and must end in .json, .yaml or .yml "
                f"(rename it, e.g. to {os.path.splitext(token)[0]}.json)")
    return f"command line: '{token}' is neither a --flag nor an argument file (.json, .yaml or .yml)"


def read_text(path):
    """The file's text; a leading UTF-8 BOM is dropped; a byte that is not UTF-8 is reported by line."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise ArgumentError(
            f"{path}: line {line}, column {column}: byte 0x{raw[err.start]:02x} is not UTF-8; save the file as UTF-8"
        ) from None


def key_lines(text, key):
    """1-based line numbers where `"key":` appears in JSON text."""
    pattern = re.compile(re.escape(json.dumps(key)) + r"\s*:")
    return [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]


def load_json(path, text):
    duplicates = []

    def refuse_duplicates(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                duplicates.append(key)
            seen.add(key)
        return dict(pairs)

    try:
        data = json.loads(text, object_pairs_hook=refuse_duplicates)
    except json.JSONDecodeError as err:
        raise ArgumentError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    if duplicates:
        lines = "; ".join(
            f"'{key}' on lines {' and '.join(map(str, key_lines(text, key)))}" for key in dict.fromkeys(duplicates)
        )
        raise ArgumentError(f"{path}: key given twice (keep one): {lines}")
    return data


def load_yaml(path, text):
    import yaml

    class DuplicateRefusingLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ArgumentError(f"{path}: key given twice (keep one): '{key}' on lines {seen[key]} and {line}")
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(text, Loader=DuplicateRefusingLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ArgumentError(f"{path}: invalid YAML{where}: {getattr(err, 'problem', err)}") from None


def load_argument_file(path):
    """The argument file's top-level mapping (JSON, or YAML for .yaml/.yml)."""
    text = read_text(path)
    data = load_yaml(path, text) if path.lower().endswith((".yaml", ".yml")) else load_json(path, text)
    if not isinstance(data, dict):
        raise ArgumentError(f"{path}: the argument file must hold one mapping of keys to values, got {type(data).__name__}")
    return data
