"""PaddleNLP's task files (`train_task_config`, `eval_task_config`, `ptx_task_config`): several
data files mixed by weight, read into our dataset specs.

The format is the one PaddleNLP's RLHF docs point to (`config/task_ppo.json`, from the ERNIE
RLHF toolkit): a JSON list of sources, each `{"filepath": PATH, "prob": WEIGHT}` with an
optional `"task_name"` (named in errors). Files are PaddleNLP `src`/`tgt` records (`Jsonfile`).
A relative path not found from the working directory is read beside the task file.

Weights are relative, and met by sub-sampling only: the source with the largest weight per
record is read whole and source i gives `round(n_i * p_i)` records with
`p_i = (prob_i / n_i) / max_j(prob_j / n_j)` (a seeded sub-sample), which is
`Jsonfile:<p_i>:<path>` in our specs. No file is repeated to meet a weight: prompt sets are
de-duplicated (a repeated prompt is the same group again), so counts follow the weights up to
rounding, and an epoch is as long as that mix allows. Prompts dropped later for length
(`max_prompt_len`) are dropped from those counts.
"""
import json
import math
import os

TASK_FILE_FORMAT = "Jsonfile"
TASK_KEYS = ("filepath", "prob", "task_name")


def _records_in(path, where):
    """Records of a `.jsonl` file (non-empty lines) or of a `.json` file holding a list;
    ValueError naming `where` (the task file and entry) and `path` when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path.endswith(".json") and text.lstrip().startswith("["):
            return len(json.loads(text))
    except OSError as err:
        raise ValueError(f"{where}: cannot read {path} ({err.strerror})") from None
    except ValueError as err:  # invalid JSON or not UTF-8
        raise ValueError(f"{where}: {path} does not hold UTF-8 JSON records ({err})") from None
    return sum(1 for line in text.splitlines() if line.strip())


def _source(entry, index, task_file):
    """`(path, weight, records)` of one task-file entry; ValueError naming the file and the entry."""
    where = f"{task_file}: entry {index}" + (f" ({entry['task_name']!r})" if isinstance(entry, dict) and "task_name" in entry else "")
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object with filepath and prob, got {entry!r}")
    unknown = sorted(set(entry) - set(TASK_KEYS))
    if unknown or "filepath" not in entry:
        raise ValueError(f"{where}: keys are {', '.join(TASK_KEYS)} (filepath required), got {sorted(entry)}")
    weight = entry.get("prob", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        raise ValueError(f"{where}: prob must be a number >= 0, got {weight!r}")
    path = os.path.expanduser(str(entry["filepath"]))
    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(os.path.dirname(os.path.abspath(task_file)), path)
    if not os.path.isfile(path):
        raise ValueError(f"{where}: filepath {entry['filepath']!r} is not a file")
    return path, float(weight), _records_in(path, where)


def task_file_specs(task_file):
    """Dataset specs (`"Jsonfile:<proportion>:<path>"`) mixing the task file's sources by their
    weights (see the module docstring); sources of weight 0 are left out."""
    try:
        with open(task_file, encoding="utf-8") as f:
            entries = json.load(f)
    except OSError as err:
        raise ValueError(f"{task_file}: cannot read the task file ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{task_file}: invalid JSON at line {err.lineno}: {err.msg}") from None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{task_file}: expected a JSON list of {{\"filepath\", \"prob\"}} objects")
    sources = [_source(e, i, task_file) for i, e in enumerate(entries)]
    sources = [s for s in sources if s[1] > 0]
    empty = [p for p, _, n in sources if n == 0]
    if not sources or empty:
        raise ValueError(f"{task_file}: " + (f"no records in {empty}" if empty else "every source has prob 0"))
    densest = max(w / n for _, w, n in sources)
    return [f"{TASK_FILE_FORMAT}:{w / n / densest!r}:{p}" for p, w, n in sources]
