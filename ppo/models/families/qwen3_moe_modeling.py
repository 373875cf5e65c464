"""Qwen3-MoE in Paddle: config, base model, causal LM.

The architecture of transformers' `Qwen3MoeForCausalLM`: Qwen3's attention (per-head q/k
RMSNorm, ``head_dim`` its own field, no biases) and, on layer i, the sparse block of
`ppo.models.families.moe` when ``i`` is not in ``mlp_only_layers`` and ``(i + 1) %
decoder_sparse_step == 0`` (experts ``moe_intermediate_size`` wide), else a dense SwiGLU MLP
``intermediate_size`` wide. Names follow PaddleNLP's layout with the ``qwen3_moe.`` prefix:
``qwen3_moe.layers.i.mlp.gate.weight [H, E]``, ``...mlp.experts.e.{gate,up,down}_proj.weight``.

The classes are `ppo.models.families.moe_classes`' (router logits and ``aux_loss`` with
``output_router_logits``, routing replay with ``moe_expert_indices``).
"""
from .moe import SparseMoeBlock
from .moe_classes import moe_causal_lm_class, moe_model_class
from .qwen3_modeling import Qwen3Config, Qwen3PretrainedModel

__all__ = ["Qwen3MoeConfig", "Qwen3MoePretrainedModel", "Qwen3MoeModel", "Qwen3MoeForCausalLM"]


class Qwen3MoeConfig(Qwen3Config):
    """`Qwen3Config` plus transformers' `Qwen3MoeConfig` routing fields (same defaults;
    ``num_local_experts``, which transformers 5 writes, is read as ``num_experts``) and
    ``router_z_loss_coef`` (0: no z-loss)."""

    model_type = "qwen3_moe"

    def __init__(self, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
                 mlp_only_layers=None, norm_topk_prob=False, output_router_logits=False, router_aux_loss_coef=0.001,
                 router_z_loss_coef=0.0, **kwargs):
        num_experts = kwargs.pop("num_local_experts", num_experts)
        self.num_experts, self.num_experts_per_tok = num_experts, num_experts_per_tok
        self.moe_intermediate_size, self.decoder_sparse_step = moe_intermediate_size, decoder_sparse_step
        self.mlp_only_layers = list(mlp_only_layers or [])
        self.norm_topk_prob, self.output_router_logits = norm_topk_prob, output_router_logits
        self.router_aux_loss_coef, self.router_z_loss_coef = router_aux_loss_coef, router_z_loss_coef
        super().__init__(**kwargs)
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(f"Qwen3-MoE config: num_experts_per_tok {num_experts_per_tok} must be in "
                             f"[1, num_experts {num_experts}]")


def is_sparse_layer(config, index):
    """Whether layer `index` has the sparse block (transformers' rule, see the module docstring)."""
    return (index not in config.mlp_only_layers and config.num_experts > 0
            and (index + 1) % config.decoder_sparse_step == 0)


class Qwen3MoePretrainedModel(Qwen3PretrainedModel):
    config_class = Qwen3MoeConfig
    base_model_prefix = "qwen3_moe"
    family_label = "Qwen3-MoE"


Qwen3MoeModel = moe_model_class(Qwen3MoePretrainedModel, "Qwen3MoeModel", is_sparse_layer, SparseMoeBlock)
Qwen3MoeForCausalLM = moe_causal_lm_class(Qwen3MoePretrainedModel, Qwen3MoeModel, "Qwen3MoeForCausalLM")
