"""The model plumbing every other module of `ppo.models` uses: unwrapping a model from its
DataParallel / fleet / LoRA wrappers, switching a LoRA adapter off, freezing, dropout off, and
the tokenizer (and base path) of a model or adapter directory. It imports no other module of
`ppo.models`, so the loading, adapter and forward-pass modules can all stand on it.
"""
import contextlib
import json
import os
import re

import paddle.nn as nn

from ..common.validation import is_lora_dir
from ..data.chat_templates import checkpoint_template_source, install_chat_template


def lora_base_path(lora_dir):
    with open(os.path.join(lora_dir, "lora_config.json")) as f:
        base = json.load(f).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{lora_dir}/lora_config.json: field 'base_model_name_or_path' is empty; pass the base model path")
    return base


def load_tokenizer(path):
    """The tokenizer of `path`, or of the base model when `path` is a LoRA adapter, with the
    checkpoint's chat template read and rendered as transformers does (`ppo.data.chat_templates`)."""
    from paddlenlp.transformers import AutoTokenizer

    while is_lora_dir(path) and not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        path = lora_base_path(path)
    source, origin = checkpoint_template_source(path)
    # ours replaces PaddleNLP's compile of the template (which refuses transformers' list of named templates)
    tokenizer = AutoTokenizer.from_pretrained(path, **({"chat_template": None} if source is not None else {}))
    if tokenizer.pad_token_id is None:
        raise ValueError(f"{path}: the tokenizer has no pad token; set pad_token in tokenizer_config.json")
    keep_added_tokens_whole(tokenizer)
    return install_chat_template(tokenizer, source, origin) if source is not None else tokenizer


def keep_added_tokens_whole(tokenizer):
    """Tokenise every added token that is not special (Qwen3's `<think>`, `<tool_call>`) as one
    token, the text around it as it is: transformers' rule for added tokens. PaddleNLP's slow
    tokenizers reload those of `added_tokens_decoder` as vocabulary entries only and tokenise their
    text character by character (and, listed as unsplittable, would strip the newlines around them)."""
    special = set(tokenizer.all_special_tokens)
    added = [str(t) for t in getattr(tokenizer, "added_tokens_encoder", {}) if str(t) not in special]
    if not added:
        return tokenizer
    tokenizer.tokenize = AddedTokensWhole(tokenizer.tokenize, added)
    return tokenizer


class AddedTokensWhole:
    """A tokenizer's `tokenize` that first cuts the text at the `added` tokens, keeps each whole and
    tokenises the pieces between them with `tokenize` (a picklable callable)."""

    def __init__(self, tokenize, added):
        self.inner, self.added = tokenize, set(added)
        self.pattern = re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")

    def __call__(self, text, **kwargs):
        return [t for p in self.pattern.split(text) if p for t in ([p] if p in self.added else self.inner(p, **kwargs))]


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
