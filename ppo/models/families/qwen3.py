"""The Qwen3 (dense) family: our Paddle classes and the Hugging Face config mapping.

Hugging Face ``config.json`` in, both layouts: transformers 4 writes ``rope_theta`` (and
``rope_scaling``) at the top level, transformers 5 ``rope_parameters: {"rope_type",
"rope_theta"}``. Only the default rotary embedding is computed here; any other ``rope_type``, a
``rope_scaling``, or a ``rope_parameters`` key other than ``rope_type`` / ``rope_theta`` is
refused by name, as are ``attention_bias``, sliding-window layers (``use_sliding_window``,
``layer_types`` other than ``full_attention``), a non-SiLU ``hidden_act``, and mixture-of-experts
fields (``num_experts`` ...) on ``model_type`` qwen3. ``head_dim``
absent means 128, transformers' default for Qwen3.

Out: both layouts at once (``rope_theta`` at the top and ``rope_parameters``), which
transformers 4 and 5 both read. Tensor names are Llama's plus ``self_attn.q_norm.weight`` and
``self_attn.k_norm.weight`` ``[head_dim]`` (not transposed).
"""
from .qwen3_modeling import Qwen3Config, Qwen3ForCausalLM, Qwen3Model, Qwen3PretrainedModel

CONFIG_CLASS = Qwen3Config
CAUSAL_LM_CLASS = Qwen3ForCausalLM
BASE_MODEL_CLASS = Qwen3Model
PRETRAINED_CLASS = Qwen3PretrainedModel

DEFAULT_HEAD_DIM = 128
DEFAULT_ROPE_THETA = 10000.0
FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "attention_dropout",
)
ROPE_KEYS = ("rope_type", "type", "rope_theta")
MOE_KEYS = ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size")


def rope_theta(hf, default=DEFAULT_ROPE_THETA):
    """``(theta, problems)`` of a Hugging Face config in either layout (`default` when it names none)."""
    problems, theta = [], hf.get("rope_theta")
    params = hf.get("rope_parameters")
    if params is not None:
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            problems.append(f"rope_parameters.rope_type {kind!r} (only the default rotary embedding)")
        extra = sorted(set(params) - set(ROPE_KEYS))
        if extra:
            problems.append(f"rope_parameters keys {extra} (only rope_type and rope_theta are read)")
        if theta is not None and params.get("rope_theta", theta) != theta:
            problems.append(f"rope_theta {theta} != rope_parameters.rope_theta {params['rope_theta']}")
        theta = params.get("rope_theta", theta)
    scaling = hf.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        problems.append(f"rope_scaling {scaling} (only the default rotary embedding)")
    return (default if theta is None else float(theta)), problems


def refusals(hf):
    """What our Qwen3 classes do not compute, one entry per field."""
    problems = []
    if hf.get("attention_bias"):
        problems.append("attention_bias true (q/k/v/o biases)")
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {hf['hidden_act']!r} (only silu)")
    if hf.get("use_sliding_window"):
        problems.append("use_sliding_window true (sliding-window attention)")
    moe_keys = [key for key in MOE_KEYS if key in hf]
    if hf.get("model_type") == "qwen3" and moe_keys:
        problems.append(f"{', '.join(moe_keys)} on a dense model (model_type qwen3; the MoE family is qwen3_moe)")
    layer_types = sorted(set(hf.get("layer_types") or []) - {"full_attention"})
    if layer_types:
        problems.append(f"layer_types {layer_types} (only full_attention)")
    return problems + rope_theta(hf)[1]


def paddle_config(hf):
    """`Qwen3Config` keyword arguments of a Hugging Face config dict; raises naming every field
    that is not honoured."""
    problems = refusals(hf)
    if problems:
        raise ValueError("Qwen3ForCausalLM config: not supported here: " + "; ".join(problems))
    cfg = {key: hf[key] for key in FIELDS if key in hf}
    cfg.setdefault("num_key_value_heads", hf["num_attention_heads"])
    cfg.setdefault("head_dim", DEFAULT_HEAD_DIM)
    cfg.setdefault("tie_word_embeddings", False)
    cfg["rope_theta"] = rope_theta(hf)[0]
    return cfg


def hf_fields(cfg):
    """The transformers ``config.json`` fields of our `Qwen3Config` dict `cfg` (both rope layouts)."""
    out = {key: cfg[key] for key in FIELDS if cfg.get(key) is not None}
    theta = float(cfg.get("rope_theta", DEFAULT_ROPE_THETA))
    out.update(hidden_act="silu", attention_bias=False, use_sliding_window=False, sliding_window=None,
               max_window_layers=cfg["num_hidden_layers"], layer_types=["full_attention"] * cfg["num_hidden_layers"],
               rope_theta=theta, rope_scaling=None, rope_parameters={"rope_type": "default", "rope_theta": theta})
    return out


def extra_hf_shapes(hf, layer_prefix):
    """The q/k norm weights of one layer (``[head_dim]`` each)."""
    hd = hf.get("head_dim") or DEFAULT_HEAD_DIM
    return {layer_prefix + "self_attn.q_norm.weight": (hd,), layer_prefix + "self_attn.k_norm.weight": (hd,)}
