"""Reading local record files with the line number of every record, and field checks.

Sources: `.jsonl` (one JSON object a line; blank lines skipped), `.json` (a list of
objects, or `{"data": [...]}`; a `.json` file holding JSON lines is read as such),
and directories written by HF `datasets` `save_to_disk` (a `Dataset`, or a
`DatasetDict` from which the split is taken). A plain directory is searched for
`{split}.jsonl` / `{split}.json`. Every error is a `DataError` naming the file,
the 1-based line (or record, for `save_to_disk` data) and the field.
"""
from __future__ import annotations

import json
import os
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple

from .base import DataError, RawDataset, RawSample

__all__ = ["Record", "read_records", "resolve_path", "LocalFileDataset", "field_keys"]

JSONL_EXTENSIONS = (".jsonl", ".jsonlines", ".ndjson")


class Record:
    """One input record: its data plus where it came from, with typed field getters.

    `keys` maps a field name of the record's format to the name this file uses for it (set
    from `prompt_key` / `response_key`): every getter, `has` and `error` take the format's
    name and read, or name in the error, the file's."""

    __slots__ = ("data", "path", "line", "unit", "keys")

    def __init__(self, data: dict, path: str, line: int, unit: str = "line", keys: Optional[dict] = None) -> None:
        self.data, self.path, self.line, self.unit = data, path, line, unit
        self.keys = keys or {}

    def key(self, field: str) -> str:
        """The name this record gives the format's field `field`."""
        return self.keys.get(field, field)

    def error(self, reason: str, field: Optional[str] = None) -> DataError:
        return DataError(reason, path=self.path, line=self.line, field=None if field is None else self.key(field), unit=self.unit)

    def has(self, field: str) -> bool:
        return self.data.get(self.key(field)) is not None

    def get(self, field: str, types: Tuple[type, ...], required: bool = True, default: Any = None) -> Any:
        key = self.key(field)
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.error("missing field", field)
            return default
        value = self.data[key]
        if bool not in types and isinstance(value, bool) and int in types:
            raise self.error(f"expected {_type_names(types)}, got bool {value!r}", field)
        if not isinstance(value, types):
            raise self.error(f"expected {_type_names(types)}, got {type(value).__name__} {_short(value)}", field)
        return value

    def get_str(self, field: str, required: bool = True, default: Any = None, nonempty: bool = False, what: str = "") -> Any:
        value = self.get(field, (str,), required, default)
        if nonempty and value is not None and not value.strip():
            raise self.error(f"empty {what or field}", field)
        return value

    def get_bool(self, field: str, required: bool = True) -> Optional[bool]:
        return self.get(field, (bool,), required)

    def get_choice(self, field: str, choices: Tuple[int, ...], required: bool = True) -> Optional[int]:
        value = self.get(field, (int,), required)
        if value is not None and value not in choices:
            raise self.error(f"expected one of {list(choices)}, got {value!r}", field)
        return value

    def get_str_list(self, field: str, required: bool = True, allow_str: bool = False) -> Optional[List[str]]:
        """A list of strings (a plain string becomes `[s]` when `allow_str`)."""
        types = (list, str) if allow_str else (list,)
        value = self.get(field, types, required)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise self.error(f"expected a list of strings, item {i} is {type(v).__name__} {_short(v)}", field)
        return list(value)

    def get_user_turns(self, field: str = "src") -> List[str]:
        """The user turns of a `src` field (a string or a list of strings), none of them empty."""
        turns = self.get_str_list(field, allow_str=True)
        if not turns:
            raise self.error("empty prompt (no user turn)", field)
        for i, turn in enumerate(turns):
            if not turn.strip():
                raise self.error(f"empty prompt (user turn {i})", field)
        return turns


def _type_names(types: Tuple[type, ...]) -> str:
    names = {str: "string", bool: "boolean", int: "integer", list: "list", dict: "object", float: "number"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_hf_dataset_dir(path: str) -> bool:
    return any(
        os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json", "dataset_info.json")
    )


def resolve_path(path: Optional[str], dataset_name: str, split: str = "train") -> str:
    """The file or directory to read for `path`; `DataError` naming it when missing."""
    if path is None or not str(path).strip():
        raise DataError(
            f"dataset '{dataset_name}' needs a local path (spec '{dataset_name}:1:/path/to/file'); none was given. "
            f"Nothing is downloaded here: save the records (e.g. the Hugging Face dataset exported as JSON lines, "
            f"or a `datasets.save_to_disk` directory) locally and give that path",
            field="path",
        )
    path = os.path.expanduser(str(path))
    if not os.path.exists(path):
        raise DataError(f"file not found (dataset '{dataset_name}')", path=path)
    if os.path.isdir(path) and not _is_hf_dataset_dir(path):
        for ext in JSONL_EXTENSIONS + (".json",):
            candidate = os.path.join(path, split + ext)
            if os.path.isfile(candidate):
                return candidate
        raise DataError(
            f"directory is neither a `datasets.save_to_disk` directory nor holds {split}.jsonl/{split}.json "
            f"(dataset '{dataset_name}')",
            path=path,
        )
    return path


def read_records(path: str, split: str = "train") -> Iterator[Record]:
    """Yield every record of `path` (already resolved) as a `Record` with its 1-based line."""
    if os.path.isdir(path):
        yield from _read_hf_dir(path, split)
        return
    lower = path.lower()
    if lower.endswith(JSONL_EXTENSIONS):
        yield from _read_jsonl(path)
    elif lower.endswith(".json"):
        yield from _read_json(path)
    else:
        raise DataError("unsupported file type: expected .jsonl, .json or a `datasets.save_to_disk` directory", path=path)


def _read_text(path: str) -> str:
    """The UTF-8 text of `path`; a leading byte-order mark (as some editors write) is dropped,
    and a byte that is not UTF-8 is reported by line and column."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"not UTF-8 text: byte 0x{raw[e.start]:02x} at column {column} ({e.reason}); save the file as UTF-8",
            path=path, line=line,
        ) from None


def _as_record(obj: Any, path: str, line: int, unit: str = "line") -> Record:
    if not isinstance(obj, dict):
        raise DataError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line, unit=unit)
    return Record(obj, path, line, unit)


def _read_jsonl(path: str) -> Iterator[Record]:
    text = _read_text(path)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path=path, line=lineno) from None
        yield _as_record(obj, path, lineno)


def _read_json(path: str) -> Iterator[Record]:
    text = _read_text(path)
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON lines in a .json file
            yield from _read_jsonl(path)
            return
        raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path=path, line=e.lineno) from None
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, 0)
    if text.startswith("[", pos):
        items = _scan_array(decoder, text, pos)
    elif text.startswith("{", pos):
        items = _scan_data_member(decoder, text, pos, path)
    else:
        raise DataError("expected a JSON list of records or an object with a 'data' list", path=path, line=1)
    for line, obj in items:
        yield _as_record(obj, path, line)


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _scan_array(decoder: json.JSONDecoder, text: str, pos: int) -> List[Tuple[int, Any]]:
    """Items of the JSON array starting at `text[pos] == '['`, each with its 1-based line.

    The text is known to be valid JSON, so the scan needs no error handling.
    """
    items, line, counted = [], 1, 0
    pos = _skip_ws(text, pos + 1)
    while text[pos] != "]":
        line += text.count("\n", counted, pos)
        counted = pos
        obj, pos = decoder.raw_decode(text, pos)
        items.append((line, obj))
        pos = _skip_ws(text, pos)
        if text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
    return items


def _scan_data_member(decoder: json.JSONDecoder, text: str, pos: int, path: str) -> List[Tuple[int, Any]]:
    """Items of the `data` list of the top-level object starting at `text[pos] == '{'`."""
    pos = _skip_ws(text, pos + 1)
    while text[pos] != "}":
        key, pos = decoder.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        pos = _skip_ws(text, pos + 1)  # ':'
        if key == "data" and text[pos] == "[":
            return _scan_array(decoder, text, pos)
        _, pos = decoder.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        if text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
    raise DataError("expected a JSON list of records or an object with a 'data' list", path=path, line=1, field="data")


def _read_hf_dir(path: str, split: str) -> Iterator[Record]:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets ships with paddlenlp
        raise DataError("reading a `save_to_disk` directory needs the `datasets` package", path=path) from None
    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:  # noqa: BLE001 - report any failure as a data error naming the path
        raise DataError(f"cannot load `datasets` directory: {e}", path=path) from None
    if isinstance(ds, datasets.DatasetDict):
        if split in ds:
            ds = ds[split]
        elif len(ds) == 1:
            ds = next(iter(ds.values()))
        else:
            raise DataError(f"no split '{split}' (splits: {', '.join(ds.keys())})", path=path)
    for i, row in enumerate(ds):
        yield _as_record(dict(row), path, i + 1, unit="record")


class LocalFileDataset(RawDataset):
    """A raw dataset read from a local file or directory, every record converted at load time.

    Subclasses set `NAME`/`ALIASES`, optionally `SPLIT` (the split taken from a
    `DatasetDict` or the `{split}.jsonl` looked for in a plain directory) and `FIELD_ROLES`,
    and implement `convert(record) -> RawSample` using the `Record` getters, so that
    a bad record raises `DataError` with file, line and field while loading.

    `stream=True` reads no record: the instance only converts the records that
    `ppo.data.streaming.StreamingDataset` reads one at a time (PaddleNLP's `lazy`).

    `prompt_key` / `response_key` (PaddleNLP's and verl's names) read the format's prompt field
    and reference-answer field (`FIELD_ROLES["prompt"]`, `FIELD_ROLES["response"]`, e.g.
    Jsonfile's `src` and `tgt`) from the fields they name; None keeps the format's names. A key
    for a role the format has no single field for is a `DataError` naming the key.
    """

    SPLIT = "train"
    FIELD_ROLES: ClassVar[Dict[str, str]] = {}
    """`{"prompt": field, "response": field}`: the fields `prompt_key` / `response_key` rename."""

    def __init__(self, path: Optional[str] = None, split: Optional[str] = None, prompt_key: Optional[str] = None,
                 response_key: Optional[str] = None, stream: bool = False) -> None:
        name = getattr(type(self), "NAME", type(self).__name__)
        self.field_keys = field_keys(type(self), name, prompt=prompt_key, response=response_key)
        self.split = split or self.SPLIT
        self.path = resolve_path(path, name, self.split)
        self.data, self.locations = [], []
        if stream:  # records are read one at a time by `ppo.data.streaming` and given to `convert`
            return
        records = list(read_records(self.path, self.split))
        for record in records:
            record.keys = self.field_keys
        self.data: List[RawSample] = [self.convert(record) for record in records]
        self.locations: List[str] = [f"{r.path}, {r.unit} {r.line}" for r in records]  # for later error messages

    def convert(self, record: Record) -> RawSample:
        raise NotImplementedError

    def __getitem__(self, index: int) -> RawSample:
        return self.data[index]

    def __len__(self) -> int:
        return len(self.data)


def field_keys(cls: type, name: str, **keys: Optional[str]) -> Dict[str, str]:
    """`{format field: file field}` for the given role keys (`prompt=`, `response=`) of the
    dataset class `cls` registered as `name`; a key for a role `cls` has no field for, or an
    empty key, raises `DataError` naming the `<role>_key` argument."""
    roles = getattr(cls, "FIELD_ROLES", {})
    out = {}
    for role, key in keys.items():
        if key is None:
            continue
        if not isinstance(key, str) or not key.strip():
            raise DataError(f"expected a field name, got {key!r}", field=f"{role}_key")
        own = roles.get(role)
        if own is None:
            readers = sorted(n for n, c in RawDataset._REGISTRY.items() if getattr(c, "FIELD_ROLES", {}).get(role))
            raise DataError(
                f"{role}_key {key!r}: dataset '{name}' has no single {role} field to read from another key "
                f"({role}_key applies to {', '.join(readers)}); leave {role}_key unset for it",
                field=f"{role}_key",
            )
        if key != own:
            out[own] = key
    return out
