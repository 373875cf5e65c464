"""Qwen2-MoE in Paddle: config, base model, causal LM.

The architecture of transformers' `Qwen2MoeForCausalLM` (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B):
Qwen2's attention (biases on q/k/v, none on o, no q/k norm, Llama's rotation, ``head_dim``
hidden / heads unless given) and, on layer i, a sparse block when ``i`` is not in
``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``, else a dense SwiGLU MLP
``intermediate_size`` wide. The sparse block (`Qwen2MoeBlock`) is `moe.SparseMoeBlock` (float32
softmax router, top-k, renormalised with ``norm_topk_prob``, experts ``moe_intermediate_size``
wide on their own tokens) plus a shared expert (SwiGLU ``shared_expert_intermediate_size`` wide)
that every token runs, scaled by ``sigmoid(shared_expert_gate(x))`` (a linear ``[H, 1]``).

Names follow PaddleNLP's ``qwen2_moe`` layout: ``qwen2_moe.layers.i.mlp.gate.weight [H, E]``,
``...mlp.experts.e.{gate,up,down}_proj.weight``, ``...mlp.shared_expert.{gate,up,down}_proj
.weight``, ``...mlp.shared_expert_gate.weight [H, 1]``. The classes are
`ppo.models.families.moe_classes`' (router losses, routing replay). PaddleNLP 3.0.0b4's own
`Qwen2MoeForCausalLM` (same tensor names) stops in its forward under Paddle 3.3.1
(``moe_gate._priority`` adds int64 to int32), puts the sparse block on every layer (it reads
neither ``decoder_sparse_step`` nor ``mlp_only_layers``) and has no routing-replay hook, hence these.
"""
import paddle.nn as nn

from .decoder import MLP
from .moe import SparseMoeBlock
from .moe_classes import moe_causal_lm_class, moe_model_class
from .qwen3_modeling import Qwen3PretrainedModel
from .qwen3_moe_modeling import Qwen3MoeConfig, is_sparse_layer

__all__ = ["Qwen2MoeConfig", "Qwen2MoePretrainedModel", "Qwen2MoeModel", "Qwen2MoeForCausalLM"]


class Qwen2MoeConfig(Qwen3MoeConfig):
    """transformers' `Qwen2MoeConfig` fields that change the numbers, with its defaults
    (Qwen1.5-MoE-A2.7B's shape); ``head_dim`` None means hidden / heads."""

    model_type = "qwen2_moe"
    qk_norm = False  # a fact of the architecture, not a setting (not saved)

    def __init__(self, vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=16, head_dim=None, qkv_bias=True, num_experts=60,
                 num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632, **kwargs):
        self.qkv_bias, self.shared_expert_intermediate_size = bool(qkv_bias), shared_expert_intermediate_size
        super().__init__(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, head_dim=head_dim or hidden_size // num_attention_heads,
                         num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                         moe_intermediate_size=moe_intermediate_size, **kwargs)


class Qwen2MoeBlock(SparseMoeBlock):
    """`moe.SparseMoeBlock` with Qwen2-MoE's gated shared expert."""

    shared_name = "shared_expert"

    @staticmethod
    def shared_width(config):
        return config.shared_expert_intermediate_size

    def __init__(self, config):
        super().__init__(config)
        self.shared_expert = MLP(config, self.shared_width(config))
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias_attr=False)

    def shared_layers(self):
        return self.shared_expert, self.shared_expert_gate


class Qwen2MoePretrainedModel(Qwen3PretrainedModel):
    config_class = Qwen2MoeConfig
    base_model_prefix = "qwen2_moe"
    family_label = "Qwen2-MoE"


Qwen2MoeModel = moe_model_class(Qwen2MoePretrainedModel, "Qwen2MoeModel", is_sparse_layer, Qwen2MoeBlock)
Qwen2MoeForCausalLM = moe_causal_lm_class(Qwen2MoePretrainedModel, Qwen2MoeModel, "Qwen2MoeForCausalLM")
