"""Load tokenizers and causal LMs from local directories, with optional LoRA.

A directory holding `lora_config.json` is a LoRA adapter: its base model is read
from `base_model_name_or_path` in that file (or given explicitly) and wrapped
with `paddlenlp.peft.LoRAModel`. `disable_lora()` on such a model gives the
base model's outputs with no second copy of the base weights.
"""
import contextlib
import json
import os

DEFAULT_LORA_TARGETS = ".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj).*"


def is_lora_dir(path):
    return bool(path) and os.path.isfile(os.path.join(path, "lora_config.json"))


def lora_base_path(lora_dir):
    with open(os.path.join(lora_dir, "lora_config.json")) as f:
        base = json.load(f).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{lora_dir}/lora_config.json: field 'base_model_name_or_path' is empty; pass the base model path")
    return base


def load_tokenizer(path):
    """The tokenizer of `path`, or of the base model when `path` is a LoRA adapter."""
    from paddlenlp.transformers import AutoTokenizer

    if is_lora_dir(path) and not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        path = lora_base_path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        raise ValueError(f"{path}: the tokenizer has no pad token; set pad_token in tokenizer_config.json")
    return tokenizer


def apply_lora(
    model, rank=8, alpha=16, target_modules=DEFAULT_LORA_TARGETS, base_model_name_or_path=None, trainable_modules=None
):
    """Wrap `model` in a fresh `LoRAModel`; only the adapter weights (and `trainable_modules`
    regexes, e.g. a score head) stay trainable."""
    from paddlenlp.peft import LoRAConfig, LoRAModel

    targets = [t.strip() for t in target_modules.split(",")] if isinstance(target_modules, str) else list(target_modules)
    config = LoRAConfig(
        target_modules=targets,
        trainable_modules=trainable_modules,
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        merge_weights=False,
        base_model_name_or_path=base_model_name_or_path,
        dtype=str(model.config.dtype) if getattr(model.config, "dtype", None) else None,
    )
    lora_model = LoRAModel(model, config)
    lora_model.mark_only_lora_as_trainable()
    return lora_model


def load_causal_lm(path, dtype="float32", base_model_name_or_path=None, **config_overrides):
    """A `CausalLM` from a model directory, or a `LoRAModel` from an adapter directory.
    `config_overrides` (e.g. `use_flash_attention=True`) are set on the model config."""
    from paddlenlp.transformers import AutoModelForCausalLM

    if is_lora_dir(path):
        from paddlenlp.peft import LoRAModel

        base_path = base_model_name_or_path or lora_base_path(path)
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype, **config_overrides)
        return LoRAModel.from_pretrained(model=base, lora_path=path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **config_overrides)


def training_dtype(training_args):
    """Model dtype for the `bf16` / `fp16` flags of `TrainingArguments`."""
    return "bfloat16" if training_args.bf16 else "float16" if training_args.fp16 else "float32"


def load_overrides(model_args, training_args):
    """Config overrides every model of a run is loaded with: flash attention and, with
    tensor parallelism, this rank's shard (PaddleNLP's `tensor_parallel_*` config)."""
    overrides = {"use_flash_attention": model_args.use_flash_attention}
    if training_args.tensor_parallel_degree > 1:
        overrides.update(
            tensor_parallel_degree=training_args.tensor_parallel_degree,
            tensor_parallel_rank=training_args.tensor_parallel_rank,
            tensor_parallel_output=False,
        )
    return overrides


def is_lora_model(model):
    return type(model).__name__ == "LoRAModel"


def freeze(model):
    """Eval mode and no gradients for every parameter."""
    model.eval()
    for p in model.parameters():
        p.stop_gradient = True
    return model


def load_reference(policy, policy_path, ref_path=None, dtype="float32", **overrides):
    """A frozen reference model, or None when `policy` is a LoRA model whose disabled
    adapter serves as the reference (one copy of the base weights)."""
    if is_lora_model(policy) and (not ref_path or ref_path == policy_path):
        return None
    reference = freeze(set_dropout_off(load_causal_lm(ref_path or policy_path, dtype=dtype, **overrides)))
    if is_lora_model(reference):
        reference.merge()
    return reference


def unwrap_parallel(model):
    """`model` without its DataParallel / fleet (sharding, tensor/pipeline parallel) wrappers,
    which all keep the wrapped layer in `_layers`; a LoRA wrapper stays (it saves as an adapter)."""
    while hasattr(model, "_layers"):
        model = model._layers
    return model


def find_lora_model(model):
    """The `LoRAModel` under DataParallel / sharding wrappers, or None."""
    model = unwrap_parallel(model)
    return model if is_lora_model(model) else None


@contextlib.contextmanager
def lora_disabled(model):
    """Within the block, the LoRA adapter under `model`'s wrappers is off (the base model's
    outputs, e.g. as the reference); yields that `LoRAModel`. Raises if there is none."""
    lora_model = find_lora_model(model)
    if lora_model is None:
        raise ValueError(f"{type(unwrap_parallel(model)).__name__} has no LoRA adapter to disable")
    lora_model.disable_lora()
    try:
        yield lora_model
    finally:
        lora_model.enable_lora()


def unwrap_model(model):
    """The innermost PaddleNLP model under DataParallel / sharding / LoRA wrappers."""
    while True:
        model = unwrap_parallel(model)
        if is_lora_model(model):
            model = model.model
        else:
            return model


def set_dropout_off(model):
    """Zero every dropout probability in `model` (DESIGN: dropout off in all four models)."""
    import paddle.nn as nn

    config = getattr(unwrap_model(model), "config", None)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "hidden_dropout"):
        if config is not None and hasattr(config, name):
            setattr(config, name, 0.0)
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, nn.Dropout):
            layer.p = 0.0
    return model


def merge_lora_to_dir(lora_dir, output_dir, base_model_name_or_path=None):
    """Merge a LoRA adapter into its base weights and save a plain model directory
    (weights and tokenizer) that `AutoModelForCausalLM.from_pretrained` loads."""
    lora_model = load_causal_lm(lora_dir, base_model_name_or_path=base_model_name_or_path)
    lora_model.merge()
    merged = lora_model.restore_original_model()
    merged.save_pretrained(output_dir)
    load_tokenizer(lora_dir).save_pretrained(output_dir)
    return merged
