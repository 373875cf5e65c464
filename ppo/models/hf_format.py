"""Hugging Face <-> PaddleNLP names, layouts and configs of every family (pure numpy, no I/O).

Tensors are numpy arrays; a `uint16` array holds bfloat16 bits (Paddle's own convention:
`paddle.Tensor.numpy()` of a bfloat16 tensor is `uint16`). Every conversion is exact: names
change, matrices are transposed or split, values are never cast.

| PaddleNLP (`llama.` / `qwen2.` prefix)        | Hugging Face (`model.` prefix)                      |
|-----------------------------------------------|-----------------------------------------------------|
| `embed_tokens.weight` [V, H]                   | `embed_tokens.weight` [V, H]                         |
| `layers.i.self_attn.{q,k,v,o}_proj.weight` [in, out] | the same names, [out, in] (transposed)          |
| `layers.i.self_attn.qkv_proj.weight` (`fuse_attention_qkv`: per KV head [its query heads, k, v]) | `q_proj`, `k_proj`, `v_proj` |
| `layers.i.self_attn.{q,k,v}_proj.bias` (Qwen2) | the same names                                       |
| `layers.i.mlp.{gate,up,down}_proj.weight`      | the same names, transposed                           |
| `layers.i.mlp.gate_up_fused_proj.weight` (`fuse_attention_ffn`: [gate | up]) | `gate_proj`, `up_proj`    |
| `layers.i.{input,post_attention}_layernorm.weight`, `norm.weight` | the same names               |
| `layers.i.self_attn.{q,k}_norm.weight` [head_dim] (Qwen3) | the same names                          |
| `layers.i.mlp.gate.weight` [H, E], `mlp.experts.e.*_proj.weight` (MoE) | the same names, transposed  |
| `layers.i.mlp.shared_expert_gate.weight` [H, 1] (Qwen2-MoE) | the same name, [1, H]               |
| `lm_head.weight` [H, V] (untied)               | `lm_head.weight` [V, H]; omitted when tied           |
| `score_head.weight` [H, 1], `score_head.bias` [1] | `score.weight` [1, H], `score.bias` [1]           |
| `normalizer_{mean,var,count}` buffers          | `config.json` fields of the same names               |
| `layers.i.self_attn.rotary_emb.inv_freq`       | not stored (recomputed from `rope_theta`)            |

Both libraries apply rotary embeddings with `rotate_half` on the same q/k column order, so
q_proj and k_proj need no permutation (tests/test_hf_weights.py compares logits); ERNIE 4.5's
interleaved rotation is computed by its own classes, so its columns keep their order too.

The families with our own Paddle classes (`ppo.models.families`, e.g. Qwen3) map their
``config.json`` in their module (``paddle_config`` / ``hf_fields``); tensor names are shared.
"""
import numpy as np

from . import hf_rope
from .families import FAMILIES, family_module

PREFIX = {name: f.prefix for name, f in FAMILIES.items()}
CAUSAL_LM_ARCH = {name: f.causal_lm_arch for name, f in FAMILIES.items()}
SCORE_ARCH = {name: f.score_arch for name, f in FAMILIES.items()}
SCORE_FIELDS = ("score_type", "score_bias", "do_normalize", "normalizer_type", "normalizer_momentum")
NORMALIZER_STATS = ("normalizer_mean", "normalizer_var", "normalizer_count")
DTYPES = ("float32", "float16", "bfloat16")
COMMON_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id",
)
QWEN2_FIELDS = ("sliding_window", "max_window_layers")
MOE_KEYS = ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size")
DENSE_TO_MOE = {"llama": "mixtral", "qwen2": "qwen2_moe"}
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "gate",  # gate: an MoE router
          "shared_expert_gate")


def head_dim(cfg):
    """Per-head width: the config's own ``head_dim`` (Qwen3) or hidden_size / num_attention_heads."""
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def hf_config(cfg, dtype, score=None, layout="both"):
    """The Hugging Face `config.json` dict of our config dict `cfg` (a model type of
    `ppo.models.families`). `score`: None for a causal LM, else the score model's settings (`SCORE_FIELDS`) and
    normaliser statistics (`NORMALIZER_STATS`), written as a `*ForSequenceClassification` with
    one label. `layout`: the rotary fields' layout (`hf_rope.LAYOUTS`)."""
    model_type = cfg.get("model_type")
    if model_type not in PREFIX:
        raise ValueError(f"model_type {model_type!r}: Hugging Face export supports {sorted(PREFIX)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")
    out = {"architectures": [SCORE_ARCH[model_type] if score is not None else CAUSAL_LM_ARCH[model_type]],
           "model_type": model_type}
    module = family_module(model_type)
    fields = module.hf_fields(cfg) if module is not None else _paddlenlp_hf_fields(cfg, model_type)
    out.update(hf_rope.with_layout(fields, layout))
    out.update(use_cache=True, torch_dtype=dtype, dtype=dtype)
    if score is not None:
        out.update(num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
        out.update({key: score[key] for key in SCORE_FIELDS + NORMALIZER_STATS if key in score})
    return out


def _paddlenlp_hf_fields(cfg, model_type):
    """HF config fields of a PaddleNLP Llama / Qwen2 config dict."""
    out = {key: cfg[key] for key in COMMON_FIELDS if key in cfg}
    rope = hf_rope.rope_of_paddle(cfg)
    if rope.rope_type not in hf_rope.PADDLE_ROPE[model_type]:
        raise ValueError(f"rope_type {rope.rope_type!r} ({model_type}): PaddleNLP's model does not compute it")
    out.update(hidden_act="silu", head_dim=head_dim(cfg), attention_dropout=0.0, **hf_rope.hf_fields(rope))
    if model_type == "llama":
        out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        out.update({key: cfg[key] for key in QWEN2_FIELDS if key in cfg}, use_sliding_window=False)
    return out


def _refusals(hf, model_type):
    """Features of an HF config that PaddleNLP's model of `model_type` does not compute."""
    problems = []
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {hf['hidden_act']!r} (only silu)")
    hd = hf.get("head_dim")
    if hd is not None and hd != hf["hidden_size"] // hf["num_attention_heads"]:
        problems.append(f"head_dim {hd} != hidden_size / num_attention_heads")
    if model_type == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
        problems.append("attention_bias / mlp_bias (PaddleNLP's Llama has no biases)")
    if hf.get("num_labels", 1) != 1 and is_score_arch(hf):
        problems.append(f"num_labels {hf['num_labels']} (a score model has one)")
    moe_keys = [key for key in MOE_KEYS if key in hf]
    if moe_keys:
        problems.append(f"{', '.join(moe_keys)} on a dense model (model_type {model_type}; the MoE family is "
                        f"{DENSE_TO_MOE[model_type]})")
    return problems


def is_score_arch(hf):
    return any(str(a).endswith("ForSequenceClassification") for a in hf.get("architectures") or [])


def paddle_config(hf):
    """`(model_type, PaddleNLP config kwargs, score settings or None)` of a Hugging Face config dict."""
    model_type = hf.get("model_type")
    if model_type not in PREFIX:
        raise ValueError(f"model_type {model_type!r}: Hugging Face import supports {sorted(PREFIX)}")
    if "num_labels" not in hf and "id2label" in hf:
        hf = dict(hf, num_labels=len(hf["id2label"]))
    module = family_module(model_type)
    if module is not None:
        if hf.get("num_labels", 1) != 1 and is_score_arch(hf):
            raise ValueError(f"{SCORE_ARCH[model_type]} config: num_labels {hf['num_labels']} (a score model has one)")
        cfg = module.paddle_config(hf)
    else:
        cfg = _paddlenlp_config(hf, model_type)
    cfg["dtype"] = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    if cfg["dtype"] not in DTYPES:
        raise ValueError(f"torch_dtype {cfg['dtype']!r}: expected one of {DTYPES}")
    score = None
    if is_score_arch(hf):
        score = {key: hf[key] for key in SCORE_FIELDS + NORMALIZER_STATS if key in hf}
    return model_type, cfg, score


def _paddlenlp_config(hf, model_type):
    """PaddleNLP Llama / Qwen2 config kwargs of an HF config (refusing what they do not compute)."""
    rope_fields, rope_problems = hf_rope.normalise(hf, model_type)
    problems = _refusals(hf, model_type) + rope_problems
    if problems:
        raise ValueError(f"{CAUSAL_LM_ARCH[model_type]} config: not supported here: " + "; ".join(problems))
    cfg = {key: hf[key] for key in COMMON_FIELDS if key in hf}
    cfg.setdefault("num_key_value_heads", hf["num_attention_heads"])
    cfg.setdefault("tie_word_embeddings", False)
    if model_type == "qwen2":
        cfg.update({key: hf[key] for key in QWEN2_FIELDS if hf.get(key) is not None}, use_sliding_window=False)
    cfg.update(rope_fields)
    return cfg


def _split_fused_qkv(w, cfg):
    """q, k, v of PaddleNLP's fused `qkv_proj` (weight [H, W] or bias [W]): W is laid out per KV
    head as [its num_heads / num_kv_heads query heads, one key head, one value head]."""
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    group = nh // nkv
    grouped = w.reshape(w.shape[:-1] + (nkv, group + 2, hd))
    lead = w.shape[:-1]
    q = grouped[..., :group, :].reshape(lead + (nh * hd,))
    return q, grouped[..., group, :].reshape(lead + (nkv * hd,)), grouped[..., group + 1, :].reshape(lead + (nkv * hd,))


def _layer_to_hf(rest, value, cfg):
    """HF `(name, tensor)` pairs of one PaddleNLP decoder tensor (`rest` is its name after `layers.i.`)."""
    module, _, kind = rest.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    if leaf == "qkv_proj":
        parts = zip(("q_proj", "k_proj", "v_proj"), _split_fused_qkv(value, cfg))
        return [(f"{parent}.{n}.{kind}", p.T if kind == "weight" else p) for n, p in parts]
    if leaf == "gate_up_fused_proj":
        half = value.shape[1] // 2
        return [(f"{parent}.gate_proj.weight", value[:, :half].T), (f"{parent}.up_proj.weight", value[:, half:].T)]
    if leaf in LINEAR and kind == "weight":
        return [(rest, value.T)]
    return [(rest, value)]


def hf_tensors(state, cfg, lm_head_transposed=None):
    """HF tensors of a PaddleNLP state dict (causal LM or score model). `lm_head_transposed`:
    whether `lm_head.weight` is stored [V, H] (PaddleNLP does so when embeddings are tied);
    None decides from the shape. Raises on any tensor it has no rule for."""
    prefix = PREFIX[cfg["model_type"]] + "."
    out, unknown = {}, []
    for name, value in state.items():
        if "rotary_emb.inv_freq" in name or name in NORMALIZER_STATS:
            continue
        if name.startswith(prefix + "layers."):
            index, _, rest = name[len(prefix + "layers."):].partition(".")
            for hf_rest, tensor in _layer_to_hf(rest, value, cfg):
                out[f"model.layers.{index}.{hf_rest}"] = tensor
        elif name.startswith(prefix):
            out["model." + name[len(prefix):]] = value
        elif name == "lm_head.weight":
            if not cfg.get("tie_word_embeddings"):
                keep = lm_head_transposed
                if keep is None:
                    keep = value.shape == (cfg["vocab_size"], cfg["hidden_size"]) != value.shape[::-1]
                out[name] = value if keep else value.T
        elif name == "score_head.weight":
            out["score.weight"] = value.T
        elif name == "score_head.bias":
            out["score.bias"] = value
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"no Hugging Face name for these PaddleNLP tensors: {unknown}")
    module = family_module(cfg["model_type"])
    if hasattr(module, "hub_names"):  # a family whose hub names differ from ours (Mixtral's w1/w2/w3)
        out = module.hub_names(out)
    return {name: np.ascontiguousarray(tensor) for name, tensor in out.items()}


def paddle_tensors(tensors, cfg, score=False):
    """PaddleNLP tensors (unfused layout, untied LM head [H, V]) of HF tensors. A tied model's
    `lm_head.weight` is left out (PaddleNLP shares the embedding). Raises on unknown names."""
    prefix = PREFIX[cfg["model_type"]] + "."
    module = family_module(cfg["model_type"])
    tensors = {n: v for n, v in tensors.items() if not is_ignored(n, cfg["model_type"])}
    if hasattr(module, "split_fused_experts"):
        tensors = module.split_fused_experts(tensors)
    out, unknown = {}, []
    for name, value in tensors.items():
        if "rotary_emb.inv_freq" in name:
            continue
        if name.startswith("model."):
            rest = name[len("model."):]
            leaf_kind = rest.rsplit(".", 2)[-2:]
            linear = rest.startswith("layers.") and leaf_kind[0] in LINEAR and leaf_kind[1] == "weight"
            out[prefix + rest] = value.T if linear else value
        elif name == "lm_head.weight" and not score:
            if not cfg.get("tie_word_embeddings"):
                out[name] = value.T
        elif name == "score.weight" and score:
            out["score_head.weight"] = value.T
        elif name == "score.bias" and score:
            out["score_head.bias"] = value
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"no PaddleNLP name for these Hugging Face tensors: {unknown}")
    return {name: np.ascontiguousarray(tensor) for name, tensor in out.items()}


def is_ignored(name, model_type):
    """Whether HF tensor `name` is one transformers skips on load for `model_type` (a family's
    ``IGNORED_HF_TENSORS`` substrings: ERNIE 4.5 MoE's multi-token-prediction ``mtp`` layers)."""
    return any(part in name for part in getattr(family_module(model_type), "IGNORED_HF_TENSORS", ()))


def expected_hf_shapes(hf):
    """name -> shape of every tensor transformers' `LlamaForCausalLM` / `Qwen2ForCausalLM` (or
    their `*ForSequenceClassification`) loads for the HF config `hf`, as their modeling code
    declares them (`nn.Linear(in, out)` stores [out, in]; Qwen2's q/k/v have biases; a tied
    `lm_head` is not stored; a score model has `score` [num_labels, H] and no `lm_head`)."""
    H, I, V = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    nh = hf["num_attention_heads"]
    nkv = hf.get("num_key_value_heads") or nh
    module = family_module(hf["model_type"])
    hd = hf.get("head_dim") or (module.DEFAULT_HEAD_DIM if module is not None else None) or H // nh
    qwen2 = hf["model_type"] == "qwen2"
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (nh * hd, H), p + "self_attn.k_proj.weight": (nkv * hd, H),
                       p + "self_attn.v_proj.weight": (nkv * hd, H), p + "self_attn.o_proj.weight": (H, nh * hd),
                       p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                       p + "mlp.down_proj.weight": (H, I), p + "input_layernorm.weight": (H,),
                       p + "post_attention_layernorm.weight": (H,)})
        if module is not None:
            shapes.update(module.extra_hf_shapes(hf, p))
        if qwen2 or hf.get("attention_bias"):
            shapes.update({p + "self_attn.q_proj.bias": (nh * hd,), p + "self_attn.k_proj.bias": (nkv * hd,),
                           p + "self_attn.v_proj.bias": (nkv * hd,)})
        if not qwen2 and hf.get("attention_bias"):
            shapes[p + "self_attn.o_proj.bias"] = (H,)
    if is_score_arch(hf):
        shapes["score.weight"] = (hf.get("num_labels", 1), H)
    elif not hf.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, H)
    return {name: shape for name, shape in shapes.items() if shape is not None}  # None: a family removed it
