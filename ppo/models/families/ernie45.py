"""The ERNIE 4.5 (dense) family: our Paddle classes and the Hugging Face config mapping.

Hugging Face ``config.json`` in, both layouts (transformers 4's top-level ``rope_theta``,
transformers 5's ``rope_parameters``), read as transformers' `Ernie4_5Config` reads it: ``head_dim``
absent means 128 and null means ``hidden_size / num_attention_heads``, ``tie_word_embeddings``
absent means true, ``rope_theta`` absent means 500,000, ``rms_norm_eps`` absent 1e-5.
``use_bias`` is honoured (a bias on all seven projections). Refused by name: any ``rope_type``
but the default, a ``rope_scaling``, ``rope_parameters`` keys other than ``rope_type`` /
``rope_theta`` (``partial_rotary_factor`` ...), a non-SiLU ``hidden_act``, and the fields of
ERNIE's original Paddle configs that change the numbers when set off their defaults
(``use_rmsnorm`` false: LayerNorm; ``compression_ratio`` != 1: position interpolation), and the
routing fields of ERNIE 4.5 MoE on a dense ``ernie4_5`` config (the MoE family is ``ernie4_5_moe``).

Out: both rope layouts at once. Tensor names are Llama's (biases ``.bias`` ``[out]``, not
transposed); transformers has no ``Ernie4_5ForSequenceClassification``, so an exported score
model is read back by `ppo.models.hf_import` only.
"""
from .ernie45_modeling import Ernie4_5Config, Ernie4_5ForCausalLM, Ernie4_5Model, Ernie4_5PretrainedModel
from .qwen3 import rope_theta

CONFIG_CLASS = Ernie4_5Config
CAUSAL_LM_CLASS = Ernie4_5ForCausalLM
BASE_MODEL_CLASS = Ernie4_5Model
PRETRAINED_CLASS = Ernie4_5PretrainedModel

DEFAULT_HEAD_DIM = 128
DEFAULT_ROPE_THETA = 500000.0
FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "use_bias",
)
MOE_KEYS = ("moe_num_experts", "moe_k", "moe_intermediate_size", "moe_num_shared_experts")


def refusals(hf):
    """What our ERNIE 4.5 classes do not compute, one entry per field."""
    problems = []
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {hf['hidden_act']!r} (only silu)")
    if hf.get("use_rmsnorm", True) is False:
        problems.append("use_rmsnorm false (LayerNorm)")
    if float(hf.get("compression_ratio", 1.0) or 1.0) != 1.0:
        problems.append(f"compression_ratio {hf['compression_ratio']} (position interpolation)")
    moe_keys = [key for key in MOE_KEYS if key in hf]
    if hf.get("model_type") == "ernie4_5" and moe_keys:
        problems.append(f"{', '.join(moe_keys)} on a dense model (model_type ernie4_5; the MoE family is ernie4_5_moe)")
    return problems + rope_theta(hf, DEFAULT_ROPE_THETA)[1]


def head_dim(hf):
    """transformers' rule: absent 128, null ``hidden_size / num_attention_heads``."""
    if "head_dim" not in hf:
        return DEFAULT_HEAD_DIM
    return hf["head_dim"] or hf["hidden_size"] // hf["num_attention_heads"]


def paddle_config(hf):
    """`Ernie4_5Config` keyword arguments of a Hugging Face config dict; raises naming every
    field that is not honoured."""
    problems = refusals(hf)
    if problems:
        raise ValueError("Ernie4_5ForCausalLM config: not supported here: " + "; ".join(problems))
    cfg = {key: hf[key] for key in FIELDS if hf.get(key) is not None}
    cfg.setdefault("num_key_value_heads", hf["num_attention_heads"])
    cfg.setdefault("tie_word_embeddings", True)
    cfg.update(head_dim=head_dim(hf), rope_theta=rope_theta(hf, DEFAULT_ROPE_THETA)[0])
    return cfg


def hf_fields(cfg):
    """The transformers ``config.json`` fields of our `Ernie4_5Config` dict `cfg` (both rope layouts)."""
    out = {key: cfg[key] for key in FIELDS if cfg.get(key) is not None}
    theta = float(cfg.get("rope_theta", DEFAULT_ROPE_THETA))
    out.update(hidden_act="silu", use_bias=bool(cfg.get("use_bias", False)), rope_theta=theta, rope_scaling=None,
               rope_parameters={"rope_type": "default", "rope_theta": theta})
    return out


def extra_hf_shapes(hf, layer_prefix):
    """With ``use_bias``: the seven projection biases of one layer (``[out]`` each)."""
    if not hf.get("use_bias"):
        return {}
    H, inner, nh = hf["hidden_size"], hf["intermediate_size"], hf["num_attention_heads"]
    nkv, hd = hf.get("num_key_value_heads") or nh, head_dim(hf)
    outs = {"self_attn.q_proj": nh * hd, "self_attn.k_proj": nkv * hd, "self_attn.v_proj": nkv * hd,
            "self_attn.o_proj": H, "mlp.gate_proj": inner, "mlp.up_proj": inner, "mlp.down_proj": H}
    return {f"{layer_prefix}{name}.bias": (width,) for name, width in outs.items()}
