"""Real-shaped models with random weights and a locally trained tokenizer, no download.

`REAL_SHAPES` holds the published widths of each model, copied from its Hugging Face
``config.json``, under transformers' key names; the layer count is the caller's
(`num_layers`), so a model keeps every width of the real one but not its depth:

- ``qwen2.5-0.5b`` (Qwen/Qwen2.5-0.5B): PaddleNLP's `Qwen2ForCausalLM`, q/k/v biases, tied.
- ``llama3``: a Llama-3-shaped `LlamaForCausalLM` (Llama 3's vocabulary, 32 query / 8 KV heads
  and rope theta; hidden 512, narrower than any released Llama 3), untied.
- ``qwen3-0.6b`` (Qwen/Qwen3-0.6B): our `Qwen3ForCausalLM`, per-head q/k RMSNorm, tied.
- ``ernie4.5-0.3b`` (baidu/ERNIE-4.5-0.3B-PT): our `Ernie4_5ForCausalLM`, interleaved RoPE, tied.
- ``qwen3-30b-a3b-e16`` (Qwen/Qwen3-30B-A3B with 16 of its 128 experts and top-4 of its top-8):
  our `Qwen3MoeForCausalLM`, every layer sparse, untied; every width (hidden 2,048, 32 query / 4
  KV heads of 128, experts 768 wide) is the real one. ``output_router_logits`` is on (the
  checkpoint ships it off): training adds the load-balancing loss and logs ``moe/*``.

Our families' configs are built from these dicts by the family module's ``paddle_config`` (the
mapping a Hugging Face import uses), so a field our classes would not honour is refused here as
it would be on import. The tokenizer's ids are a prefix of the vocabulary, as Qwen pads its
embedding; the rows past the tokenizer are zero (never trained, as in a released checkpoint), so
their logits are 0 and greedy decoding of a random model stays inside the tokenizer.
"""
import json
import os

REAL_SHAPES = {
    "qwen2.5-0.5b": dict(
        tokenizer="qwen2", model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-6, max_position_embeddings=32768,
    ),
    "llama3": dict(
        tokenizer="llama3", model_type="llama", vocab_size=128256, hidden_size=512, intermediate_size=1792,
        num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, tie_word_embeddings=False,
        rms_norm_eps=1e-5, max_position_embeddings=8192,
    ),
    "qwen3-0.6b": dict(  # Qwen/Qwen3-0.6B config.json (28 layers there)
        tokenizer="qwen3", model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-6, max_position_embeddings=40960, attention_bias=False, hidden_act="silu",
        use_sliding_window=False,
    ),
    "ernie4.5-0.3b": dict(  # baidu/ERNIE-4.5-0.3B-PT config.json (18 layers there)
        tokenizer="ernie45", model_type="ernie4_5", vocab_size=103424, hidden_size=1024, intermediate_size=3072,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, rope_theta=500000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-5, max_position_embeddings=131072, use_bias=False, hidden_act="silu",
    ),
    "qwen3-30b-a3b-e16": dict(  # Qwen/Qwen3-30B-A3B config.json (48 layers, 128 experts, top-8 there)
        tokenizer="qwen3", model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, rope_theta=1000000.0, tie_word_embeddings=False,
        rms_norm_eps=1e-6, max_position_embeddings=40960, attention_bias=False, hidden_act="silu",
        use_sliding_window=False, moe_intermediate_size=768, num_experts=16, num_experts_per_tok=4,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
        output_router_logits=True,
    ),
}
"""Model shapes by name: the real vocabulary, widths, heads, biases, tying, rope theta and routing;
the layer count is chosen by the caller (`num_layers`)."""

SMALL_OVERRIDES = {
    "qwen2.5-0.5b": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2),
    "llama3": dict(hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2),
    "qwen3-0.6b": dict(hidden_size=64, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "ernie4.5-0.3b": dict(hidden_size=64, intermediate_size=192, num_attention_heads=8, num_key_value_heads=1,
                          head_dim=16),
    "qwen3-30b-a3b-e16": dict(hidden_size=64, intermediate_size=192, num_attention_heads=8, num_key_value_heads=1,
                              head_dim=16, moe_intermediate_size=24),
}
"""Sizes of the small stand-ins (`build_real_shape(..., small=True)`), same head ratios as the real shapes."""


def _config_and_class(model_type, spec):
    """``(config, causal LM class)`` of `spec` (PaddleNLP's classes for llama / qwen2, else the
    family module's config mapping and class)."""
    from ..models.families import family_module

    module = family_module(model_type)
    if module is not None:
        return module.CONFIG_CLASS(**module.paddle_config(dict(spec, model_type=model_type)), dtype="float32"), \
            module.CAUSAL_LM_CLASS
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if model_type == "qwen2":
        return Qwen2Config(use_sliding_window=False, use_flash_attention=False, dtype="float32", **spec), Qwen2ForCausalLM
    return LlamaConfig(use_flash_attention=False, dtype="float32", **spec), LlamaForCausalLM


def real_shape_model(shape, tokenizer, num_layers=1, seed=42, **overrides):
    """A randomly initialised model of `shape` (see `REAL_SHAPES`) for `tokenizer`, in eval mode.

    `overrides` replace entries of the shape (e.g. `hidden_size=64, vocab_size=len(tokenizer)`
    for a small model of the same family: GQA, biases, tying and rope theta kept).
    Embedding (and untied LM-head) rows from `len(tokenizer)` to the model vocabulary are zero.
    """
    import paddle

    if shape not in REAL_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(REAL_SHAPES)}")
    unknown = set(overrides) - (set(REAL_SHAPES[shape]) - {"tokenizer", "model_type"})
    if unknown:
        raise ValueError(f"real_shape_model: unknown override(s) {sorted(unknown)}")
    spec = {**REAL_SHAPES[shape], **overrides}
    spec.pop("tokenizer")
    model_type = spec.pop("model_type")
    n_tok = len(tokenizer)
    if n_tok > spec["vocab_size"]:
        raise ValueError(f"tokenizer has {n_tok} ids, more than the model vocabulary {spec['vocab_size']}")
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
    spec.update(num_hidden_layers=num_layers, initializer_range=0.02, bos_token_id=bos,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config, model_class = _config_and_class(model_type, spec)
    paddle.seed(seed)
    model = model_class(config)
    model.eval()
    with paddle.no_grad():
        model.get_input_embeddings().weight[n_tok:] = 0.0
        if not spec["tie_word_embeddings"]:
            model.lm_head.weight[:, n_tok:] = 0.0  # [H, V]
    return model


def build_real_shape(output_dir, shape, num_layers=1, seed=42, tokenizer_vocab_size=1024, small=False):
    """Build a real-shaped model (see `REAL_SHAPES`) and its tokenizer into `output_dir`.

    The tokenizer is `ppo.tiny.bpe_tokenizers`' of the shape's style (Qwen2 / Qwen3 / Llama 3
    byte-level BPE, ERNIE 4.5 SentencePiece BPE) with the family's chat template.
    `small=True` keeps the family (GQA ratio, biases, tying, rope theta, routing, tokenizer and
    chat template) at `SMALL_OVERRIDES` sizes with the vocabulary cut to the tokenizer: a fast
    stand-in for pipeline tests. Returns `(tokenizer, model)`; both load with
    `from_pretrained(output_dir)` (`ppo.models.families.causal_lm_from_pretrained`).
    """
    from .bpe_tokenizers import build_tokenizer as build_bpe_tokenizer

    if shape not in REAL_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(REAL_SHAPES)}")
    style = REAL_SHAPES[shape]["tokenizer"]
    tokenizer = build_bpe_tokenizer(style, output_dir, vocab_size=tokenizer_vocab_size, seed=seed)
    overrides = dict(SMALL_OVERRIDES[shape], vocab_size=len(tokenizer)) if small else {}
    model = real_shape_model(shape, tokenizer, num_layers=num_layers, seed=seed, **overrides)
    model.save_pretrained(output_dir)
    with open(os.path.join(output_dir, "tiny_factory.json"), "w") as f:
        json.dump({"shape": shape, "small": small, "num_layers": num_layers, "seed": seed,
                   "tokenizer_ids": len(tokenizer)}, f, indent=2)
    return tokenizer, model
