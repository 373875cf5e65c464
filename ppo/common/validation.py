"""Start-up checks of parsed arguments, run by every entry point before any model is loaded.

Each check returns a list of problems (empty when fine); an entry point's
`validate_arguments` (in its argument module) joins them, and `parse_arguments` reports
them with the unknown keys and bad values in one message.

`size_problems` refuses sizes and counts that would otherwise fail deep inside a run
(`ZeroDivisionError`, Paddle shape errors) or, worse, let it finish without
training (`per_device_train_batch_size -1` gives no mini-batches), and rates and coefficients
out of range; each field's range is declared on the field (`ppo/common/field_bounds.py`).

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

from .field_bounds import bound_problems

WEIGHT_FILES = ("model_state.pdparams", "model.safetensors")
SHARD_INDEX_FILES = ("model_state.pdparams.index.json", "model.safetensors.index.json")
LORA_WEIGHT_FILE = "lora_model_state.pdparams"


def size_problems(*arg_objects):
    """One problem per size, count, rate, coefficient or sampling setting of `arg_objects` outside
    its range: the rule declared on the field (`field_bounds.ranged_field`) or, for PaddleNLP's
    fields, `field_bounds.PADDLENLP_BOUNDS`."""
    return [problem for args in arg_objects for problem in bound_problems(args)]


def is_lora_dir(path):
    """Whether `path` holds a LoRA adapter (its `lora_config.json`)."""
    return bool(path) and os.path.isfile(os.path.join(path, "lora_config.json"))


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
    """True when a `config.json` dict describes a score model (reward/critic head): ours, or a Hugging
    Face `*ForSequenceClassification` (loaded through `ppo.models.hf_import`)."""
    return "score_type" in config or any(
        str(a).endswith(("ForScore", "ForSequenceClassification")) for a in config.get("architectures") or [])


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
    _check_model_type(config, config_file, arg_name)
    _check_weights(model_weight_files(path, arg_name), arg_name)
    if need_score_head and not is_score_config(config):
        archs = ", ".join(config.get("architectures") or []) or config.get("model_type", "unknown")
        raise ValueError(
            f"{arg_name}={path}: holds a {archs} without a trained score head; loading it as a score model "
            "would initialise the head at random and give meaningless rewards. Pass a reward model trained "
            "with rm/run_reward.py."
        )


def _check_model_type(config, config_file, arg_name):
    """A `model_type` no family of `ppo.common.model_families` implements is refused by name."""
    from .model_families import FAMILIES, supported

    model_type = config.get("model_type")
    if model_type is not None and model_type not in FAMILIES:
        raise ValueError(f"{arg_name}: {config_file}: model_type {model_type!r} is not supported; supported model types "
                         f"are {supported()}")


def model_dir_problems(model_dirs=(), score_model_dirs=()):
    """One problem per `(argument name, path)` that is no loadable model directory; the paths
    of `score_model_dirs` must hold a score model."""
    problems = []
    for pairs, need_score_head in ((model_dirs, False), (score_model_dirs, True)):
        for name, path in pairs:
            try:
                check_model_dir(name, path, need_score_head=need_score_head)
            except ValueError as err:
                problems.append(str(err))
    return problems


def required_problems(args, names, why=""):
    """One problem per argument of `names` that `args` leaves empty."""
    return [f"{name} is required{why}" for name in names if not getattr(args, name, None)]


def same_directory(a, b):
    return bool(a) and bool(b) and os.path.realpath(a) == os.path.realpath(b)


def output_dir_problems(output_dir, input_dirs):
    """A problem when `output_dir` is one of the input model directories `(argument name,
    path)`: saving there would replace the model the run starts from."""
    return [
        f"output_dir={output_dir} is the input model directory of {name}: the run would overwrite that model; "
        "choose another output_dir"
        for name, path in input_dirs if same_directory(output_dir, path)
    ]


def dtype_device_problems(training_args):
    """bf16/fp16 training on a Paddle build without a GPU (or other accelerator) is refused,
    naming the dtype and the device: the CPU kernels fail after the models load."""
    import paddle

    dtype = "bf16" if getattr(training_args, "bf16", False) else "fp16" if getattr(training_args, "fp16", False) else None
    if dtype is None:
        return []
    accelerated = paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu() or bool(paddle.device.get_all_custom_device_type())
    if accelerated:
        return []
    return [f"{dtype} true: this Paddle build runs on the CPU only (device {paddle.device.get_device()}), which has no "
            f"{dtype} training kernels; set {dtype} false to train in float32"]


def split_logits_problems(model_args, training_args):
    """PaddleNLP's `tensor_parallel_output` keeps the logits split over tensor-parallel ranks,
    which the losses here do not take; with one tensor-parallel rank it splits nothing (PaddleNLP
    reads it only above 1), so there it is accepted."""
    degree = getattr(training_args, "tensor_parallel_degree", 1)
    if getattr(model_args, "tensor_parallel_output", False) and degree > 1:
        return [f"tensor_parallel_output true keeps the logits split over the {degree} tensor-parallel ranks; the losses "
                "here need the gathered logits: set it to false"]
    return []


def pipeline_problems(training_args, use_lora=False):
    """Refusals of a `pipeline_parallel_degree > 1` run, each naming the argument to change."""
    degree = getattr(training_args, "pipeline_parallel_degree", 1)
    if degree <= 1:
        return []
    from paddlenlp.trainer.trainer_utils import split_parallel_config

    problems = []
    if use_lora:
        problems.append(f"use_lora with pipeline_parallel_degree {degree}: LoRA layers on pipeline stages are not "
                        "implemented here; set use_lora false or use tensor_parallel_degree")
    if "disable_p2p_cache_shape" not in split_parallel_config(training_args.pipeline_parallel_config):
        problems.append(
            f"pipeline_parallel_degree {degree}: batches here are padded to their longest row, so the activations sent "
            "between stages change shape from one micro-batch to the next; add disable_p2p_cache_shape to "
            f"pipeline_parallel_config (now {training_args.pipeline_parallel_config!r})"
        )
    return problems
