"""Build the tiny CPU model and its tokenizer from a seed, with no download.

The tokenizer is a SentencePiece character model wrapped as PaddleNLP's
`LlamaTokenizer`: every printable ASCII symbol is one token, each template word
(`USER:`, `ASSISTANT:`, `Reverse:`) is one token, a space is the token `▁`, and
`<pad>` (id 3) is distinct from `</s>` (id 2). The model is a randomly
initialised `LlamaForCausalLM` (`--arch qwen3` / `qwen3_moe` / `qwen2_moe` / `mixtral` /
`ernie45` / `ernie45_moe`: our classes, see `ARCHS`; the Qwen3 and ERNIE 4.5 ones' tokenizer also
has a newline token (id 7) and, after the vocabulary, the family's template tokens, with the
family's chat template in `tokenizer_config.json`: `ppo.tiny.family_chat`). Both are saved with
`save_pretrained`, so
`AutoTokenizer.from_pretrained(dir)` and `AutoModelForCausalLM.from_pretrained(dir)`
load them like any PaddleNLP model directory.

Real shapes (`--shape`): `ppo.tiny.real_shapes` (re-exported here): the published widths of
Qwen2.5-0.5B, Llama 3, Qwen3-0.6B, ERNIE-4.5-0.3B and Qwen3-30B-A3B (fewer experts) with few
layers, random weights and a locally trained tokenizer of the family's style.

CLI: `python -m ppo.tiny.factory --output_dir models/tiny --hidden_size 128 --num_layers 2 [--arch qwen3|qwen3_moe|qwen2_moe|mixtral|ernie45|ernie45_moe]`,
`python -m ppo.tiny.factory --output_dir models/qwen --shape qwen2.5-0.5b --num_layers 2`
"""
import argparse
import functools
import io
import json
import os
import string
import tempfile

from .family_chat import FAMILY_CHAT, add_family_chat, write_chat_template
from .real_shapes import REAL_SHAPES, SMALL_OVERRIDES, build_real_shape, real_shape_model  # noqa: F401 (re-exported)

TEMPLATE_WORDS = ["USER:", "ASSISTANT:", "Reverse:"]
SYMBOLS = string.ascii_lowercase + string.digits + string.ascii_uppercase + ".,:;!?()[]{}<>/+-*=_'\"#@%&|~^$"
SPECIAL_IDS = {"unk": 0, "bos": 1, "eos": 2, "pad": 3}
FAMILY_SYMBOLS = ["\n"]
"""One more symbol of the Qwen3 / ERNIE 4.5 tiny tokenizers (id 7): their chat templates' newline."""
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
"""With `tool_tags=True`, one token each, appended after the vocabulary (ids 100-103): the tagged
tool-call form of ppo/agents/tool_calls.py in four tokens instead of 50 characters. Off by
default, so the demo's vocabulary, model and tokenisation stay as they were."""


def build_sentencepiece_proto(extra_symbols=()):
    """Return the serialised SentencePiece model (bytes); deterministic, no randomness.
    `extra_symbols`: more one-token symbols after `TEMPLATE_WORDS` (the families' newline)."""
    import sentencepiece as spm

    corpus = [" ".join(SYMBOLS)] * 3
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=buf,
        model_type="char",
        vocab_size=len(SPECIAL_IDS) + len(TEMPLATE_WORDS) + len(extra_symbols) + len(SYMBOLS) + 1,  # +1: "▁"
        user_defined_symbols=TEMPLATE_WORDS + list(extra_symbols),
        unk_id=SPECIAL_IDS["unk"],
        bos_id=SPECIAL_IDS["bos"],
        eos_id=SPECIAL_IDS["eos"],
        pad_id=SPECIAL_IDS["pad"],
        add_dummy_prefix=False,  # else every text gets a leading "▁" token
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        character_coverage=1.0,
        minloglevel=2,
        num_threads=1,
    )
    return buf.getvalue()


def build_tokenizer(output_dir, tool_tags=False, arch="llama"):
    """Write a `LlamaTokenizer` into `output_dir` and return it (`tool_tags`: with `TOOL_TAGS`;
    `arch` qwen3 / qwen3_moe / ernie45: with the family's template tokens and chat template,
    `ppo.tiny.family_chat`)."""
    from paddlenlp.transformers import LlamaTokenizer

    os.makedirs(output_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = os.path.join(tmp, "sentencepiece.bpe.model")
        with open(vocab_file, "wb") as f:
            f.write(build_sentencepiece_proto(FAMILY_SYMBOLS if arch in FAMILY_CHAT else ()))
        tokenizer = LlamaTokenizer(
            vocab_file=vocab_file,
            unk_token="<unk>",
            bos_token="<s>",
            eos_token="</s>",
            pad_token="<pad>",
            add_bos_token=True,
            add_eos_token=False,
            padding_side="left",
        )
        if tool_tags:  # as special tokens: a reloaded tokenizer keeps them unsplit (added tokens it splits)
            tokenizer.add_special_tokens({"additional_special_tokens": TOOL_TAGS})
        if arch in FAMILY_CHAT:
            add_family_chat(tokenizer, arch)
        tokenizer.save_pretrained(output_dir)
    if arch in FAMILY_CHAT:
        write_chat_template(output_dir, FAMILY_CHAT[arch][0])
    return tokenizer


ARCHS = ("llama", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "ernie45", "ernie45_moe")
"""Model families of the tiny model (`arch`): Llama (the default), or Qwen3 shaped as Qwen3-0.6B
is (per-head q/k norms, two query heads per KV head, head_dim = 2 hidden / heads so that the
attention width is twice the hidden size, tied embeddings, rope theta 1e6), or Qwen3-MoE: that
Qwen3 with `TINY_MOE`'s routed experts on every layer but the first (dense), their width half
the dense MLP's, the router losses on (``output_router_logits``), or Qwen2-MoE: those experts
with Qwen2's attention (q/k/v biases, no q/k norm, head_dim hidden / heads, untied, rope theta
1e6) and a gated shared expert as wide as the dense MLP, or Mixtral: Llama's attention (GQA 2:1,
untied) with those 4 experts (top-2, the dense width) on every layer, or ERNIE 4.5 shaped as
ERNIE-4.5-0.3B is (interleaved RoPE with theta 5e5, eight query heads per KV head where the head
count allows, else one KV head, head_dim = 2 hidden / heads, tied embeddings, eps 1e-5), or ERNIE
4.5 MoE: that ERNIE with `TINY_ERNIE_MOE`'s 4 routed experts (top-2, half the dense width) and one
shared expert on every layer but the first (as ERNIE-4.5-21B-A3B's ``moe_layer_start_index`` 1),
the router losses on."""
TINY_MOE = dict(num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0], norm_topk_prob=True,
                output_router_logits=True, router_aux_loss_coef=0.001)
TINY_ERNIE_MOE = dict(moe_num_experts=4, moe_k=2, moe_num_shared_experts=1, moe_layer_start_index=1,
                      output_router_logits=True, router_aux_loss_coef=0.001)


def _qwen3_model(vocab_size, hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings, moe=False,
                 qwen2=False):
    from ..models.families.qwen2_moe_modeling import Qwen2MoeConfig, Qwen2MoeForCausalLM
    from ..models.families.qwen3_modeling import Qwen3Config, Qwen3ForCausalLM
    from ..models.families.qwen3_moe_modeling import Qwen3MoeConfig, Qwen3MoeForCausalLM

    extra = dict(TINY_MOE, moe_intermediate_size=intermediate_size // 2) if moe else {}
    if qwen2:
        extra.update(shared_expert_intermediate_size=intermediate_size)
    config_class, model_class = ((Qwen2MoeConfig, Qwen2MoeForCausalLM) if qwen2 else (Qwen3MoeConfig, Qwen3MoeForCausalLM)
                                 if moe else (Qwen3Config, Qwen3ForCausalLM))
    config = config_class(**extra,
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_heads // 2 if num_heads % 2 == 0 else num_heads,
        head_dim=hidden_size // num_heads if qwen2 else 2 * hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-6, rope_theta=1000000.0, initializer_range=0.02,
        bos_token_id=SPECIAL_IDS["bos"], eos_token_id=SPECIAL_IDS["eos"], pad_token_id=SPECIAL_IDS["pad"],
        tie_word_embeddings=not qwen2, dtype="float32",
    )
    return model_class(config)


def _mixtral_model(vocab_size, hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings):
    from ..models.families.mixtral_modeling import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_heads // 2 if num_heads % 2 == 0 else num_heads,
        max_position_embeddings=max_position_embeddings, num_local_experts=TINY_MOE["num_experts"],
        num_experts_per_tok=TINY_MOE["num_experts_per_tok"], output_router_logits=True,
        router_aux_loss_coef=TINY_MOE["router_aux_loss_coef"], initializer_range=0.02, bos_token_id=SPECIAL_IDS["bos"],
        eos_token_id=SPECIAL_IDS["eos"], pad_token_id=SPECIAL_IDS["pad"], tie_word_embeddings=False, dtype="float32",
    )
    return MixtralForCausalLM(config)


def _ernie45_model(vocab_size, hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings,
                   moe=False):
    from ..models.families.ernie45_modeling import Ernie4_5Config, Ernie4_5ForCausalLM
    from ..models.families.ernie45_moe_modeling import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

    extra = dict(TINY_ERNIE_MOE, moe_intermediate_size=intermediate_size // 2) if moe else {}
    config = (Ernie4_5_MoeConfig if moe else Ernie4_5Config)(**extra,
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_heads // 8 if num_heads % 8 == 0 else 1, head_dim=2 * hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-5, rope_theta=500000.0,
        initializer_range=0.02, bos_token_id=SPECIAL_IDS["bos"], eos_token_id=SPECIAL_IDS["eos"],
        pad_token_id=SPECIAL_IDS["pad"], tie_word_embeddings=True, use_bias=False, dtype="float32",
    )
    return (Ernie4_5_MoeForCausalLM if moe else Ernie4_5ForCausalLM)(config)


_FAMILY_MODELS = {"qwen3": _qwen3_model, "qwen3_moe": functools.partial(_qwen3_model, moe=True),
                  "qwen2_moe": functools.partial(_qwen3_model, moe=True, qwen2=True), "mixtral": _mixtral_model,
                  "ernie45": _ernie45_model,
                  "ernie45_moe": functools.partial(_ernie45_model, moe=True)}


def build_model(
    output_dir,
    vocab_size,
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    intermediate_size=336,
    max_position_embeddings=128,
    seed=42,
    arch="llama",
):
    """Write a randomly initialised causal LM of `arch` (`ARCHS`) into `output_dir` and return it."""
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r}: choose one of {ARCHS}")
    if arch in _FAMILY_MODELS:
        paddle.seed(seed)
        model = _FAMILY_MODELS[arch](vocab_size, hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings)
        model.eval()
        model.save_pretrained(output_dir)
        return model
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        bos_token_id=SPECIAL_IDS["bos"],
        eos_token_id=SPECIAL_IDS["eos"],
        pad_token_id=SPECIAL_IDS["pad"],
        tie_word_embeddings=False,
        use_flash_attention=False,
        dtype="float32",
    )
    paddle.seed(seed)
    model = LlamaForCausalLM(config)
    model.eval()
    model.save_pretrained(output_dir)
    return model


def build_tiny(output_dir, seed=42, tool_tags=False, **model_kwargs):
    """Build tokenizer and model into one directory; returns `(tokenizer, model)`. `arch`
    (in `model_kwargs`, see `ARCHS`) is recorded in `tiny_factory.json` only when not llama."""
    if model_kwargs.get("arch") == "llama":
        model_kwargs.pop("arch")
    tokenizer = build_tokenizer(output_dir, tool_tags=tool_tags, arch=model_kwargs.get("arch", "llama"))
    model = build_model(output_dir, vocab_size=len(tokenizer), seed=seed, **model_kwargs)
    with open(os.path.join(output_dir, "tiny_factory.json"), "w") as f:
        json.dump({"seed": seed, **({"tool_tags": True} if tool_tags else {}), **model_kwargs}, f, indent=2)
    return tokenizer, model


def main(argv=None):
    from ..common.argument_help import doc_summary
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--output_dir", required=True, help="directory to write the model and tokenizer into")
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--num_heads", type=int, default=4)
    parser.add_argument("--intermediate_size", type=int, default=336)
    parser.add_argument("--max_position_embeddings", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--arch", choices=ARCHS, default="llama",
                        help="model family of the tiny model (the tokenizer is the same): llama, qwen3 (q/k norms, "
                        "GQA 2:1, head_dim 2 hidden / heads, tied embeddings), qwen3_moe (that Qwen3 with 4 experts, "
                        "top-2, on every layer but the first), qwen2_moe (those experts with Qwen2's attention and a gated "
                        "shared expert), mixtral (4 experts, top-2, on every layer), ernie45 (interleaved RoPE, GQA 8:1 or one KV head, "
                        "head_dim 2 hidden / heads, tied embeddings) or ernie45_moe (that ERNIE with 4 experts, top-2, "
                        "and one shared expert on every layer but the first)")
    parser.add_argument("--tool_tags", action="store_true",
                        help="add <tool_call>, </tool_call>, <tool_response>, </tool_response> as one token each")
    parser.add_argument(
        "--shape", choices=sorted(REAL_SHAPES), default=None,
        help="build a real-shaped model and BPE tokenizer instead of the tiny one (uses only --num_layers and --seed)",
    )
    parser.add_argument(
        "--small", action="store_true",
        help="with --shape: the same family (GQA ratio, biases, tying, rope theta, tokenizer) at hidden 64, "
        "vocabulary cut to the tokenizer",
    )
    args = parser.parse_args(argv)
    if args.small and args.shape is None:
        parser.error("--small needs --shape")
    if args.shape is not None:
        _, model = build_real_shape(args.output_dir, args.shape, num_layers=args.num_layers, seed=args.seed,
                                    small=args.small)
        n_params = sum(int(p.numel()) for p in model.parameters())
        print(json.dumps({"output_dir": args.output_dir, "shape": args.shape, "parameters": n_params}))
        return
    _, model = build_tiny(
        args.output_dir,
        seed=args.seed,
        tool_tags=args.tool_tags,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings,
        arch=args.arch,
    )
    n_params = sum(int(p.numel()) for p in model.parameters())
    print(json.dumps({"output_dir": args.output_dir, "parameters": n_params}))


if __name__ == "__main__":
    main()
