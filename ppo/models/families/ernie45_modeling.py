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
from paddlenlp.transformers.configuration_utils import PretrainedConfig

from .causal_classes import FamilyPretrainedModel, causal_lm_class, decoder_model_class

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


class Ernie4_5PretrainedModel(FamilyPretrainedModel):
    config_class = Ernie4_5Config
    base_model_prefix = "ernie"
    family_label = "ERNIE 4.5"


Ernie4_5Model = decoder_model_class(Ernie4_5PretrainedModel, "Ernie4_5Model")
Ernie4_5ForCausalLM = causal_lm_class(Ernie4_5PretrainedModel, Ernie4_5Model, "Ernie4_5ForCausalLM")
