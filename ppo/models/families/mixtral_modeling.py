"""Mixtral in Paddle: config, base model, causal LM.

The architecture of transformers' `MixtralForCausalLM` (Mistral AI, 2024; Mixtral-8x7B): Llama's
attention (grouped-query, no biases, no q/k norm, ``head_dim`` hidden / heads unless given) and on
every layer the sparse block of `ppo.models.families.moe` with ``num_local_experts`` experts as
wide as ``intermediate_size``, the top ``num_experts_per_tok`` softmax probabilities always
renormalised; no dense MLP, no shared expert. Names follow PaddleNLP's ``mixtral`` prefix with
our per-expert layout: ``mixtral.layers.i.mlp.gate.weight [H, E]``,
``...mlp.experts.e.{gate,up,down}_proj.weight`` (the hub's ``block_sparse_moe.experts.e.{w1,w3,w2}``,
renamed by `ppo.models.families.mixtral`, as are the same names in a PaddleNLP Mixtral checkpoint on
load). The classes are `ppo.models.families.moe_classes`'. PaddleNLP 3.0.0b4's own
`MixtralForCausalLM` stops in its forward under Paddle 3.3.1 (a broadcast error weighting an
expert's output), hence these.
"""
import re

from .moe import SparseMoeBlock
from .moe_classes import moe_causal_lm_class, moe_model_class
from .qwen3_modeling import Qwen3PretrainedModel
from .qwen3_moe_modeling import Qwen3MoeConfig

__all__ = ["MixtralConfig", "MixtralPretrainedModel", "MixtralModel", "MixtralForCausalLM"]

HUB = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
"""Our expert matrices' names and the hub's (PaddleNLP's Mixtral uses the hub's too)."""
_HUB_NAME = re.compile(r"\.block_sparse_moe\.(gate\.weight|experts\.(\d+)\.(w1|w2|w3)\.weight)$")
DERIVED = ("num_experts", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")


class MixtralConfig(Qwen3MoeConfig):
    """transformers' `MixtralConfig` fields that change the numbers, with its defaults
    (Mixtral-8x7B's shape); the routing facts of the shared block follow from them."""

    model_type = "mixtral"
    qk_norm = False  # a fact of the architecture, not a setting (not saved)

    def __init__(self, vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=None, num_local_experts=8,
                 num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1e6, bos_token_id=1, eos_token_id=2, **kwargs):
        num_local_experts = kwargs.pop("num_experts", num_local_experts)
        for key in DERIVED:
            kwargs.pop(key, None)
        super().__init__(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, head_dim=head_dim or hidden_size // num_attention_heads,
                         num_experts=num_local_experts, num_experts_per_tok=num_experts_per_tok,
                         moe_intermediate_size=intermediate_size, norm_topk_prob=True, rms_norm_eps=rms_norm_eps,
                         rope_theta=rope_theta, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)


class MixtralPretrainedModel(Qwen3PretrainedModel):
    config_class = MixtralConfig
    base_model_prefix = "mixtral"
    family_label = "Mixtral"

    @classmethod
    def _load_pretrained_model(cls, model, state_dict, loaded_keys, *args, **kwargs):
        """A checkpoint in PaddleNLP's own Mixtral layout (``block_sparse_moe.experts.e.w1/w3/w2``,
        ``[in, out]`` as ours) is renamed to ours before it loads; sharded, or split for tensor
        parallelism (the split reads our names), it is refused by name."""
        if any(".block_sparse_moe." in key for key in loaded_keys):
            if int(getattr(model.config, "tensor_parallel_degree", 1) or 1) > 1:
                raise ValueError("Mixtral: a checkpoint in PaddleNLP's block_sparse_moe layout is not split for "
                                 "tensor_parallel_degree > 1 here; load and save it once at degree 1 (our names) first")
            if state_dict is None:
                raise ValueError("Mixtral: a sharded checkpoint in PaddleNLP's block_sparse_moe layout is not read here; "
                                 "save it unsharded or export it to Hugging Face safetensors")
            state_dict = our_expert_names(state_dict)
            loaded_keys = list(state_dict)
        return super()._load_pretrained_model(model, state_dict, loaded_keys, *args, **kwargs)


def our_expert_names(tensors):
    """``{name: tensor}`` with the hub's ``block_sparse_moe.gate`` / ``experts.e.{w1,w3,w2}`` names
    as ours (``mlp.gate``, ``mlp.experts.e.{gate,up,down}_proj``); other names unchanged."""
    back = {w: name for name, w in HUB.items()}
    out = {}
    for name, value in tensors.items():
        m = _HUB_NAME.search(name)
        if m and m.group(2) is None:
            name = name[:m.start()] + ".mlp.gate.weight"
        elif m:
            name = name[:m.start()] + f".mlp.experts.{m.group(2)}.{back[m.group(3)]}.weight"
        out[name.replace(".block_sparse_moe.", ".mlp.")] = value
    return out


def every_layer(config, index):
    return True


MixtralModel = moe_model_class(MixtralPretrainedModel, "MixtralModel", every_layer, SparseMoeBlock)
MixtralForCausalLM = moe_causal_lm_class(MixtralPretrainedModel, MixtralModel, "MixtralForCausalLM")
