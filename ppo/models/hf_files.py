"""Read and write Hugging Face safetensors directories with numpy (no torch).

`write_safetensors(tensors, output_dir, max_shard_bytes)` writes `model.safetensors`, or, when
the tensors pass `max_shard_bytes`, `model-00001-of-0000N.safetensors` shards and
`model.safetensors.index.json` (`{"metadata": {"total_size": bytes}, "weight_map": {name: file}}`),
the names `transformers`' `save_pretrained` uses. Tensors keep their dtype; a `uint16` array is
written as `BF16` (its bits are bfloat16, as `paddle.Tensor.numpy()` returns them), float32 and
float16 through `safetensors.numpy`. `read_safetensors(path)` reads either layout back (BF16 as
`uint16`); the header's `format` metadata is `pt`, which `transformers` checks for.
`is_hf_dir(path)` tells such a directory from a PaddleNLP one; `copy_tokenizer` copies the
tokenizer files between the two layouts.
"""
import json
import os
import shutil
import struct

import numpy as np

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
METADATA = {"format": "pt"}
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


def parse_size(text):
    """Bytes of a size such as `5GB`, `500MB`, `2GiB` or a plain integer."""
    text = str(text).strip().upper()
    units = {"GIB": 1024**3, "MIB": 1024**2, "KIB": 1024, "GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def plan_shards(tensors, max_shard_bytes):
    """Tensor names per shard, in the given order; a shard closes before it would pass
    `max_shard_bytes` (a single larger tensor gets a shard of its own)."""
    shards, current, size = [], [], 0
    for name, value in tensors.items():
        if current and size + value.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += value.nbytes
    if current:
        shards.append(current)
    return shards


def _save_file(tensors, path):
    """One safetensors file; `uint16` arrays are written as BF16 through safetensors' serializer."""
    from safetensors import numpy as st_numpy

    if not any(v.dtype == np.uint16 for v in tensors.values()):
        st_numpy.save_file(tensors, path, metadata=METADATA)
        return
    from safetensors import TensorSpec, serialize_file

    keep = {name: np.ascontiguousarray(value) for name, value in tensors.items()}
    specs = {
        name: TensorSpec(dtype="bfloat16" if value.dtype == np.uint16 else value.dtype.name, shape=value.shape,
                         data_ptr=value.ctypes.data, data_len=value.nbytes)
        for name, value in keep.items()
    }
    serialize_file(specs, path, metadata=METADATA)


def remove_old_weights(output_dir):
    """Remove the safetensors files and index an earlier export left in `output_dir` (a smaller
    export would otherwise leave shards that its index does not name)."""
    for name in os.listdir(output_dir):
        if name == SAFE_INDEX or (name.startswith("model") and name.endswith(".safetensors")):
            os.remove(os.path.join(output_dir, name))


def write_safetensors(tensors, output_dir, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES):
    """Write `tensors` (name -> numpy array) into `output_dir`, replacing the weights of an earlier
    export there; returns the files written."""
    bad = [f"{name} ({value.dtype})" for name, value in tensors.items()
           if value.dtype not in (np.float32, np.float16, np.uint16)]
    if bad:
        raise ValueError(f"only float32, float16 and bfloat16 (uint16 bits) tensors are written; got {bad}")
    os.makedirs(output_dir, exist_ok=True)
    remove_old_weights(output_dir)
    shards = plan_shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        _save_file(tensors, os.path.join(output_dir, SAFE_WEIGHTS))
        return [SAFE_WEIGHTS]
    files, weight_map = [], {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _save_file({name: tensors[name] for name in names}, os.path.join(output_dir, file))
        weight_map.update({name: file for name in names})
        files.append(file)
    index = {"metadata": {"total_size": int(sum(v.nbytes for v in tensors.values()))}, "weight_map": weight_map}
    with open(os.path.join(output_dir, SAFE_INDEX), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
    return files + [SAFE_INDEX]


def _header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return 8 + length, json.loads(f.read(length))


def read_file(path):
    """name -> numpy array of one safetensors file (BF16 as `uint16`, memory-mapped)."""
    from safetensors import safe_open

    start, header = _header(path)
    out = {}
    with safe_open(path, framework="np") as f:
        for name in f.keys():
            info = header[name]
            if info["dtype"] == "BF16":
                begin, end = info["data_offsets"]
                shape = tuple(info["shape"])
                count = (end - begin) // 2
                out[name] = np.memmap(path, dtype=np.uint16, mode="r", offset=start + begin, shape=(count,)).reshape(shape)
            else:
                out[name] = f.get_tensor(name)
    return out


def weight_files(path):
    """The safetensors files of the directory `path` (through its index when sharded)."""
    index = os.path.join(path, SAFE_INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return [os.path.join(path, file) for file in sorted(set(weight_map.values()))]
    single = os.path.join(path, SAFE_WEIGHTS)
    if os.path.isfile(single):
        return [single]
    raise ValueError(f"{path}: no {SAFE_WEIGHTS} or {SAFE_INDEX}")


def read_safetensors(path):
    """name -> numpy array of every tensor in the safetensors directory `path`."""
    out = {}
    for file in weight_files(path):
        tensors = read_file(file)
        twice = sorted(set(out) & set(tensors))
        if twice:
            raise ValueError(f"{file}: tensors also in another shard: {twice[:5]}")
        out.update(tensors)
    return out


HF_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
)
SENTENCEPIECE_FILE = "sentencepiece.bpe.model"
"""The file name of PaddleNLP's `LlamaTokenizer` vocabulary; transformers' `LlamaTokenizer` reads `tokenizer.model`."""


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(obj, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def is_hf_dir(path):
    """True when `path` holds a Hugging Face model directory: a `config.json` and safetensors whose
    header says `format: pt` (what transformers writes; PaddleNLP writes `np`) or whose tensor
    names carry transformers' `model.` prefix (PaddleNLP's start with `llama.` / `qwen2.`)."""
    if not path or not os.path.isfile(os.path.join(str(path), "config.json")):
        return False
    try:
        files = weight_files(path)
    except ValueError:
        return False
    from safetensors import safe_open

    with safe_open(files[0], framework="np") as f:
        return (f.metadata() or {}).get("format") == "pt" or any(k.startswith("model.") for k in f.keys())


def copy_tokenizer(source_dir, output_dir, to_hf=True):
    """Copy the tokenizer files of `source_dir` into `output_dir`; returns the names written.
    A SentencePiece vocabulary is written under both names (`sentencepiece.bpe.model` for
    PaddleNLP's `LlamaTokenizer`, `tokenizer.model` for transformers')."""
    written = []
    names = set(HF_TOKENIZER_FILES) | {SENTENCEPIECE_FILE}
    for name in sorted(os.listdir(source_dir)):
        if name in names:
            shutil.copyfile(os.path.join(source_dir, name), os.path.join(output_dir, name))
            written.append(name)
    spm_pair = ("sentencepiece.bpe.model", "tokenizer.model") if to_hf else ("tokenizer.model", "sentencepiece.bpe.model")
    config = os.path.join(source_dir, "tokenizer_config.json")
    sentencepiece = os.path.isfile(config) and read_json(config).get("tokenizer_class", "").startswith("LlamaTokenizer")
    src, dst = spm_pair
    if sentencepiece and os.path.isfile(os.path.join(source_dir, src)) and dst not in written:
        shutil.copyfile(os.path.join(source_dir, src), os.path.join(output_dir, dst))
        written.append(dst)
    if sentencepiece and to_hf and "tokenizer_config.json" in written:
        _state_the_dummy_prefix(os.path.join(output_dir, "tokenizer_config.json"), os.path.join(output_dir, dst))
    return written


def _state_the_dummy_prefix(config_file, model_file):
    """Write `add_prefix_space` into an exported SentencePiece tokenizer's config when the model adds
    no dummy prefix: transformers 5 rebuilds `LlamaTokenizer` from `tokenizer.model` and prepends
    "▁" to every text unless told so (transformers 4 read the model's own setting)."""
    import sentencepiece as spm

    config = read_json(config_file)
    if "add_prefix_space" in config or not os.path.isfile(model_file):
        return
    pieces = spm.SentencePieceProcessor(model_file=model_file).encode("a", out_type=str)
    config["add_prefix_space"] = bool(pieces) and pieces[0].startswith("\u2581")
    with open(config_file, "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
