"""The Mixtral family: our Paddle classes and the Hugging Face config mapping.

Config in: both rope layouts (as Qwen3's), the Llama fields, ``head_dim`` (absent: hidden /
heads), ``num_local_experts`` (or ``num_experts``), ``num_experts_per_tok``,
``output_router_logits``, ``router_aux_loss_coef`` and our ``router_z_loss_coef``; absent
fields take transformers' `MixtralConfig` defaults (rope theta 1e6, eps 1e-5, untied). Refused by
name: ``sliding_window`` set (sliding-window attention), ``router_jitter_noise`` above 0 (noise
on the router's input in training), a rotary scaling, a non-SiLU ``hidden_act``,
``attention_bias``.

Tensors: the hub's names, ``model.layers.i.block_sparse_moe.gate.weight [E, H]`` and
``block_sparse_moe.experts.e.{w1,w3,w2}.weight`` (gate, up, down), which transformers 5.23's
`save_pretrained` writes too; its fused in-memory ``mlp.experts.gate_up_proj`` /
``down_proj`` are split on import as Qwen3-MoE's are. Export writes the hub names.
"""
import re

from . import qwen3
from .mixtral_modeling import HUB, MixtralConfig, MixtralForCausalLM, MixtralModel, MixtralPretrainedModel, our_expert_names
from .qwen3_moe import split_fused_experts as _split

CONFIG_CLASS = MixtralConfig
CAUSAL_LM_CLASS = MixtralForCausalLM
BASE_MODEL_CLASS = MixtralModel
PRETRAINED_CLASS = MixtralPretrainedModel
DEFAULT_HEAD_DIM = None  # hidden_size / num_attention_heads
DEFAULT_ROPE_THETA = 1e6
DEFAULTS = {"num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": False,
            "router_aux_loss_coef": 0.001, "router_z_loss_coef": 0.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def refusals(hf):
    """What our Mixtral classes do not compute, one entry per field."""
    problems = [p for p in qwen3.refusals(hf) if not p.startswith("rope")] + qwen3.rope_theta(hf, DEFAULT_ROPE_THETA)[1]
    if hf.get("sliding_window") is not None:
        problems.append(f"sliding_window {hf['sliding_window']} (sliding-window attention)")
    if float(hf.get("router_jitter_noise") or 0.0) > 0:
        problems.append(f"router_jitter_noise {hf['router_jitter_noise']} (router input noise in training)")
    return problems


def paddle_config(hf):
    """`MixtralConfig` keyword arguments of a Hugging Face config dict; raises naming every field
    that is not honoured."""
    problems = refusals(hf)
    if problems:
        raise ValueError("MixtralForCausalLM config: not supported here: " + "; ".join(problems))
    hf = dict(DEFAULTS, **{k: v for k, v in hf.items() if v is not None})
    hf["num_local_experts"] = hf.get("num_experts", hf["num_local_experts"])
    hf["head_dim"] = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    cfg = {key: hf[key] for key in qwen3.FIELDS if key in hf}
    cfg.setdefault("num_key_value_heads", hf["num_attention_heads"])
    cfg.update({key: hf[key] for key in DEFAULTS}, rope_theta=qwen3.rope_theta(hf, DEFAULT_ROPE_THETA)[0])
    return cfg


def hf_fields(cfg):
    """The transformers ``config.json`` fields of our `MixtralConfig` dict `cfg` (both rope layouts)."""
    out = {key: cfg[key] for key in qwen3.FIELDS if cfg.get(key) is not None}
    out.update({key: cfg.get(key, DEFAULTS[key]) for key in DEFAULTS})
    out["num_local_experts"] = cfg.get("num_experts", DEFAULTS["num_local_experts"])
    theta = float(cfg.get("rope_theta", DEFAULT_ROPE_THETA))
    out.update(hidden_act="silu", sliding_window=None, router_jitter_noise=0.0, rope_theta=theta, rope_scaling=None,
               rope_parameters={"rope_type": "default", "rope_theta": theta})
    return out


def extra_hf_shapes(hf, layer_prefix):
    """The router and experts of one layer in place of the dense MLP."""
    H, I = hf["hidden_size"], hf["intermediate_size"]
    E = hf.get("num_local_experts", hf.get("num_experts", DEFAULTS["num_local_experts"]))
    p = layer_prefix + "block_sparse_moe."
    shapes = {p + "gate.weight": (E, H)}
    for e in range(E):
        shapes.update({f"{p}experts.{e}.w1.weight": (I, H), f"{p}experts.{e}.w3.weight": (I, H),
                       f"{p}experts.{e}.w2.weight": (H, I)})
    shapes.update({layer_prefix + f"mlp.{name}.weight": None for name in HUB})  # no dense MLP
    return shapes


_OUT = re.compile(r"\.mlp\.(gate\.weight|experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight)$")


def split_fused_experts(tensors):
    """Hub names (``block_sparse_moe.experts.e.w1`` ...) and transformers 5's fused tensors as
    our per-expert Hugging Face names (``mlp.experts.e.gate_proj.weight`` ...)."""
    return _split(our_expert_names(tensors))


def hub_names(tensors):
    """Our per-expert Hugging Face names as the hub's (the reverse of `split_fused_experts`)."""
    out = {}
    for name, value in tensors.items():
        m = _OUT.search(name)
        if m and m.group(2) is None:
            name = name[:m.start()] + ".block_sparse_moe.gate.weight"
        elif m:
            name = name[:m.start()] + f".block_sparse_moe.experts.{m.group(2)}.{HUB[m.group(3)]}.weight"
        out[name] = value
    return out
