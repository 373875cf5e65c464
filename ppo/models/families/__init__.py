"""Model families: one registry entry per Hugging Face / PaddleNLP `model_type`.

An entry carries what callers need to know about a family: the prefix of its decoder in a
PaddleNLP state dict, transformers' class names for export, whether its attention has q/k
norms (the rollout engine reads them), and, for the families whose Paddle classes are written
here (PaddleNLP 3.0.0b4 has no Qwen3), the module that holds them and their Hugging Face config
mapping. Llama and Qwen2 use PaddleNLP's classes and `ppo.models.hf_format`'s mapping
(``module`` None). Adding a family is a module and one line in `FAMILIES` (`ppo.common.model_families`, the
table itself, importable by the start-up checks); callers read the entry's facts, never its name.

A family module provides ``CONFIG_CLASS``, ``CAUSAL_LM_CLASS``, ``BASE_MODEL_CLASS``,
``PRETRAINED_CLASS``, ``paddle_config(hf) -> config kwargs``, ``hf_fields(cfg) -> config.json
fields`` and ``extra_hf_shapes(hf, layer_prefix) -> {name: shape}`` of one layer; optionally
``split_fused_experts(tensors)`` (Hugging Face tensors as our per-expert names, on import),
``hub_names(tensors)`` (the reverse, on export, where the hub's names differ: Mixtral's) and
``IGNORED_HF_TENSORS`` (substrings of tensor names transformers skips on load).
"""
import importlib
import json
import os

from ...common.model_families import FAMILIES, Family, get_family, supported  # noqa: F401 (the registry, re-exported)


def family_module(model_type):
    """The module of a family with its own classes (see the module docstring), or None."""
    family = FAMILIES.get(model_type)
    return importlib.import_module(family.module) if family is not None and family.module else None


def dir_model_type(path):
    """``model_type`` of the ``config.json`` in directory `path` (None when absent)."""
    file = os.path.join(str(path), "config.json")
    if not os.path.isfile(file):
        return None
    with open(file) as f:
        return json.load(f).get("model_type")


def load_config(path, **kwargs):
    """The config of model directory `path`: the family's own class, else PaddleNLP's `AutoConfig`."""
    module = family_module(dir_model_type(path))
    if module is not None:
        return module.CONFIG_CLASS.from_pretrained(path, **kwargs)
    from paddlenlp.transformers import AutoConfig

    return AutoConfig.from_pretrained(path, **kwargs)


def causal_lm_from_pretrained(path, dtype="float32", **config_overrides):
    """The causal LM of PaddleNLP-layout directory `path` (our class for our families, else
    PaddleNLP's `AutoModelForCausalLM`)."""
    module = family_module(dir_model_type(path))
    if module is not None:
        return module.CAUSAL_LM_CLASS.from_pretrained(path, dtype=dtype, **config_overrides)
    from paddlenlp.transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **config_overrides)
