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
from paddlenlp.transformers.configuration_utils import PretrainedConfig

from .causal_classes import FamilyPretrainedModel, causal_lm_class, decoder_model_class

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


class Qwen3PretrainedModel(FamilyPretrainedModel):
    config_class = Qwen3Config
    base_model_prefix = "qwen3"
    family_label = "Qwen3"


Qwen3Model = decoder_model_class(Qwen3PretrainedModel, "Qwen3Model")
Qwen3ForCausalLM = causal_lm_class(Qwen3PretrainedModel, Qwen3Model, "Qwen3ForCausalLM")
