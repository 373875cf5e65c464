"""ERNIE 4.5 (dense) in Paddle: config, base model, causal LM.

The architecture of transformers' `Ernie4_5ForCausalLM` (Baidu, 2025; ERNIE-4.5-0.3B): Llama's
pre-norm decoder with grouped-query attention (16 query heads over 2 KV heads), ``head_dim`` its
own field (128 with hidden 1,024), rotary embeddings on the interleaved pairs ``(2i, 2i + 1)``
of each head (GLM's ``rotate_half``, theta 500,000), ``use_bias`` putting a bias on every
projection (q/k/v/o and gate/up/down), RMSNorm with eps 1e-5 and the LM head tied to the
embedding by default. The layers are `ppo.models.families.decoder`'s; names follow PaddleNLP's
Llama with the ``ernie.`` prefix (PaddleFormers' ERNIE 4.5 prefix): ``ernie.layers.i.self_attn
.q_proj.weight`` ``[in, out]``. Built, saved and loaded as PaddleNLP's models are; the score model
is `ppo.models.score_model`'s ``Ernie4_5ModelForScore``.
"""
import paddle
import paddle.nn as nn
from paddlenlp.transformers.configuration_utils import PretrainedConfig
from paddlenlp.transformers.model_outputs import CausalLMOutputWithPast
from paddlenlp.transformers.model_utils import PretrainedModel, register_base_model
from paddlenlp.transformers.qwen2.modeling import Qwen2ForCausalLM

from .decoder import DecoderLayer, LMHead, RMSNorm, decoder_forward, warn_unimplemented_switches

__all__ = ["Ernie4_5Config", "Ernie4_5PretrainedModel", "Ernie4_5Model", "Ernie4_5ForCausalLM"]


class Ernie4_5Config(PretrainedConfig):
    """Fields and defaults of transformers' `Ernie4_5Config` that change the numbers (ERNIE-4.5-0.3B's
    shape). A non-SiLU ``hidden_act`` is refused here."""

    model_type = "ernie4_5"
    qk_norm = False  # facts of the architecture, not settings (not saved)
    rope_interleaved = True

    def __init__(self, vocab_size=103424, hidden_size=1024, intermediate_size=3072, num_hidden_layers=18,
                 num_attention_heads=16, num_key_value_heads=2, head_dim=128, hidden_act="silu",
                 max_position_embeddings=131072, initializer_range=0.02, rms_norm_eps=1e-5, use_cache=True,
                 tie_word_embeddings=True, rope_theta=500000.0, use_bias=False, pad_token_id=0, bos_token_id=1,
                 eos_token_id=2, **kwargs):
        if hidden_act != "silu":
            raise ValueError(f"ERNIE 4.5 config: not supported here: hidden_act {hidden_act!r} (only silu)")
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act, self.use_bias = hidden_act, bool(use_bias)
        self.max_position_embeddings, self.initializer_range = max_position_embeddings, initializer_range
        self.rms_norm_eps, self.rope_theta = rms_norm_eps, rope_theta
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, use_cache=use_cache, **kwargs)


class Ernie4_5PretrainedModel(PretrainedModel):
    config_class = Ernie4_5Config
    base_model_prefix = "ernie"
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb.inv_freq"]

    def __init__(self, config):
        if int(getattr(config, "tensor_parallel_degree", 1) or 1) > 1:
            raise ValueError("ERNIE 4.5: tensor_parallel_degree > 1 is not implemented for this family here; set it to 1")
        warn_unimplemented_switches(config, "ERNIE 4.5")
        super().__init__(config)

    def _init_weights(self, layer):
        """Normal(0, initializer_range) for linear, embedding and untied head weights (biases stay 0)."""
        if isinstance(layer, (nn.Linear, nn.Embedding)) or isinstance(layer, LMHead) and not layer.transpose_y:
            layer.weight.set_value(paddle.normal(0.0, self.config.initializer_range, layer.weight.shape)
                                   .astype(layer.weight.dtype))


@register_base_model
class Ernie4_5Model(Ernie4_5PretrainedModel):
    """Embedding, decoder layers and final norm; ``forward`` gives the last hidden states ``[B, T, H]``."""

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.LayerList([DecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.enable_recompute = False

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, use_cache=None,
                past_key_values=None, output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        return decoder_forward(self, input_ids, position_ids, attention_mask, inputs_embeds, use_cache,
                               past_key_values, output_hidden_states, return_dict, output_attentions=output_attentions,
                               **kwargs)


class Ernie4_5ForCausalLM(Ernie4_5PretrainedModel):
    """`Ernie4_5Model` and an LM head (tied to the embedding with ``tie_word_embeddings``)."""

    _tied_weights_keys = ["lm_head.weight"]
    prepare_inputs_for_generation = Qwen2ForCausalLM.prepare_inputs_for_generation
    update_model_kwargs_for_generation = staticmethod(Qwen2ForCausalLM.update_model_kwargs_for_generation)

    def __init__(self, config):
        super().__init__(config)
        self.ernie = Ernie4_5Model(config)
        tied = self.ernie.embed_tokens.weight if config.tie_word_embeddings else None
        self.lm_head = LMHead(config, embedding_weight=tied)

    def get_input_embeddings(self):
        return self.ernie.embed_tokens

    def set_input_embeddings(self, value):
        self.ernie.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def get_decoder(self):
        return self.ernie

    def tie_weights(self):
        """The head shares the embedding ``[V, H]`` by construction (``transpose_y``)."""

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                use_cache=None, past_key_values=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        """``logits [B, T, V]`` (and the cache with ``use_cache``). ``labels`` are refused: the
        trainers here compute their losses from the logits (`ppo.models.causal_lm`)."""
        if labels is not None:
            raise NotImplementedError("Ernie4_5ForCausalLM: labels (a built-in loss) are not implemented; use "
                                      "ppo.models.causal_lm.answer_nll")
        out = self.ernie(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         inputs_embeds=inputs_embeds, use_cache=use_cache, past_key_values=past_key_values,
                         output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                         return_dict=True, **kwargs)
        logits = self.lm_head(out.last_hidden_state)
        result = CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values,
                                        hidden_states=out.hidden_states)
        if return_dict or return_dict is None and self.config.use_return_dict:
            return result
        return (logits,) + tuple(v for v in (out.past_key_values, out.hidden_states) if v is not None)
