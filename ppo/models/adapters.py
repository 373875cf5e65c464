"""LoRA adapter chains over one base model directory: causal LMs and score models.

An adapter directory (`lora_config.json` + `lora_model_state.pdparams`) names its base in
`base_model_name_or_path`. That base may itself be an adapter: a reward-model adapter
trained on the SFT adapter, a PPO policy adapter trained on the SFT adapter, a critic
adapter on the reward adapter. A chain ends at one full model directory, the only full
copy of the weights on disk. Loading a chain merges every adapter below the top one into
the base weights in memory (`LoRAModel.merge`, as TRL merges a PEFT model before adding a
new adapter), so the model holds one copy of the base weights.

A score adapter (rm/run_reward.py with `use_lora`) holds the LoRA matrices and the trained
score head (a trainable module of the adapter) in its weights, `score_type` and the
normaliser settings in its `config.json`, and the normaliser's statistics in
`score_normalizer.json`.
"""
import json
import os

from ..common.validation import is_lora_dir
from .basics import is_lora_model, load_tokenizer, lora_base_path, unwrap_parallel
from .score_model import SCORE_CONFIG_DEFAULTS, AutoModelForScore

SCORE_NORMALIZER_FILE = "score_normalizer.json"
SCORE_HEAD_MODULES = ["score_head.*"]
"""`trainable_modules` of a score-model adapter (regexes matched in full against weight names)."""
MAX_CHAIN = 16
MERGE_TOOL = "python sft/merge_lora.py --lora_path ADAPTER --output_dir MERGED"


def score_lora_settings(lora_settings):
    """`lora_settings` (an `apply_lora` keyword dict) with the score head added to its trainable modules."""
    return {**lora_settings, "trainable_modules": SCORE_HEAD_MODULES + list(lora_settings.get("trainable_modules") or [])}


def adapter_chain(path):
    """`(base_dir, [adapter dirs, the base's first])` of the adapter chain ending at `path`
    (an empty list when `path` is a full model directory)."""
    adapters = []
    while is_lora_dir(path):
        if path in adapters or len(adapters) >= MAX_CHAIN:
            raise ValueError(f"{path}: LoRA adapters name each other as base_model_name_or_path in a loop: {adapters}")
        adapters.append(path)
        path = lora_base_path(path)
    return path, adapters[::-1]


def read_config(path):
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        return {}
    with open(file) as f:
        return json.load(f)


def is_score_adapter(path):
    """True when the adapter in `path` was trained as a score model (its `config.json` has `score_type`)."""
    return is_lora_dir(path) and "score_type" in read_config(path)


def refuse_tensor_parallel(path, config_overrides, what):
    """Merging adapters in memory needs whole (unsplit) LoRA layers: refuse tensor parallel."""
    if int(config_overrides.get("tensor_parallel_degree", 1) or 1) > 1:
        raise ValueError(
            f"{what}={path}: merging a LoRA adapter in memory (an adapter chain, a score-model adapter, or an adapter "
            f"given with use_lora) with tensor_parallel_degree > 1 is not implemented here; merge it into a full model "
            f"first ({MERGE_TOOL}) and pass the merged directory"
        )


def merge_lora_model(lora_model):
    """The plain model of `lora_model` with the adapter merged into its weights: each LoRA layer
    becomes the plain `nn.Linear` it wrapped (without a bias when it had none, unlike
    `LoRAModel.restore_original_model`), and every weight is trainable again, as in a freshly
    loaded model."""
    import paddle.nn as nn
    from paddlenlp.peft.lora.lora_layers import LoRALinear

    lora_model.merge()
    model = lora_model.model
    for name, layer in list(model.named_sublayers()):
        if not isinstance(layer, LoRALinear):
            continue
        parent = model
        for part in name.split(".")[:-1]:
            parent = getattr(parent, part)
        plain = nn.Linear(layer.weight.shape[0], layer.weight.shape[1], bias_attr=False if layer.bias is None else None)
        plain.weight = layer.weight
        if layer.bias is not None:
            plain.bias = layer.bias
        setattr(parent, name.split(".")[-1], plain)
    for param in model.parameters():
        param.stop_gradient = False
    return model


def wrap_with_adapter(model, adapter_dir):
    """`model` wrapped in the `LoRAModel` of `adapter_dir` (its LoRA and trainable-module weights loaded)."""
    from paddlenlp.peft import LoRAModel

    return LoRAModel.from_pretrained(model=model, lora_path=adapter_dir)


def score_settings_of(path):
    """The score-model config fields saved in `path`'s `config.json` (score_type, normaliser)."""
    config = read_config(path)
    return {key: config[key] for key in SCORE_CONFIG_DEFAULTS if key in config}


def load_normalizer_stats(model, adapter_dir):
    """Set the normaliser buffers of the score model under `model` from `adapter_dir`'s file, if any."""
    import paddle

    file = os.path.join(adapter_dir, SCORE_NORMALIZER_FILE)
    if not os.path.isfile(file):
        return
    with open(file) as f:
        stats = json.load(f)
    inner = model.model if is_lora_model(model) else model
    for key in ("mean", "var", "count"):
        if key not in stats:
            raise ValueError(f"{file}: field {key!r} is missing")
        getattr(inner, f"normalizer_{key}").set_value(paddle.to_tensor([float(stats[key])], dtype="float32"))


def save_normalizer_stats(model, output_dir):
    """Write the normaliser statistics of a LoRA score model under `model`'s wrappers into
    `output_dir` (a full model saves them with its weights: nothing to do). Returns the file or None."""
    lora = unwrap_parallel(model)
    if not is_lora_model(lora) or not hasattr(lora.model, "normalizer_mean"):
        return None
    inner = lora.model
    stats = {key: float(getattr(inner, f"normalizer_{key}").numpy()[0]) for key in ("mean", "var", "count")}
    os.makedirs(output_dir, exist_ok=True)
    file = os.path.join(output_dir, SCORE_NORMALIZER_FILE)
    with open(file, "w") as f:
        json.dump(stats, f, indent=1)
    return file


def load_score_model(path, dtype="float32", **config_overrides):
    """A score model from a full directory, or a `LoRAModel` over a score model from an adapter
    (adapters below it merged). The adapter's saved score settings apply unless overridden. A
    Hugging Face directory (a one-label `*ForSequenceClassification`, or a causal LM whose backbone
    gets a new head) is converted in memory (`ppo.models.hf_import`)."""
    from .hf_files import is_hf_dir

    if is_hf_dir(path):
        from .hf_import import load_hf_model

        return load_hf_model(path, dtype=dtype, score=True, **config_overrides)
    if not is_lora_dir(path):
        return AutoModelForScore.from_pretrained(path, dtype=dtype, **config_overrides)
    refuse_tensor_parallel(path, config_overrides, "score model")
    settings = {**score_settings_of(path), **config_overrides}
    base = load_merged_score_model(lora_base_path(path), dtype, **settings)
    model = wrap_with_adapter(base, path)
    load_normalizer_stats(model, path)
    return model


def load_merged_score_model(path, dtype="float32", **config_overrides):
    """`load_score_model` with every adapter merged: a plain `<Arch>ModelForScore`."""
    model = load_score_model(path, dtype, **config_overrides)
    return merge_lora_model(model) if is_lora_model(model) else model


def load_causal_lm(path, dtype="float32", base_model_name_or_path=None, **config_overrides):
    """A `CausalLM` from a model directory, or a `LoRAModel` from an adapter directory.
    An adapter whose base is itself an adapter (see the module docstring) gets that chain
    merged into the base weights in memory first. A Hugging Face safetensors directory
    (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`) is converted in memory
    (`ppo.models.hf_import`); a PaddleNLP-layout directory of a family with our own classes
    (`ppo.models.families`) loads with them.
    `config_overrides` (e.g. `use_flash_attention=True`) are set on the model config."""
    if is_lora_dir(path):
        from paddlenlp.peft import LoRAModel

        base_path = base_model_name_or_path or lora_base_path(path)
        base = load_merged_causal_lm(base_path, dtype=dtype, **config_overrides)
        return LoRAModel.from_pretrained(model=base, lora_path=path)
    from .hf_files import is_hf_dir

    if is_hf_dir(path):  # a Hugging Face safetensors directory (ppo.models.hf_import)
        from .hf_import import load_hf_model

        return load_hf_model(path, dtype=dtype, score=False, **config_overrides)
    from .families import causal_lm_from_pretrained

    return causal_lm_from_pretrained(path, dtype=dtype, **config_overrides)


def load_merged_causal_lm(path, dtype="float32", **config_overrides):
    """A plain causal LM from a full directory or an adapter chain (every adapter merged)."""
    if is_lora_dir(path):
        refuse_tensor_parallel(path, config_overrides, "causal LM")
    model = load_causal_lm(path, dtype=dtype, **config_overrides)
    return merge_lora_model(model) if is_lora_model(model) else model


def merge_adapter_to_dir(adapter_dir, output_dir):
    """Merge the adapter chain ending at `adapter_dir` into a full model directory (weights,
    config, tokenizer): a score model (normaliser statistics included) that
    `AutoModelForScore.from_pretrained` loads when it is a score adapter, else a causal LM
    that `AutoModelForCausalLM.from_pretrained` loads. Returns the merged model."""
    if is_score_adapter(adapter_dir):
        merged = load_merged_score_model(adapter_dir)
    else:
        merged = load_merged_causal_lm(adapter_dir)
    merged.save_pretrained(output_dir)
    load_tokenizer(adapter_dir).save_pretrained(output_dir)
    return merged
