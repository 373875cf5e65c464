"""The Qwen2-MoE family: our Paddle classes and the Hugging Face config mapping.

Config in: Qwen3-MoE's mapping (`ppo.models.families.qwen3_moe`: both rope layouts, the routing
fields, the same refusals: sliding-window attention, a rotary scaling, a non-SiLU activation)
except that an absent ``head_dim`` means hidden / heads, plus ``qkv_bias`` (transformers'
default true) and ``shared_expert_intermediate_size``. Absent routing fields take transformers'
`Qwen2MoeConfig` defaults (60 experts, top-4, width 1,408, shared width 5,632).

Tensors: the hub's per-expert layout, ``model.layers.i.mlp.gate.weight [E, H]``,
``mlp.experts.e.{gate,up,down}_proj.weight``, ``mlp.shared_expert.{gate,up,down}_proj.weight``,
``mlp.shared_expert_gate.weight [1, H]``, q/k/v biases ``[out]``; transformers 5's fused
in-memory expert tensors are split as Qwen3-MoE's are.
"""
from . import qwen3, qwen3_moe
from .qwen2_moe_modeling import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen2MoeModel, Qwen2MoePretrainedModel
from .qwen3_moe import split_fused_experts  # noqa: F401 (the same fused layout)

CONFIG_CLASS = Qwen2MoeConfig
CAUSAL_LM_CLASS = Qwen2MoeForCausalLM
BASE_MODEL_CLASS = Qwen2MoeModel
PRETRAINED_CLASS = Qwen2MoePretrainedModel
DEFAULT_HEAD_DIM = None  # hidden_size / num_attention_heads

DEFAULTS = {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "qkv_bias": True}


def _with_defaults(hf):
    out = dict(DEFAULTS, **{k: v for k, v in hf.items() if v is not None})
    if "num_local_experts" in hf and "num_experts" not in hf:
        out["num_experts"] = hf["num_local_experts"]
    out["head_dim"] = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    return out


def paddle_config(hf):
    """`Qwen2MoeConfig` keyword arguments of a Hugging Face config dict; raises naming every
    field that is not honoured."""
    problems = qwen3.refusals(hf)
    if problems:
        raise ValueError("Qwen2MoeForCausalLM config: not supported here: " + "; ".join(problems))
    hf = _with_defaults(hf)
    cfg = qwen3_moe.paddle_config(hf)
    cfg.update(qkv_bias=bool(hf["qkv_bias"]), shared_expert_intermediate_size=hf["shared_expert_intermediate_size"])
    return cfg


def hf_fields(cfg):
    """The transformers ``config.json`` fields of our `Qwen2MoeConfig` dict `cfg`."""
    out = qwen3_moe.hf_fields(cfg)
    out.update(qkv_bias=bool(cfg.get("qkv_bias", True)),
               shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size", 5632))
    out.pop("attention_bias", None)
    return out


def extra_hf_shapes(hf, layer_prefix):
    """q/k/v biases and, on a sparse layer, the router, experts and gated shared expert in place
    of the dense MLP (which `ppo.models.hf_format.expected_hf_shapes` lists)."""
    hf = _with_defaults(hf)
    H, nh, hd = hf["hidden_size"], hf["num_attention_heads"], hf["head_dim"]
    nkv = hf.get("num_key_value_heads") or nh
    shapes = qwen3_moe.extra_hf_shapes(dict(hf, head_dim=hd), layer_prefix)
    for name in ("q_norm", "k_norm"):
        shapes.pop(f"{layer_prefix}self_attn.{name}.weight")
    if hf["qkv_bias"]:
        shapes.update({layer_prefix + "self_attn.q_proj.bias": (nh * hd,), layer_prefix + "self_attn.k_proj.bias": (nkv * hd,),
                       layer_prefix + "self_attn.v_proj.bias": (nkv * hd,)})
    if layer_prefix + "mlp.gate.weight" in shapes:
        S = hf["shared_expert_intermediate_size"]
        p = layer_prefix + "mlp.shared_expert."
        shapes.update({p + "gate_proj.weight": (S, H), p + "up_proj.weight": (S, H), p + "down_proj.weight": (H, S),
                       layer_prefix + "mlp.shared_expert_gate.weight": (1, H)})
    return shapes
