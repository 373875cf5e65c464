"""The model-family table: one entry per Hugging Face / PaddleNLP `model_type`, with the facts
callers need (pure data, no imports of model code, so the start-up checks can name the supported
list before anything loads). The Paddle classes and config mappings of the families written here
live in the modules the entries name (`ppo.models.families`)."""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Family:
    model_type: str
    prefix: str
    """Attribute of the decoder in the causal LM, and its state-dict prefix (``qwen3.layers.0...``)."""
    causal_lm_arch: str
    score_arch: str
    """transformers' class names written into an exported ``config.json``."""
    module: Optional[str] = None
    """Module holding our own Paddle classes and config mapping; None: PaddleNLP's classes."""
    qk_norm: bool = False
    """Attention applies RMSNorm to each q and k head before RoPE (``self_attn.q_norm`` / ``k_norm``)."""
    moe: bool = False
    """Some layers' MLP is a routed mixture of experts (`ppo.models.families.moe`)."""
    experts_key: Optional[str] = None
    """The family's own config key of its routed expert count (transformers' name), read first;
    our saved configs may carry ``num_experts`` instead."""
    rope_interleaved: bool = False
    """RoPE rotates the pairs ``(2i, 2i + 1)`` of each head (GPT-J / GLM style) instead of
    ``(i, i + head_dim / 2)``; the rollout engine reorders q/k columns to its half layout."""


FAMILIES = {f.model_type: f for f in (
    Family("llama", "llama", "LlamaForCausalLM", "LlamaForSequenceClassification"),
    Family("qwen2", "qwen2", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification"),
    Family("qwen3", "qwen3", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification",
           module="ppo.models.families.qwen3", qk_norm=True),
    Family("qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification",
           module="ppo.models.families.qwen3_moe", qk_norm=True, moe=True, experts_key="num_experts"),
    Family("qwen2_moe", "qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeForSequenceClassification",
           module="ppo.models.families.qwen2_moe", moe=True, experts_key="num_experts"),
    Family("mixtral", "mixtral", "MixtralForCausalLM", "MixtralForSequenceClassification",
           module="ppo.models.families.mixtral", moe=True, experts_key="num_local_experts"),
    Family("ernie4_5", "ernie", "Ernie4_5ForCausalLM", "Ernie4_5ForSequenceClassification",
           module="ppo.models.families.ernie45", rope_interleaved=True),
    Family("ernie4_5_moe", "ernie", "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeForSequenceClassification",
           module="ppo.models.families.ernie45_moe", rope_interleaved=True, moe=True,
           experts_key="moe_num_experts"),
)}


def supported():
    return sorted(FAMILIES)


def get_family(model_type, where="model_type"):
    """The `Family` of `model_type`; a ValueError naming `where` and the supported list otherwise."""
    if model_type not in FAMILIES:
        raise ValueError(f"{where} {model_type!r}: supported model types are {supported()}")
    return FAMILIES[model_type]
