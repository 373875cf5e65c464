"""The ERNIE 4.5 MoE family: our Paddle classes and the Hugging Face config mapping.

Config in: ERNIE 4.5's mapping (`ppo.models.families.ernie45`: both rope layouts, the same
refusals), except that an absent ``head_dim`` means ``hidden_size / num_attention_heads`` and an
absent ``num_key_value_heads`` 4 (transformers' `Ernie4_5_MoeConfig`), plus the routing fields
``moe_num_experts``, ``moe_k``, ``moe_intermediate_size``, ``moe_num_shared_experts``,
``moe_layer_start_index`` / ``moe_layer_end_index`` / ``moe_layer_interval``, ``moe_norm_min``,
``output_router_logits``, ``router_aux_loss_coef`` and our ``router_z_loss_coef``. Refused by
name: ``use_bias`` true, and the fields of ERNIE's original Paddle configs that change the
routing when set off transformers' computation (``moe_gate`` other than ``topk``,
``moe_gate_act`` other than ``softmax``, ``moe_use_hard_gate``, per-modality lists of experts or
layer indices). ``moe_capacity`` and ``moe_use_aux_free`` do not change a forward here
(transformers drops no token and always adds the correction bias).

Tensors: the hub's per-expert layout, ``model.layers.i.mlp.gate.weight [E, H]``,
``mlp.moe_statics.e_score_correction_bias [1, E]``, ``mlp.experts.e.{gate,up,down}_proj.weight``,
``mlp.shared_experts.{gate,up,down}_proj.weight`` (what transformers 5 `save_pretrained`
writes); transformers 5's fused in-memory expert tensors are split as Qwen3-MoE's are. Tensors
named ``mtp`` (the released checkpoints' multi-token-prediction layers) are skipped on import, as
transformers' ``_keys_to_ignore_on_load_unexpected`` skips them: the causal LM never runs them.
"""
from . import ernie45
from .ernie45_moe_modeling import (Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM, Ernie4_5_MoeModel,
                                   Ernie4_5_MoePretrainedModel, is_sparse_layer)
from .qwen3_moe import split_fused_experts  # noqa: F401 (the same fused layout)

CONFIG_CLASS = Ernie4_5_MoeConfig
CAUSAL_LM_CLASS = Ernie4_5_MoeForCausalLM
BASE_MODEL_CLASS = Ernie4_5_MoeModel
PRETRAINED_CLASS = Ernie4_5_MoePretrainedModel
DEFAULT_HEAD_DIM = None  # hidden_size / num_attention_heads
IGNORED_HF_TENSORS = ("mtp",)  # multi-token-prediction layers: transformers skips them on load, as we do

MOE_DEFAULTS = {"moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536, "moe_num_shared_experts": 2,
                "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1, "moe_norm_min": 1e-12,
                "output_router_logits": False, "router_aux_loss_coef": 0.001, "router_z_loss_coef": 0.0}
LIST_FIELDS = ("moe_num_experts", "moe_layer_start_index", "moe_layer_end_index", "moe_k")


def refusals(hf):
    """What our ERNIE 4.5 MoE classes do not compute, one entry per field."""
    problems = ernie45.refusals(hf)
    if hf.get("use_bias"):
        problems.append("use_bias true (LM head and shared-expert biases)")
    if hf.get("moe_gate", "topk") not in ("topk", None):
        problems.append(f"moe_gate {hf['moe_gate']!r} (only topk: softmax top-k with the correction bias)")
    if hf.get("moe_gate_act", "softmax") not in ("softmax", None):
        problems.append(f"moe_gate_act {hf['moe_gate_act']!r} (only softmax)")
    if hf.get("moe_use_hard_gate"):
        problems.append("moe_use_hard_gate true (modality-routed experts)")
    problems += [f"{key} {hf[key]!r} (one value per model, not per modality)" for key in LIST_FIELDS
                 if isinstance(hf.get(key), (list, tuple))]
    return problems


def _with_defaults(hf):
    out = dict(MOE_DEFAULTS, num_key_value_heads=4)
    out.update({key: value for key, value in hf.items() if value is not None or key == "head_dim"})
    if "num_experts" in hf and "moe_num_experts" not in hf:
        out["moe_num_experts"] = hf["num_experts"]
    if "num_experts_per_tok" in hf and "moe_k" not in hf:
        out["moe_k"] = hf["num_experts_per_tok"]
    out.setdefault("head_dim", None)
    return out


def paddle_config(hf):
    """`Ernie4_5_MoeConfig` keyword arguments of a Hugging Face config dict; raises naming every
    field that is not honoured."""
    problems = refusals(hf)
    if problems:
        raise ValueError("Ernie4_5_MoeForCausalLM config: not supported here: " + "; ".join(problems))
    hf = _with_defaults(hf)
    cfg = ernie45.paddle_config(hf)
    cfg.update({key: hf[key] for key in MOE_DEFAULTS})
    if cfg["moe_layer_end_index"] == -1:
        cfg["moe_layer_end_index"] = cfg["num_hidden_layers"] - 1
    return cfg


def hf_fields(cfg):
    """The transformers ``config.json`` fields of our `Ernie4_5_MoeConfig` dict `cfg`."""
    out = ernie45.hf_fields(cfg)
    out.update({key: cfg.get(key, MOE_DEFAULTS[key]) for key in MOE_DEFAULTS})
    out["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return out


def extra_hf_shapes(hf, layer_prefix):
    """On a sparse layer, the router, correction bias, routed and shared experts in place of the
    dense MLP (which `ppo.models.hf_format.expected_hf_shapes` lists)."""
    hf = _with_defaults(hf)
    view = Ernie4_5_MoeConfig(**paddle_config(hf))
    index = int(layer_prefix.rstrip(".").rsplit(".", 1)[-1])
    if not is_sparse_layer(view, index):
        return {}
    H, I, E = hf["hidden_size"], hf["moe_intermediate_size"], view.moe_num_experts
    shapes = {layer_prefix + "mlp.gate.weight": (E, H), layer_prefix + "mlp.moe_statics.e_score_correction_bias": (1, E)}
    widths = [(f"experts.{e}", I) for e in range(E)]
    if view.moe_num_shared_experts:
        widths.append(("shared_experts", I * view.moe_num_shared_experts))
    for name, width in widths:
        p = f"{layer_prefix}mlp.{name}."
        shapes.update({p + "gate_proj.weight": (width, H), p + "up_proj.weight": (width, H), p + "down_proj.weight": (H, width)})
    for name in ("gate_proj", "up_proj", "down_proj"):
        shapes[layer_prefix + f"mlp.{name}.weight"] = None  # no dense MLP on this layer
    return shapes
