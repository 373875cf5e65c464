"""The model plumbing every other module of `ppo.models` uses: unwrapping a model from its
DataParallel / fleet / LoRA wrappers, switching a LoRA adapter off, freezing, dropout off, and
the tokenizer (and base path) of a model or adapter directory. It imports no other module of
`ppo.models`, so the loading, adapter and forward-pass modules can all stand on it.
"""
import contextlib
import json
import os

import paddle.nn as nn

from ..common.validation import is_lora_dir


def lora_base_path(lora_dir):
    with open(os.path.join(lora_dir, "lora_config.json")) as f:
        base = json.load(f).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{lora_dir}/lora_config.json: field 'base_model_name_or_path' is empty; pass the base model path")
    return base


def load_tokenizer(path):
    """The tokenizer of `path`, or of the base model when `path` is a LoRA adapter."""
    from paddlenlp.transformers import AutoTokenizer

    while is_lora_dir(path) and not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        path = lora_base_path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        raise ValueError(f"{path}: the tokenizer has no pad token; set pad_token in tokenizer_config.json")
    return tokenizer


def is_lora_model(model):
    return type(model).__name__ == "LoRAModel"


def freeze(model):
    """Eval mode and no gradients for every parameter."""
    model.eval()
    for p in model.parameters():
        p.stop_gradient = True
    return model


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
    """Zero every dropout probability in `model` (every RL path here runs its models without dropout)."""
    import paddle.nn as nn

    config = getattr(unwrap_model(model), "config", None)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "hidden_dropout"):
        if config is not None and hasattr(config, name):
            setattr(config, name, 0.0)
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, nn.Dropout):
            layer.p = 0.0
    return model
