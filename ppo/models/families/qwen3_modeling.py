"""Qwen3 (dense) in Paddle: config, base model, causal LM.

The architecture of transformers' `Qwen3ForCausalLM` (Qwen team, 2025): Llama's pre-norm decoder
with grouped-query attention, no q/k/v/o biases, ``head_dim`` its own field (Qwen3-0.6B: hidden
1024, 16 heads of 128), and RMSNorm over each head's ``head_dim`` on q and k before RoPE
(``self_attn.q_norm`` / ``self_attn.k_norm``, weight ``[head_dim]``). The layers are
`ppo.models.families.decoder`'s; names follow PaddleNLP's Llama with the ``qwen3.`` prefix
(``qwen3.layers.i.self_attn.q_norm.weight``). Built, saved and loaded as PaddleNLP's models
are (``Qwen3ForCausalLM.from_pretrained(dir)``, ``save_pretrained``); the score model is
`ppo.models.score_model`'s ``Qwen3ModelForScore``.
"""
import paddle
import paddle.nn as nn
from paddlenlp.transformers.configuration_utils import PretrainedConfig
from paddlenlp.transformers.model_outputs import CausalLMOutputWithPast
from paddlenlp.transformers.model_utils import PretrainedModel, register_base_model
from paddlenlp.transformers.qwen2.modeling import Qwen2ForCausalLM

from .decoder import DecoderLayer, LMHead, RMSNorm, decoder_forward, warn_unimplemented_switches

__all__ = ["Qwen3Config", "Qwen3PretrainedModel", "Qwen3Model", "Qwen3ForCausalLM"]


class Qwen3Config(PretrainedConfig):
    """Fields and defaults of transformers' `Qwen3Config` that change the numbers (``head_dim``
    defaults to 128 there too when a checkpoint does not name it). What this implementation does
    not compute is refused here: ``attention_bias``, a non-SiLU ``hidden_act``, sliding-window
    attention."""

    model_type = "qwen3"
    qk_norm = True  # a fact of the architecture, not a setting (not saved)

    def __init__(self, vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=None, head_dim=128, hidden_act="silu",
                 max_position_embeddings=32768, initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True,
                 tie_word_embeddings=False, rope_theta=10000.0, attention_bias=False, attention_dropout=0.0,
                 use_sliding_window=False, pad_token_id=None, bos_token_id=None, eos_token_id=None, **kwargs):
        problems = []
        if attention_bias:
            problems.append("attention_bias true (q/k/v/o biases are not implemented here)")
        if hidden_act != "silu":
            problems.append(f"hidden_act {hidden_act!r} (only silu)")
        if use_sliding_window:
            problems.append("use_sliding_window true (sliding-window attention is not implemented here)")
        if problems:
            raise ValueError("Qwen3 config: not supported here: " + "; ".join(problems))
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim, self.hidden_act = head_dim, hidden_act
        self.max_position_embeddings, self.initializer_range = max_position_embeddings, initializer_range
        self.rms_norm_eps, self.rope_theta = rms_norm_eps, rope_theta
        self.attention_bias, self.attention_dropout, self.use_sliding_window = False, attention_dropout, False
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, use_cache=use_cache, **kwargs)


class Qwen3PretrainedModel(PretrainedModel):
    config_class = Qwen3Config
    base_model_prefix = "qwen3"
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb.inv_freq"]

    def __init__(self, config):
        if int(getattr(config, "tensor_parallel_degree", 1) or 1) > 1:
            raise ValueError("Qwen3: tensor_parallel_degree > 1 is not implemented for this family here; set it to 1")
        warn_unimplemented_switches(config, "Qwen3")
        super().__init__(config)

    def _init_weights(self, layer):
        """Normal(0, initializer_range) for linear, embedding and untied head weights."""
        if isinstance(layer, (nn.Linear, nn.Embedding)) or isinstance(layer, LMHead) and not layer.transpose_y:
            layer.weight.set_value(paddle.normal(0.0, self.config.initializer_range, layer.weight.shape)
                                   .astype(layer.weight.dtype))


@register_base_model
class Qwen3Model(Qwen3PretrainedModel):
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


class Qwen3ForCausalLM(Qwen3PretrainedModel):
    """`Qwen3Model` and an LM head (tied to the embedding with ``tie_word_embeddings``)."""

    _tied_weights_keys = ["lm_head.weight"]
    prepare_inputs_for_generation = Qwen2ForCausalLM.prepare_inputs_for_generation
    update_model_kwargs_for_generation = staticmethod(Qwen2ForCausalLM.update_model_kwargs_for_generation)

    def __init__(self, config):
        super().__init__(config)
        self.qwen3 = Qwen3Model(config)
        tied = self.qwen3.embed_tokens.weight if config.tie_word_embeddings else None
        self.lm_head = LMHead(config, embedding_weight=tied)

    def get_input_embeddings(self):
        return self.qwen3.embed_tokens

    def set_input_embeddings(self, value):
        self.qwen3.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def get_decoder(self):
        return self.qwen3

    def tie_weights(self):
        """The head shares the embedding ``[V, H]`` by construction (``transpose_y``)."""

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                use_cache=None, past_key_values=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        """``logits [B, T, V]`` (and the cache with ``use_cache``). ``labels`` are refused: the
        trainers here compute their losses from the logits (`ppo.models.causal_lm`)."""
        if labels is not None:
            raise NotImplementedError("Qwen3ForCausalLM: labels (a built-in loss) are not implemented; use "
                                      "ppo.models.causal_lm.answer_nll")
        out = self.qwen3(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         inputs_embeds=inputs_embeds, use_cache=use_cache, past_key_values=past_key_values,
                         output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                         return_dict=True, **kwargs)
        logits = self.lm_head(out.last_hidden_state)
        result = CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values,
                                        hidden_states=out.hidden_states)
        if return_dict or return_dict is None and self.config.use_return_dict:
            return result
        return (logits,) + tuple(v for v in (out.past_key_values, out.hidden_states) if v is not None)
