"""Start-up checks of parsed arguments, run by every entry point before any model is loaded.

`check_sizes` refuses sizes and counts that would otherwise fail deep inside a run
(`ZeroDivisionError`, Paddle shape errors) or, worse, let it finish without
training (`per_device_train_batch_size -1` gives no mini-batches). It names every
bad argument at once.

`check_model_dir` checks a model directory the way `from_pretrained` would read
it, but with errors that name the argument and the path: the directory exists
(PaddleNLP would otherwise treat a missing local path as a hub name and try the
network), `config.json` is there, weights are present and not empty or cut short,
a LoRA adapter's base model passes the same checks, and a score head is present
where one is needed (a causal LM given as a reward model would be loaded with a
randomly initialised head and produce meaningless rewards).
"""
import json
import os
import struct

# Smallest valid value of every size/count argument of the entry points (absent
# fields are skipped; None means "unset" and is skipped too).
MIN_VALUES = {
    "per_device_train_batch_size": 1,
    "per_device_eval_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "per_device_prompt_batch_size": 1,
    "rollout_n": 1,
    "max_dec_len": 1,
    "min_dec_len": 0,
    "update_iters": 1,
    "max_gen_batches": 1,
    "max_nan_skips": 0,
    "max_prompt_len": 1,
    "max_length": 1,
    "eval_max_new_tokens": 0,
    "eval_long_answer_len": 0,
    "num_sample_generations": 0,
    "save_steps": 0,
    "logging_steps": 1,
    "eval_steps": 0,
    "lora_rank": 1,
    "batch_size": 1,
    "long_answer_tokens": 1,
    "reward_server_retries": 0,
    "divergence_window": 2,
}
FLOATS_ABOVE = {"reward_server_timeout": 0.0, "divergence_factor": 1.0}  # exclusive lower bounds

WEIGHT_FILES = ("model_state.pdparams", "model.safetensors")
SHARD_INDEX_FILES = ("model_state.pdparams.index.json", "model.safetensors.index.json")
LORA_WEIGHT_FILE = "lora_model_state.pdparams"


def check_sizes(*arg_objects):
    """Raise one ValueError naming every size/count argument below its minimum."""
    problems = []
    for args in arg_objects:
        for name, minimum in MIN_VALUES.items():
            value = getattr(args, name, None)
            if value is None or isinstance(value, bool):
                continue
            if not isinstance(value, (int, float)) or value != int(value) or value < minimum:
                problems.append(f"{name}={value!r} (must be an integer >= {minimum})")
        for name, bound in FLOATS_ABOVE.items():
            value = getattr(args, name, None)
            if value is not None and not value > bound:
                problems.append(f"{name}={value!r} (must be > {bound:g})")
    if problems:
        raise ValueError("invalid argument(s): " + "; ".join(problems))


def looks_local(path):
    """True unless `path` may be a model-hub id (`name` or `org/name` whose `org` is no local folder)."""
    if os.path.isabs(path) or path.startswith((".", "~")):
        return True
    parts = path.split("/")
    return len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0]))


def weights_problem(file):
    """Why the weight file `file` cannot be read (None when it looks complete).

    `.pdparams` files are pickles, which end with the STOP opcode `.`; a
    `.safetensors` file starts with the 8-byte length of a JSON header whose
    tensors' `data_offsets` must fit in the file. Both checks read a few bytes only.
    """
    size = os.path.getsize(file)
    if size == 0:
        return "is empty"
    with open(file, "rb") as f:
        if file.endswith(".safetensors"):
            head = f.read(8)
            if len(head) < 8:
                return f"is cut short ({size} bytes)"
            (header_len,) = struct.unpack("<Q", head)
            if 8 + header_len > size:
                return f"is cut short (header of {header_len} bytes, file of {size})"
            try:
                header = json.loads(f.read(header_len))
            except ValueError:
                return "has an unreadable safetensors header"
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + header_len + end > size:
                return f"is cut short ({size} bytes, its header needs {8 + header_len + end})"
        else:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b".":
                return f"is cut short or not a Paddle weights file ({size} bytes, no end-of-pickle marker)"
    return None


def _read_json(file, arg_name):
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"{arg_name}: cannot read {file}: {err}") from None


def model_weight_files(path, arg_name):
    """The weight files of the model directory `path` (sharded checkpoints through their index)."""
    for name in SHARD_INDEX_FILES:
        index = os.path.join(path, name)
        if os.path.isfile(index):
            shards = sorted(set(_read_json(index, arg_name).get("weight_map", {}).values()))
            if not shards:
                raise ValueError(f"{arg_name}: {index} lists no weight files")
            return [os.path.join(path, s) for s in shards]
    found = [os.path.join(path, n) for n in WEIGHT_FILES if os.path.isfile(os.path.join(path, n))]
    if not found:
        raise ValueError(f"{arg_name}={path}: no model weights (looked for {', '.join(WEIGHT_FILES + SHARD_INDEX_FILES)})")
    return found


def _check_weights(files, arg_name):
    for file in files:
        if not os.path.isfile(file):
            raise ValueError(f"{arg_name}: weight file {file} is missing")
        problem = weights_problem(file)
        if problem:
            raise ValueError(f"{arg_name}: weight file {file} {problem}; re-save or re-copy the model")


def is_score_config(config):
    """True when a `config.json` dict describes a score model (reward/critic head)."""
    return "score_type" in config or any(str(a).endswith("ForScore") for a in config.get("architectures") or [])


def check_model_dir(arg_name, path, need_score_head=False, _adapters=()):
    """Raise ValueError (naming `arg_name` and `path`) unless `path` is a loadable model directory.

    A LoRA adapter directory (`lora_config.json`) needs its adapter weights and a
    valid base model. With `need_score_head`, a full model must be a score model
    (`config.json` with `score_type` or a `*ForScore` architecture), an adapter a
    score-model adapter (its `config.json` with `score_type`).
    """
    if not path:
        return
    if not os.path.exists(path):
        if looks_local(path):
            raise ValueError(f"{arg_name}={path}: no such directory")
        return  # a model-hub id; PaddleNLP resolves it
    if not os.path.isdir(path):
        raise ValueError(f"{arg_name}={path}: is a file, expected a model directory")
    lora_config = os.path.join(path, "lora_config.json")
    if os.path.isfile(lora_config):
        _check_weights([os.path.join(path, LORA_WEIGHT_FILE)], arg_name)
        base = _read_json(lora_config, arg_name).get("base_model_name_or_path")
        if not base:
            raise ValueError(f"{arg_name}: {lora_config} has no base_model_name_or_path")
        if need_score_head and "score_type" not in _read_json(os.path.join(path, "config.json"), arg_name):
            raise ValueError(
                f"{arg_name}={path}: a LoRA adapter without a trained score head (its config.json has no score_type); "
                "pass a reward model or a score-model adapter trained with rm/run_reward.py"
            )
        if os.path.abspath(base) in _adapters + (os.path.abspath(path),):
            raise ValueError(f"{arg_name}: LoRA adapters name each other as base_model_name_or_path in a loop ({lora_config})")
        check_model_dir(f"{arg_name} (LoRA base model named in {lora_config})", base,
                        _adapters=_adapters + (os.path.abspath(path),))
        return
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ValueError(f"{arg_name}={path}: no config.json; is this a model directory?")
    config = _read_json(config_file, arg_name)
    _check_weights(model_weight_files(path, arg_name), arg_name)
    if need_score_head and not is_score_config(config):
        archs = ", ".join(config.get("architectures") or []) or config.get("model_type", "unknown")
        raise ValueError(
            f"{arg_name}={path}: holds a {archs} without a trained score head; loading it as a score model "
            "would initialise the head at random and give meaningless rewards. Pass a reward model trained "
            "with rm/run_reward.py."
        )


def validate_run(arg_objects, model_dirs=(), score_model_dirs=()):
    """The start-up checks of one entry point: sizes of every argument object, the packages its
    `report_to` needs (`report_packages` of the arguments' class, PaddleNLP's Trainer integrations
    by default), then each `(argument name, path)` in `model_dirs` and (score head required)
    `score_model_dirs`."""
    from .report_writers import TRAINER_PACKAGES, missing_report_packages

    check_sizes(*arg_objects)
    for args in arg_objects:
        if getattr(args, "report_to", None):
            problems = missing_report_packages(args.report_to, getattr(args, "report_packages", TRAINER_PACKAGES))
            if problems:
                raise ValueError("; ".join(problems))
    for name, path in model_dirs:
        check_model_dir(name, path)
    for name, path in score_model_dirs:
        check_model_dir(name, path, need_score_head=True)
