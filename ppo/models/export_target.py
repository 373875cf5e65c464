"""Where `scripts/export_hf.py` may write, and the marker that makes its exports recognisable.

An export writes `paddle_align_export.json` (`MARKER`) beside its files: the model it came
from and the names of the files it wrote. A directory may receive an export when it holds no
model files (`config.json`, weights, an adapter's or an index's JSON) other than those an
earlier export listed there; a directory holding another model (a reward model's copy, a
checkpoint) is refused unless `--overwrite` is given, and then that model's files are removed
first, so the directory never holds two models at once. The exported model's own directory
(or, for a LoRA adapter, any base model in its chain) is refused even with `--overwrite`: the
export would replace what it reads.
"""
import json
import os

MARKER = "paddle_align_export.json"
WEIGHT_SUFFIXES = (".safetensors", ".pdparams", ".pdopt", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt")
MODEL_JSON = ("config.json", "adapter_config.json", "lora_config.json", "generation_config.json")


def is_model_file(name):
    """Whether the file `name` belongs to a model (weights, its config, an index of shards)."""
    return name in MODEL_JSON or name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json")


def earlier_export(output_dir):
    """The marker of an earlier export in `output_dir` (a dict), or None."""
    path = os.path.join(output_dir, MARKER)
    try:
        with open(path) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("files"), list) else None


def foreign_model_files(output_dir):
    """The model files in `output_dir` that no earlier export of ours wrote (sorted names)."""
    if not os.path.isdir(output_dir):
        return []
    ours = set((earlier_export(output_dir) or {}).get("files", []))
    return sorted(name for name in os.listdir(output_dir)
                  if is_model_file(name) and name not in ours and os.path.isfile(os.path.join(output_dir, name)))


def read_models(model_path):
    """`model_path` and, for a LoRA adapter, every base model down its chain."""
    from ..common.validation import is_lora_dir

    paths, path = [model_path], model_path
    while is_lora_dir(path):
        with open(os.path.join(path, "lora_config.json")) as f:
            path = json.load(f).get("base_model_name_or_path")
        if not path or path in paths:
            break
        paths.append(path)
    return paths


def export_target_problems(output_dir, model_path, overwrite):
    """Why `output_dir` may not receive the export of `model_path` (a list of one-line problems)."""
    from ..common.validation import same_directory

    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        return [f"output_dir={output_dir} is a file, not a directory; choose a directory"]
    read = [path for path in read_models(model_path) if same_directory(output_dir, path)]
    if read:
        what = "--model_path" if read[0] == model_path else f"the base model {read[0]} of the adapter --model_path"
        return [f"output_dir={output_dir} is {what}: the export would replace the model it reads; choose another "
                "output_dir (--overwrite does not allow this)"]
    foreign = foreign_model_files(output_dir)
    if foreign and not overwrite:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        return [f"output_dir={output_dir} holds a model that is not an earlier export of this script ({shown}): the "
                "export would replace it; choose another output_dir, or pass --overwrite to replace that model"]
    return []


def clear_for_export(output_dir):
    """Remove what an earlier export listed in `output_dir` and any other model files there
    (`export_target_problems` has allowed it); returns the names removed."""
    if not os.path.isdir(output_dir):
        return []
    listed = (earlier_export(output_dir) or {}).get("files", [])
    removed = sorted(set(n for n in listed if os.path.isfile(os.path.join(output_dir, n))) |
                     set(foreign_model_files(output_dir)))
    for name in removed + [MARKER]:
        if os.path.isfile(os.path.join(output_dir, name)):
            os.remove(os.path.join(output_dir, name))
    return removed


def mark_export(output_dir, model_path, tokenizer_files):
    """Write the marker: the source and every file the export wrote (the model files now in
    `output_dir`, which `clear_for_export` emptied of others, and `tokenizer_files`)."""
    files = sorted(set(n for n in os.listdir(output_dir) if is_model_file(n)) | set(tokenizer_files))
    with open(os.path.join(output_dir, MARKER), "w") as f:
        json.dump({"exported_by": "scripts/export_hf.py", "model_path": os.path.abspath(model_path), "files": files},
                  f, indent=2)
    return files
