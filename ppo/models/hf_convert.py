"""Our models to and from Hugging Face safetensors directories (Llama, Qwen2, Qwen3; causal LM or score model).

Export (`export_model`, `export_dir`): a causal LM becomes `LlamaForCausalLM` /
`Qwen2ForCausalLM` / `Qwen3ForCausalLM`; a score model (reward, cost, critic) becomes
`LlamaForSequenceClassification` / `Qwen2ForSequenceClassification` /
`Qwen3ForSequenceClassification` with one label, its head as
`score.weight` [1, H] (plus `score.bias` [1] when the head has a bias, which transformers' class
does not have), and `score_type`, the normaliser settings and its statistics
(`normalizer_mean`, `normalizer_var`, `normalizer_count`) in `config.json`. A LoRA adapter (or a
chain of them) is merged into its base first. Weights keep their dtype.

Import (`load_hf_model`, `import_dir`): the reverse, for causal LMs and one-label
sequence-classification models (a TRL reward model, or one exported here); `ppo.models.adapters`
calls `load_hf_model` when a model path holds a Hugging Face directory, so `model_name_or_path`
may point at one. Names and layouts: `ppo.models.hf_format`; files: `ppo.models.hf_files`.
"""
import os

from . import hf_files, hf_format
from .hf_files import (  # noqa: F401 (the directory helpers, re-exported for the scripts and tests)
    HF_TOKENIZER_FILES,
    SENTENCEPIECE_FILE,
    copy_tokenizer,
    is_hf_dir,
    read_json,
    write_json,
)

GENERATION_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def state_numpy(model):
    """name -> numpy array of `model`'s state dict (bfloat16 as `uint16` bits)."""
    return {name: value.numpy() for name, value in model.state_dict().items()}


def model_dtype(model):
    """The dtype of `model`'s weights (of its first floating-point parameter)."""
    for param in model.parameters():
        name = str(param.dtype).replace("paddle.", "")
        if name in hf_format.DTYPES:
            return name
    raise ValueError(f"{type(model).__name__} has no float32/float16/bfloat16 parameter")


def is_score_model(model):
    return hasattr(model, "score_head")


def score_settings(model):
    """The score fields and normaliser statistics `hf_format.hf_config` writes for a score model."""
    config = model.config
    settings = {key: getattr(config, key) for key in hf_format.SCORE_FIELDS if hasattr(config, key)}
    for key in hf_format.NORMALIZER_STATS:
        settings[key] = float(getattr(model, key).astype("float32").numpy()[0])
    return settings


def check_names(tensors, hf_config):
    """Raise unless `tensors` has exactly the names and shapes transformers expects for `hf_config`
    (`score.bias` allowed beside a score head)."""
    expected = hf_format.expected_hf_shapes(hf_config)
    if "score.weight" in expected and "score.bias" in tensors:
        expected["score.bias"] = (1,)
    got = {name: tuple(value.shape) for name, value in tensors.items()}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(f"{n}: {got[n]} != {expected[n]}" for n in set(got) & set(expected) if got[n] != expected[n])
    if missing or extra or wrong:
        raise ValueError(f"Hugging Face tensors do not match transformers' names: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}, wrong shapes {wrong[:5]}")


def export_model(model, output_dir, max_shard_bytes=hf_files.DEFAULT_MAX_SHARD_BYTES, layout="both"):
    """Write the plain (LoRA-merged) causal LM or score `model` as a Hugging Face directory:
    safetensors, `config.json` (rotary fields in `layout`, `hf_rope.LAYOUTS`) and, for a causal LM,
    `generation_config.json`. Returns the config dict."""
    cfg = model.config.to_dict()
    score = score_settings(model) if is_score_model(model) else None
    dtype = model_dtype(model)
    hf_config = hf_format.hf_config(cfg, dtype, score=score, layout=layout)
    lm_head = getattr(model, "lm_head", None)
    transposed = getattr(lm_head, "transpose_y", None) if lm_head is not None else None
    tensors = hf_format.hf_tensors(state_numpy(model), cfg, lm_head_transposed=transposed)
    check_names(tensors, hf_config)
    os.makedirs(output_dir, exist_ok=True)
    hf_files.write_safetensors(tensors, output_dir, max_shard_bytes)
    write_json(hf_config, os.path.join(output_dir, "config.json"))
    if score is None:
        generation = {key: cfg[key] for key in GENERATION_FIELDS if cfg.get(key) is not None}
        write_json(generation, os.path.join(output_dir, "generation_config.json"))
    return hf_config


def tokenizer_dir(path):
    """The directory holding `path`'s tokenizer (the base model's for a LoRA adapter without one)."""
    from ..common.validation import is_lora_dir
    from .basics import lora_base_path

    while is_lora_dir(path) and not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        path = lora_base_path(path)
    return path


def saved_dtype(path):
    """The dtype a model directory (or the base at the end of an adapter chain) was saved in."""
    from .adapters import adapter_chain

    base, _ = adapter_chain(path)
    return read_json(os.path.join(base, "config.json")).get("dtype") or "float32"


def holds_score_model(path):
    """True when the model directory or adapter `path` is a score model (its own `config.json`
    names `score_type` or a `*ForScore` architecture)."""
    file = os.path.join(path, "config.json")
    config = read_json(file) if os.path.isfile(file) else {}
    return "score_type" in config or any(str(a).endswith("ForScore") for a in config.get("architectures") or [])


def load_plain_model(path):
    """The causal LM or score model of `path` (an adapter chain merged) in its saved dtype."""
    from .adapters import load_merged_causal_lm, load_merged_score_model

    dtype = saved_dtype(path)
    if holds_score_model(path):
        return load_merged_score_model(path, dtype=dtype)
    return load_merged_causal_lm(path, dtype=dtype)


def export_dir(path, output_dir, max_shard_bytes=hf_files.DEFAULT_MAX_SHARD_BYTES, dtype=None, layout="both",
               before_writing=None):
    """Export the model directory or LoRA adapter `path` (see `export_model`) with its tokenizer
    files, in its saved dtype or `dtype`; `before_writing(output_dir)` runs once the model has
    loaded. Returns `(config dict, tokenizer files written)`."""
    model = load_plain_model(path)
    if dtype is not None and dtype != model_dtype(model):
        model.to(dtype=dtype)
    if before_writing is not None:
        before_writing(output_dir)
    hf_config = export_model(model, output_dir, max_shard_bytes, layout=layout)
    return hf_config, copy_tokenizer(tokenizer_dir(path), output_dir, to_hf=True)
