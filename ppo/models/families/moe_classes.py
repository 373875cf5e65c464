"""The Paddle classes every mixture-of-experts family of our own shares: its decoder layer, base
model and causal LM (`ppo.models.families.causal_classes` made with a sparse block).

A family gives its rule for which layers are sparse (``is_sparse(config, index)``) and its block
class (`moe.SparseMoeBlock` or a subclass). The sparse layer returns ``(x, cache, router_logits
[B*T, E])``; the base model adds ``moe_layers()``; the causal LM's forward takes
``output_router_logits`` and ``moe_expert_indices`` (one ``[B*T, k]`` per MoE layer: routing
replay, R3) and returns `MoECausalLMOutputWithPast` with ``router_logits`` and ``aux_loss``
(`moe.moe_losses`: ``router_aux_loss_coef`` x the load-balancing loss + ``router_z_loss_coef`` x
the z-loss, padding excluded). That loss and its stats stay on the model (``moe_aux_loss``,
``moe_stats``) for trainers that compute their own loss from the logits (`moe.take_aux_loss`);
``last_expert_indices()`` gives the experts of the last forward.
"""
from paddlenlp.transformers.model_outputs import MoECausalLMOutputWithPast

from .causal_classes import CausalLMMethods, causal_lm_class, decoder_model_class
from .decoder import DecoderLayer
from .moe import moe_losses
from .tensor_parallel import MoeLayout


class MoeDecoderLayer(DecoderLayer):
    """A `DecoderLayer` whose MLP is `block_class(config)`; returns ``(x, cache, router_logits)``."""

    def __init__(self, config, block_class):
        super().__init__(config)
        self.mlp = block_class(config)
        self.replay_indices = None  # [B*T, k] for the next forward (routing replay)
        self.last_indices = None

    def forward(self, x, position_ids, attention_mask, past_key_value=None, use_cache=False, expert_indices=None):
        """``expert_indices [B*T, k]``: the routing to replay (`decoder_forward` passes ``replay_indices``)."""
        x, present = self.attention_block(x, position_ids, attention_mask, past_key_value, use_cache)
        out, logits, indices = self.mlp(self.post_attention_layernorm(x), expert_indices)
        self.last_indices = indices.detach()
        return x + out, present, logits


def moe_model_class(pretrained, name, is_sparse, block_class):
    """The family's base model: a `MoeDecoderLayer` where ``is_sparse(config, i)``, else a dense one;
    records that layout on `pretrained` (``moe_layout``: its tensor-parallel mappings read it)."""
    pretrained.moe_layout = MoeLayout(is_sparse, block_class.shared_name, block_class.shared_width)
    pretrained.moe_block_class = block_class  # the pipeline classes build their sparse layers with it

    def layer_of(config, index):
        return MoeDecoderLayer(config, block_class) if is_sparse(config, index) else DecoderLayer(config)

    model = decoder_model_class(pretrained, name, layer_of)
    model.moe_layers = lambda self: [layer for layer in self.layers if isinstance(layer, MoeDecoderLayer)]
    return model


class MoeCausalLMMethods(CausalLMMethods):
    """`CausalLMMethods` with router outputs, auxiliary losses and routing replay (module docstring)."""

    def __init__(self, config):
        super().__init__(config)
        self.moe_aux_loss, self.moe_stats = None, {}

    def last_expert_indices(self):
        """The experts each MoE layer chose in the last forward: a list of ``[B*T, k]`` int64."""
        return [layer.last_indices for layer in self.get_decoder().moe_layers()]

    def _set_replay(self, indices):
        layers = self.get_decoder().moe_layers()
        if indices is not None and len(indices) != len(layers):
            raise ValueError(f"moe_expert_indices: {len(indices)} entries for {len(layers)} MoE layers")
        for i, layer in enumerate(layers):
            layer.replay_indices = None if indices is None else indices[i]

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                use_cache=None, past_key_values=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, output_router_logits=None, moe_expert_indices=None, **kwargs):
        """``logits [B, T, V]``, the cache with ``use_cache``, and with ``output_router_logits``
        the router logits and ``aux_loss`` (see the module docstring). ``labels`` are refused."""
        self._set_replay(moe_expert_indices)
        try:
            out = self.decoder_outputs(input_ids, position_ids, attention_mask, inputs_embeds, labels, use_cache,
                                       past_key_values, output_attentions, output_hidden_states, **kwargs)
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
        return self.as_output(result, logits, out, return_dict)


def moe_causal_lm_class(pretrained, model_class, name):
    """The family's MoE causal LM class `name` (`causal_lm_class` with `MoeCausalLMMethods`)."""
    return causal_lm_class(pretrained, model_class, name, methods=MoeCausalLMMethods)
