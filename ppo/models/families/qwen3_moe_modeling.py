"""Qwen3-MoE in Paddle: config, base model, causal LM.

The architecture of transformers' `Qwen3MoeForCausalLM`: Qwen3's attention (per-head q/k
RMSNorm, ``head_dim`` its own field, no biases) and, on layer i, the sparse block of
`ppo.models.families.moe` when ``i`` is not in ``mlp_only_layers`` and ``(i + 1) %
decoder_sparse_step == 0`` (experts ``moe_intermediate_size`` wide), else a dense SwiGLU MLP
``intermediate_size`` wide. Names follow PaddleNLP's layout with the ``qwen3_moe.`` prefix:
``qwen3_moe.layers.i.mlp.gate.weight [H, E]``, ``...mlp.experts.e.{gate,up,down}_proj.weight``.

With ``output_router_logits`` (config or argument) the forward returns ``router_logits`` (one
``[B*T, E]`` per MoE layer) and ``aux_loss`` (`moe.moe_losses`: ``router_aux_loss_coef`` x the
load-balancing loss + ``router_z_loss_coef`` x the z-loss, padding excluded), and keeps that
loss and its stats on the model (``moe_aux_loss``, ``moe_stats``) for trainers that compute
their own loss from the logits (`moe.take_aux_loss`). ``moe_expert_indices`` (one ``[B*T, k]``
per MoE layer) replays a recorded routing; ``last_expert_indices()`` gives the last forward's.
"""
from paddlenlp.transformers.model_outputs import MoECausalLMOutputWithPast
from paddlenlp.transformers.model_utils import register_base_model

from .decoder import DecoderLayer, LMHead, RMSNorm, decoder_forward
from .moe import SparseMoeBlock, moe_losses
from .causal_classes import CausalLMMethods
from .qwen3_modeling import Qwen3Config, Qwen3Model, Qwen3PretrainedModel

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


class MoeDecoderLayer(DecoderLayer):
    """A `DecoderLayer` whose MLP is the sparse block; returns ``(x, cache, router_logits)``."""

    def __init__(self, config):
        super().__init__(config)
        self.mlp = SparseMoeBlock(config)
        self.replay_indices = None  # [B*T, k] for the next forward (routing replay)
        self.last_indices = None

    def forward(self, x, position_ids, attention_mask, past_key_value=None, use_cache=False, expert_indices=None):
        """``expert_indices [B*T, k]``: the routing to replay (`decoder_forward` passes ``replay_indices``)."""
        x, present = self.attention_block(x, position_ids, attention_mask, past_key_value, use_cache)
        out, logits, indices = self.mlp(self.post_attention_layernorm(x), expert_indices)
        self.last_indices = indices.detach()
        return x + out, present, logits


class Qwen3MoePretrainedModel(Qwen3PretrainedModel):
    config_class = Qwen3MoeConfig
    base_model_prefix = "qwen3_moe"
    family_label = "Qwen3-MoE"


@register_base_model
class Qwen3MoeModel(Qwen3MoePretrainedModel):
    """Embedding, decoder layers (sparse where `is_sparse_layer`), final norm."""

    get_input_embeddings = Qwen3Model.get_input_embeddings
    set_input_embeddings = Qwen3Model.set_input_embeddings

    def __init__(self, config):
        super().__init__(config)
        import paddle.nn as nn

        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.LayerList([MoeDecoderLayer(config) if is_sparse_layer(config, i) else DecoderLayer(config)
                                    for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.enable_recompute = False

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, use_cache=None,
                past_key_values=None, output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        return decoder_forward(self, input_ids, position_ids, attention_mask, inputs_embeds, use_cache,
                               past_key_values, output_hidden_states, return_dict, output_attentions=output_attentions,
                               **kwargs)

    def moe_layers(self):
        return [layer for layer in self.layers if isinstance(layer, MoeDecoderLayer)]


class Qwen3MoeForCausalLM(CausalLMMethods, Qwen3MoePretrainedModel):
    """`Qwen3MoeModel` and an LM head (tied to the embedding with ``tie_word_embeddings``)."""

    def __init__(self, config):
        super().__init__(config)
        self.qwen3_moe = Qwen3MoeModel(config)
        tied = self.qwen3_moe.embed_tokens.weight if config.tie_word_embeddings else None
        self.lm_head = LMHead(config, embedding_weight=tied)
        self.moe_aux_loss, self.moe_stats = None, {}

    def last_expert_indices(self):
        """The experts each MoE layer chose in the last forward: a list of ``[B*T, k]`` int64."""
        return [layer.last_indices for layer in self.qwen3_moe.moe_layers()]

    def _set_replay(self, indices):
        layers = self.qwen3_moe.moe_layers()
        if indices is not None and len(indices) != len(layers):
            raise ValueError(f"moe_expert_indices: {len(indices)} entries for {len(layers)} MoE layers")
        for i, layer in enumerate(layers):
            layer.replay_indices = None if indices is None else indices[i]

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                use_cache=None, past_key_values=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, output_router_logits=None, moe_expert_indices=None, **kwargs):
        """``logits [B, T, V]``, the cache with ``use_cache``, and with ``output_router_logits``
        the router logits and ``aux_loss`` (see the module docstring). ``labels`` are refused."""
        if labels is not None:
            raise NotImplementedError("Qwen3MoeForCausalLM: labels (a built-in loss) are not implemented; use "
                                      "ppo.models.causal_lm.answer_nll")
        self._set_replay(moe_expert_indices)
        try:
            out = self.qwen3_moe(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                                 inputs_embeds=inputs_embeds, use_cache=use_cache, past_key_values=past_key_values,
                                 output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                                 return_dict=True, **kwargs)
        finally:
            self._set_replay(None)
        logits = self.lm_head(out.last_hidden_state)
        routers = getattr(out, "router_logits", None) or ()
        want = self.config.output_router_logits if output_router_logits is None else output_router_logits
        aux = None
        if want and routers:
            mask = attention_mask if attention_mask is not None and attention_mask.ndim == 2 else None
            mask = mask if mask is not None and mask.shape[-1] == logits.shape[1] else None  # no cached prefix
            aux, self.moe_stats = moe_losses(routers, self.config, mask)
        self.moe_aux_loss = aux
        result = MoECausalLMOutputWithPast(aux_loss=aux, logits=logits, past_key_values=out.past_key_values,
                                           hidden_states=out.hidden_states, router_logits=routers if want else None)
        if return_dict or return_dict is None and self.config.use_return_dict:
            return result
        return (logits,) + tuple(v for v in (out.past_key_values, out.hidden_states) if v is not None)
