"""The Qwen3-MoE family: our Paddle classes and the Hugging Face config mapping.

Config in: Qwen3's mapping (`ppo.models.families.qwen3`: both rope layouts, the same
refusals) plus the routing fields ``num_experts`` (transformers 5 writes ``num_local_experts``),
``num_experts_per_tok``, ``moe_intermediate_size``, ``decoder_sparse_step``,
``mlp_only_layers``, ``norm_topk_prob`` (transformers' default False when absent),
``output_router_logits``, ``router_aux_loss_coef`` and our ``router_z_loss_coef``.
Out: the same fields, ``num_experts`` and ``num_local_experts`` both.

Tensors: the hub's per-expert layout, ``model.layers.i.mlp.gate.weight [E, H]`` and
``mlp.experts.e.{gate,up,down}_proj.weight`` (what transformers 5 `save_pretrained` writes
too); transformers 5's in-memory fused layout (``mlp.experts.gate_up_proj [E, 2I, H]``,
``mlp.experts.down_proj [E, H, I]``) is split into it on import (`split_fused_experts`).
"""
import numpy as np

from . import qwen3
from .qwen3_moe_modeling import Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3MoeModel, Qwen3MoePretrainedModel, is_sparse_layer

CONFIG_CLASS = Qwen3MoeConfig
CAUSAL_LM_CLASS = Qwen3MoeForCausalLM
BASE_MODEL_CLASS = Qwen3MoeModel
PRETRAINED_CLASS = Qwen3MoePretrainedModel
DEFAULT_HEAD_DIM = qwen3.DEFAULT_HEAD_DIM

MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
              "norm_topk_prob", "output_router_logits", "router_aux_loss_coef", "router_z_loss_coef")
MOE_DEFAULTS = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                "mlp_only_layers": [], "norm_topk_prob": False, "output_router_logits": False,
                "router_aux_loss_coef": 0.001, "router_z_loss_coef": 0.0}


def paddle_config(hf):
    """`Qwen3MoeConfig` keyword arguments of a Hugging Face config dict; raises naming every
    field that is not honoured."""
    problems = qwen3.refusals(hf)
    if problems:
        raise ValueError("Qwen3MoeForCausalLM config: not supported here: " + "; ".join(problems))
    cfg = qwen3.paddle_config(hf)
    hf = dict(hf)
    if "num_experts" not in hf and "num_local_experts" in hf:
        hf["num_experts"] = hf["num_local_experts"]
    cfg.update({key: hf.get(key, MOE_DEFAULTS[key]) for key in MOE_FIELDS})
    cfg["mlp_only_layers"] = list(cfg["mlp_only_layers"] or [])
    return cfg


def hf_fields(cfg):
    """The transformers ``config.json`` fields of our `Qwen3MoeConfig` dict `cfg`."""
    out = qwen3.hf_fields(cfg)
    out.update({key: cfg.get(key, MOE_DEFAULTS[key]) for key in MOE_FIELDS})
    out["num_local_experts"] = out["num_experts"]
    return out


def _as_config(hf):
    class View:  # the two fields `is_sparse_layer` reads, with transformers' defaults
        mlp_only_layers = hf.get("mlp_only_layers") or []
        num_experts = hf.get("num_experts", hf.get("num_local_experts", MOE_DEFAULTS["num_experts"]))
        decoder_sparse_step = hf.get("decoder_sparse_step", 1)
    return View


def extra_hf_shapes(hf, layer_prefix):
    """q/k norms of one layer and, on a sparse layer, the router and experts in place of the
    dense MLP (which `ppo.models.hf_format.expected_hf_shapes` lists; `dense_mlp_shapes_removed`)."""
    shapes = qwen3.extra_hf_shapes(hf, layer_prefix)
    index = int(layer_prefix.rstrip(".").rsplit(".", 1)[-1])
    view = _as_config(hf)
    if not is_sparse_layer(view, index):
        return shapes
    H, I = hf["hidden_size"], hf["moe_intermediate_size"]
    shapes[layer_prefix + "mlp.gate.weight"] = (view.num_experts, H)
    for e in range(view.num_experts):
        p = f"{layer_prefix}mlp.experts.{e}."
        shapes.update({p + "gate_proj.weight": (I, H), p + "up_proj.weight": (I, H), p + "down_proj.weight": (H, I)})
    for name in ("gate_proj", "up_proj", "down_proj"):
        shapes[layer_prefix + f"mlp.{name}.weight"] = None  # no dense MLP on this layer
    return shapes


def split_fused_experts(tensors):
    """transformers 5's fused expert tensors (``mlp.experts.gate_up_proj [E, 2I, H]``,
    ``mlp.experts.down_proj [E, H, I]``) as per-expert ``[out, in]`` weights; others unchanged."""
    out = {}
    for name, value in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            half = value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = np.ascontiguousarray(value[e, :half])
                out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = np.ascontiguousarray(value[e, half:])
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(value.shape[0]):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = np.ascontiguousarray(value[e])
        else:
            out[name] = value
    return out
