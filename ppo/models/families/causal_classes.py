"""The Paddle classes every family of our own shares: pretrained base, decoder model, causal LM.

A family declares its config class and its `FamilyPretrainedModel` subclass (``config_class``,
``base_model_prefix``, ``family_label``); `decoder_model_class` and `causal_lm_class` then make
its base model (embedding, `decoder.DecoderLayer`s, final norm: hidden states ``[B, T, H]``) and
its causal LM (that model and an `LMHead`, tied to the embedding with ``tie_word_embeddings``:
logits ``[B, T, V]``). The classes are made per family because PaddleNLP's
``register_base_model`` records the base model on the decorated class's first base, which must be
the family's own pretrained class.
"""
import paddle
import paddle.nn as nn
from paddlenlp.transformers.model_outputs import CausalLMOutputWithPast
from paddlenlp.transformers.model_utils import PretrainedModel, register_base_model
from paddlenlp.transformers.qwen2.modeling import Qwen2ForCausalLM

from . import tensor_parallel as tp
from .decoder import DecoderLayer, LMHead, RMSNorm, decoder_forward, warn_unimplemented_switches


class FamilyPretrainedModel(PretrainedModel):
    """Checks the tensor-parallel widths (`tensor_parallel.problems`, one line naming each key),
    logs the GPU switches that do nothing in these classes, initialises weights as the families'
    reference code does, and gives PaddleNLP its tensor-parallel mappings (`tensor_parallel`).
    ``moe_layout``: a mixture-of-experts family's `tensor_parallel.MoeLayout` (set by
    `moe_classes.moe_model_class`)."""

    family_label = "this family"
    moe_layout = None
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb.inv_freq"]

    def __init__(self, config):
        problems = tp.problems(config, self.moe_layout)
        if problems:
            raise ValueError(f"{self.family_label}: tensor parallelism: " + "; ".join(problems))
        warn_unimplemented_switches(config, self.family_label)
        super().__init__(config)

    @classmethod
    def _get_tensor_parallel_mappings(cls, config, is_split=True):
        """``{key: split or merge function}`` of every split weight (`tensor_parallel.mappings`)."""
        return tp.mappings(config, cls.moe_layout, is_split)

    def _init_weights(self, layer):
        """Normal(0, initializer_range) for linear, embedding and untied head weights (biases stay 0)."""
        kinds = (nn.Linear, nn.Embedding) + (tp.parallel_layer_types() if tp.degree(self.config) > 1 else ())
        if isinstance(layer, kinds) or isinstance(layer, LMHead) and not layer.transpose_y:
            layer.weight.set_value(paddle.normal(0.0, self.config.initializer_range, layer.weight.shape)
                                   .astype(layer.weight.dtype))


def _named(cls, pretrained, name, doc):
    cls.__name__ = cls.__qualname__ = name
    cls.__module__, cls.__doc__ = pretrained.__module__, doc
    return cls


def decoder_model_class(pretrained, name, layer_of=None):
    """The family's base model class `name` (registered as its base model), built on `pretrained`
    with one `layer_of(config, index)` per layer (default a `DecoderLayer`)."""
    layer_of = layer_of or (lambda config, index: DecoderLayer(config))

    class DecoderModel(pretrained):
        def __init__(self, config):
            super().__init__(config)
            self.embed_tokens = tp.embedding(config)
            self.layers = nn.LayerList([layer_of(config, i) for i in range(config.num_hidden_layers)])
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.enable_recompute = False

        def get_input_embeddings(self):
            return self.embed_tokens

        def set_input_embeddings(self, value):
            self.embed_tokens = value

        def forward(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, use_cache=None,
                    past_key_values=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                    **kwargs):
            return decoder_forward(self, input_ids, position_ids, attention_mask, inputs_embeds, use_cache,
                                   past_key_values, output_hidden_states, return_dict,
                                   output_attentions=output_attentions, **kwargs)

    doc = "Embedding, decoder layers and final norm; ``forward`` gives the last hidden states ``[B, T, H]``."
    return register_base_model(_named(DecoderModel, pretrained, name, doc))


class CausalLMMethods:
    """The causal LM's methods over its decoder (``getattr(self, self.base_model_prefix)``)."""

    _tied_weights_keys = ["lm_head.weight"]
    prepare_inputs_for_generation = Qwen2ForCausalLM.prepare_inputs_for_generation
    update_model_kwargs_for_generation = staticmethod(Qwen2ForCausalLM.update_model_kwargs_for_generation)

    def get_input_embeddings(self):
        return self.get_decoder().embed_tokens

    def set_input_embeddings(self, value):
        self.get_decoder().embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def get_decoder(self):
        return getattr(self, self.base_model_prefix)

    def tie_weights(self):
        """The head shares the embedding ``[V, H]`` by construction (``transpose_y``)."""

    def logits_output(self, out, return_dict):
        """The LM head over the decoder output `out`: ``CausalLMOutputWithPast`` or a tuple."""
        logits = self.lm_head(out.last_hidden_state)
        result = CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values,
                                        hidden_states=out.hidden_states)
        return self.as_output(result, logits, out, return_dict)

    def as_output(self, result, logits, out, return_dict):
        if return_dict or return_dict is None and self.config.use_return_dict:
            return result
        return (logits,) + tuple(v for v in (out.past_key_values, out.hidden_states) if v is not None)

    def decoder_outputs(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None,
                        labels=None, use_cache=None, past_key_values=None, output_attentions=None,
                        output_hidden_states=None, **kwargs):
        """The decoder's output (a dict-like model output); ``labels`` are refused: the trainers
        here compute their losses from the logits (`ppo.models.causal_lm`)."""
        if labels is not None:
            raise NotImplementedError(f"{type(self).__name__}: labels (a built-in loss) are not implemented; use "
                                      "ppo.models.causal_lm.answer_nll")
        return self.get_decoder()(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                                  inputs_embeds=inputs_embeds, use_cache=use_cache, past_key_values=past_key_values,
                                  output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                                  return_dict=True, **kwargs)

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                use_cache=None, past_key_values=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        """``logits [B, T, V]`` (and the cache with ``use_cache``); see `decoder_outputs`."""
        out = self.decoder_outputs(input_ids, position_ids, attention_mask, inputs_embeds, labels, use_cache,
                                   past_key_values, output_attentions, output_hidden_states, **kwargs)
        return self.logits_output(out, return_dict)


def causal_lm_class(pretrained, model_class, name, methods=CausalLMMethods):
    """The family's causal LM class `name`: `model_class` under ``base_model_prefix`` and an LM
    head, with `methods`' forward (`CausalLMMethods`: ``logits [B, T, V]``, the cache with ``use_cache``)."""

    class CausalLM(methods, pretrained):  # the methods first: PretrainedModel has defaults of theirs
        def __init__(self, config):
            super().__init__(config)
            setattr(self, self.base_model_prefix, model_class(config))
            tied = self.get_decoder().embed_tokens.weight if config.tie_word_embeddings else None
            self.lm_head = LMHead(config, embedding_weight=tied)

    doc = (f"`{model_class.__name__}` and an LM head (tied to the embedding with ``tie_word_embeddings``).")
    return _named(CausalLM, pretrained, name, doc)
