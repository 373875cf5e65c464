"""What a Hugging Face directory must hold before `hf_import.load_hf_model` builds a model from it,
checked from its `config.json` and the safetensors headers alone (no tensor is read).

`hf_model_problems(name, path)` lists, each naming the argument, the file, the key or the
tensors: an architecture or model type the import does not build (`hf_format.paddle_config`
refuses it, or `architectures` names a class other than `*ForCausalLM` /
`*ForSequenceClassification` of a supported type); a config without a field the tensor shapes
need; tensors missing, unexpected or of another shape than transformers' model of that config
holds (`hf_format.expected_hf_shapes`). The files themselves (a `config.json` that cannot be
read, weights missing, empty or cut short) are `common.validation.check_model_dir`'s.
"""
import json
import os
import struct

from . import hf_format
from .hf_files import read_json, weight_files

SUPPORTED_ARCHITECTURES = tuple(hf_format.CAUSAL_LM_ARCH.values()) + tuple(hf_format.SCORE_ARCH.values())


def header_shapes(file):
    """name -> shape of every tensor in the safetensors `file`'s header (nothing else is read)."""
    with open(file, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return {name: tuple(info["shape"]) for name, info in header.items() if name != "__metadata__"}


def architecture_problems(name, config_file, hf):
    """Why the import would not build a model of the config dict `hf` (empty when it would)."""
    unknown = [a for a in hf.get("architectures") or [] if a not in SUPPORTED_ARCHITECTURES]
    if unknown:
        return [f"{name}: {config_file}: architectures {unknown} is not imported here; supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"]
    try:
        hf_format.paddle_config(hf)
    except (ValueError, KeyError, TypeError) as err:
        text = f"the field {err} is missing" if isinstance(err, KeyError) else str(err)
        return [f"{name}: {config_file}: {text}"]
    return []


def tensor_problems(name, path, files, hf):
    """Tensors missing from, unexpected in or of another shape in the safetensors `files` than
    transformers' model of `hf` holds (`score.bias` allowed beside a score head)."""
    try:
        expected = hf_format.expected_hf_shapes(hf)
    except KeyError as err:
        return [f"{name}: {os.path.join(path, 'config.json')}: the field {err} is missing"]
    got = {}
    for file in files:
        got.update(header_shapes(file))
    if "score.weight" in expected and "score.bias" in got:
        expected["score.bias"] = (1,)
    got = {k: v for k, v in got.items()
           if "rotary_emb.inv_freq" not in k and not hf_format.is_ignored(k, hf.get("model_type"))}
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    wrong = sorted(f"{n} {list(got[n])} (expected {list(expected[n])})" for n in set(got) & set(expected)
                   if got[n] != expected[n])
    problems = []
    for what, names in (("missing", missing), ("unexpected", extra), ("of the wrong shape", wrong)):
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            problems.append(f"{name}={path}: {len(names)} tensors {what} for {hf.get('architectures') or hf.get('model_type')}: "
                            f"{shown}")
    return problems


def hf_model_problems(name, path):
    """Why the Hugging Face directory `path` (its files readable) gives no model here: its
    architecture, a missing config field, its tensors' names and shapes (one line each, naming `name`)."""
    config_file = os.path.join(path, "config.json")
    hf = read_json(config_file)
    problems = architecture_problems(name, config_file, hf)
    return problems or tensor_problems(name, path, weight_files(path), hf)
