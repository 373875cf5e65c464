"""ERNIE 4.5 MoE in Paddle: config, base model, causal LM.

The architecture of transformers' `Ernie4_5_MoeForCausalLM` (Baidu, 2025; ERNIE-4.5-21B-A3B and
300B-A47B): ERNIE 4.5's attention (interleaved RoPE, grouped-query heads) and, on layer i, a
sparse block when ``(i + 1) % moe_layer_interval == 0`` and ``moe_layer_start_index <= i <=
moe_layer_end_index`` (-1: the last layer), else a dense SwiGLU MLP ``intermediate_size`` wide.
The sparse block (`ErnieMoeBlock`): a router ``gate`` ``[H, E]``, its matmul and softmax in float32;
``moe_statics.e_score_correction_bias [1, E]`` (float32, not trained) added to the
probabilities to choose the ``moe_k`` experts, whose weights are the unbiased probabilities
divided by ``max(their sum, moe_norm_min)``; ``moe_num_experts`` routed SwiGLU experts
``moe_intermediate_size`` wide, each run on the tokens routed to it (`moe.dispatch`); and
``moe_num_shared_experts`` shared experts as one SwiGLU ``moe_intermediate_size *
moe_num_shared_experts`` wide that every token runs, added to the routed sum.

Names follow PaddleNLP's layout with the ``ernie.`` prefix: ``ernie.layers.i.mlp.gate.weight
[H, E]``, ``...mlp.moe_statics.e_score_correction_bias [1, E]``, ``...mlp.experts.e.{gate,up,
down}_proj.weight``, ``...mlp.shared_experts.{gate,up,down}_proj.weight``. The classes are
`ppo.models.families.moe_classes`' (router losses, routing replay).
"""
import paddle
import paddle.nn as nn

from .decoder import MLP
from .ernie45_modeling import Ernie4_5Config, Ernie4_5PretrainedModel
from .moe import SparseMoeBlock
from .moe_classes import moe_causal_lm_class, moe_model_class

__all__ = ["Ernie4_5_MoeConfig", "Ernie4_5_MoePretrainedModel", "Ernie4_5_MoeModel", "Ernie4_5_MoeForCausalLM"]

SHAPE_DEFAULTS = dict(hidden_size=2560, intermediate_size=12288, num_hidden_layers=28, num_attention_heads=20,
                      num_key_value_heads=4, head_dim=None)
"""transformers' `Ernie4_5_MoeConfig` shape defaults (ERNIE-4.5-21B-A3B); head_dim: hidden / heads."""


class Ernie4_5_MoeConfig(Ernie4_5Config):
    """`Ernie4_5Config` plus transformers' `Ernie4_5_MoeConfig` routing fields (same defaults;
    ``num_experts`` / ``num_experts_per_tok`` read ``moe_num_experts`` / ``moe_k``) and
    ``router_z_loss_coef`` (0: no z-loss). ``use_bias`` is refused: transformers then puts a bias
    on the LM head and shared experts, which these classes do not have."""

    model_type = "ernie4_5_moe"
    norm_topk_prob = True  # a fact of the architecture (weights over max(sum, moe_norm_min))

    def __init__(self, moe_num_experts=64, moe_k=6, moe_intermediate_size=1536, moe_num_shared_experts=2,
                 moe_layer_start_index=1, moe_layer_end_index=-1, moe_layer_interval=1, moe_norm_min=1e-12,
                 output_router_logits=False, router_aux_loss_coef=0.001, router_z_loss_coef=0.0, **kwargs):
        if kwargs.get("use_bias"):
            raise ValueError("ERNIE 4.5 MoE config: not supported here: use_bias true (LM head and shared-expert "
                             "biases)")
        moe_num_experts = kwargs.pop("num_experts", moe_num_experts)
        moe_k = kwargs.pop("num_experts_per_tok", moe_k)
        for key, value in SHAPE_DEFAULTS.items():
            kwargs.setdefault(key, value)
        self.moe_num_experts, self.moe_k, self.moe_intermediate_size = moe_num_experts, moe_k, moe_intermediate_size
        self.moe_num_shared_experts, self.moe_norm_min = moe_num_shared_experts, moe_norm_min
        self.moe_layer_start_index, self.moe_layer_interval = moe_layer_start_index, moe_layer_interval
        self.moe_layer_end_index = kwargs["num_hidden_layers"] - 1 if moe_layer_end_index == -1 else moe_layer_end_index
        self.output_router_logits, self.router_aux_loss_coef = output_router_logits, router_aux_loss_coef
        self.router_z_loss_coef = router_z_loss_coef
        super().__init__(**kwargs)
        if not 0 < moe_k <= moe_num_experts:
            raise ValueError(f"ERNIE 4.5 MoE config: moe_k {moe_k} must be in [1, moe_num_experts {moe_num_experts}]")

    @property
    def num_experts(self):
        return self.moe_num_experts

    @property
    def num_experts_per_tok(self):
        return self.moe_k


def is_sparse_layer(config, index):
    """Whether layer `index` has the sparse block (transformers' rule, see the module docstring)."""
    return ((index + 1) % config.moe_layer_interval == 0 and config.moe_layer_start_index <= index
            <= config.moe_layer_end_index and config.moe_num_experts > 0)


class MoeStatics(nn.Layer):
    """``e_score_correction_bias [1, E]`` float32, a buffer-like parameter that is not trained."""

    def __init__(self, num_experts):
        super().__init__()
        self.e_score_correction_bias = self.create_parameter(
            [1, num_experts], dtype="float32", default_initializer=nn.initializer.Constant(0.0))
        self.e_score_correction_bias.stop_gradient = True


class ErnieMoeBlock(SparseMoeBlock):
    """`moe.SparseMoeBlock` with ERNIE's selection bias, normalisation floor, shared experts and
    router matmul in float32 (transformers' ``Ernie4_5_MoeTopKRouter``)."""

    router_float32 = True
    shared_name = "shared_experts"

    @staticmethod
    def shared_width(config):
        return config.moe_intermediate_size * config.moe_num_shared_experts

    def __init__(self, config):
        super().__init__(config)
        self.norm_min = float(config.moe_norm_min)
        self.moe_statics = MoeStatics(config.moe_num_experts)
        width = self.shared_width(config)
        self.shared_experts = MLP(config, width) if width else None

    def selection_bias(self):
        return self.moe_statics.e_score_correction_bias.reshape([-1])

    def shared_layers(self):
        return self.shared_experts, None


class Ernie4_5_MoePretrainedModel(Ernie4_5PretrainedModel):
    config_class = Ernie4_5_MoeConfig
    family_label = "ERNIE 4.5 MoE"

    def _init_weights(self, layer):
        super()._init_weights(layer)
        if isinstance(layer, MoeStatics):
            layer.e_score_correction_bias.set_value(paddle.zeros_like(layer.e_score_correction_bias))


Ernie4_5_MoeModel = moe_model_class(Ernie4_5_MoePretrainedModel, "Ernie4_5_MoeModel", is_sparse_layer, ErnieMoeBlock)
Ernie4_5_MoeForCausalLM = moe_causal_lm_class(Ernie4_5_MoePretrainedModel, Ernie4_5_MoeModel, "Ernie4_5_MoeForCausalLM")
