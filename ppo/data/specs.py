"""Dataset specs (`"name"`, `"name:proportion"`, `"name:proportion:path"`, lists and dicts of
them) parsed into `(name, proportion, path)` triples."""
from __future__ import annotations

import math
import os
from typing import Any, List, Optional, Tuple

from .base import RawDataset

# --------------------------------------------------------------------------- dataset specs

DatasetSpec = Tuple[str, float, Optional[str]]


def _check_proportion(value: Any, spec: Any) -> float:
    bad = f"Bad proportion {value!r} in dataset spec {spec!r}: expected a number > 0"
    if isinstance(value, bool):
        raise ValueError(bad)
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return 1.0
        try:
            value = float(text)
        except ValueError:
            raise ValueError(bad) from None
    if not isinstance(value, (int, float)) or not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(bad)
    return float(value)


def _check_name(name: Any, spec: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"Bad dataset spec {spec!r}: the dataset name is empty")
    return name.strip()


def _check_path(path: Any, spec: Any) -> Optional[str]:
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"Bad dataset spec {spec!r}: the path is empty")
    path = str(path).strip()
    if path.startswith("path="):  # PaddleNLP habit: `name:0.5:path=/x`
        path = path[len("path=") :]
    return os.path.expanduser(path)


FILE_NAME_SUFFIXES = (".jsonl", ".jsonlines", ".ndjson", ".json")
BARE_PATH_DATASET = "Jsonfile"
"""A dataset name that is a path to a .json/.jsonl file is read with this format (as
PaddleNLP's `train_datasets: ppo-kk/34567ppl/train.jsonl`)."""


def _parse_one_string(spec: str) -> DatasetSpec:
    name, _, rest = spec.partition(":")
    proportion, sep, path = rest.partition(":")  # a path may contain ':' after the second colon
    name, proportion = _check_name(name, spec), _check_proportion(proportion, spec)
    if not sep and name.lower().endswith(FILE_NAME_SUFFIXES) and name not in RawDataset._REGISTRY and name not in RawDataset._ALIAS_TO_NAME:
        return BARE_PATH_DATASET, proportion, _check_path(name, spec)
    return name, proportion, _check_path(path, spec) if sep else None


def parse_dataset_spec(spec: Any) -> List[DatasetSpec]:
    """Parse dataset specs into a list of `(name, proportion, path)`.

    Accepted forms:
    - `"name"`, `"name:proportion"`, `"name:proportion:path"` (the path may itself
      contain ':'; everything after the second colon is the path; a `path=` prefix
      is stripped); an empty proportion means 1.0;
    - a comma-separated string of those (paths with commas need the list/dict form);
    - a list whose items are such strings or tuples `(name[, proportion[, path]])`
      or `(name, {"proportion": p, "path": ...})`;
    - a dict `{name: proportion}` or `{name: {"proportion": p, "path": ...}}`.

    The same name may appear more than once (e.g. two files of one format).
    A proportion that is not a number or is <= 0 raises `ValueError` naming the spec.
    """
    out: List[DatasetSpec] = []
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
        out = [_parse_one_string(s) for s in items]
    elif isinstance(spec, dict):
        for name, attrs in spec.items():
            out.append(_parse_name_attrs(name, attrs, {name: attrs}))
    elif isinstance(spec, (list, tuple)):
        for item in spec:
            if isinstance(item, str):
                out.extend(parse_dataset_spec(item) if "," in item else [_parse_one_string(item.strip())])
            elif isinstance(item, dict):
                out.extend(parse_dataset_spec(item))
            elif isinstance(item, (list, tuple)) and 1 <= len(item) <= 3:
                if len(item) == 2 and isinstance(item[1], dict):
                    out.append(_parse_name_attrs(item[0], item[1], item))
                else:
                    name = _check_name(item[0], item)
                    proportion = _check_proportion(item[1], item) if len(item) > 1 else 1.0
                    path = _check_path(item[2], item) if len(item) > 2 else None
                    out.append((name, proportion, path))
            else:
                raise ValueError(f"Bad dataset spec {item!r}: expected a string, a (name, proportion, path) tuple or a dict")
    else:
        raise ValueError(f"Bad dataset spec {spec!r}: expected a string, a list or a dict")
    if not out:
        raise ValueError(f"Bad dataset spec {spec!r}: no dataset given")
    return out


def _parse_name_attrs(name: Any, attrs: Any, spec: Any) -> DatasetSpec:
    name = _check_name(name, spec)
    if isinstance(attrs, dict):
        unknown = set(attrs) - {"proportion", "path"}
        if unknown:
            raise ValueError(f"Bad dataset spec {spec!r}: unknown key(s) {sorted(unknown)}; allowed: proportion, path")
        proportion = _check_proportion(attrs.get("proportion", 1.0), spec)
        return name, proportion, _check_path(attrs.get("path"), spec)
    return name, _check_proportion(attrs, spec), None


def parse_dataset(string: str) -> Tuple[str, dict]:
    """PaddleNLP-compatible form of one spec: `(name, {"proportion": p[, "path": path]})`."""
    name, proportion, path = _parse_one_string(string.strip())
    attrs = {"proportion": proportion}
    if path is not None:
        attrs["path"] = path
    return name, attrs


def dataset_names(specs) -> List[str]:
    """Dataset names of `specs` (each parsed by `parse_dataset_spec`; a spec that does not parse
    is left to the dataset's own error)."""
    names: List[str] = []
    for spec in [s for s in specs or [] if s]:
        try:
            names += [name for name, _, _ in parse_dataset_spec(spec)]
        except ValueError:
            continue
    return names
