"""Read the decoder weights the rollout engine needs straight from a PaddleNLP causal LM.

Supported: `LlamaForCausalLM`, `Qwen2ForCausalLM`, our `Qwen3ForCausalLM` (its q/k norm
weights read when its family says so, `ppo.models.families`), `Qwen3MoeForCausalLM` (a sparse
layer's router and experts as `ppo.rollout.moe_mlp.MoeWeights`), our `Ernie4_5ForCausalLM` (its
interleaved RoPE turned into the engine's half-split one by reordering q/k columns,
`HalfRotationOrder`) and any model with the same layout:
`<decoder>.embed_tokens/.layers/.norm`, `lm_head`, layers with `self_attn.{q,k,v,o}_proj` or
`qkv_proj`, `mlp.{gate,up,down}_proj` or `gate_up_fused_proj`, `input_layernorm`,
`post_attention_layernorm`), optionally wrapped in `paddle.DataParallel` and/or
`paddlenlp.peft.LoRAModel`. A tensor-parallel model either has its slices gathered into whole
weights on every call (`TensorParallelGather`, eval_mode "single": each rank then generates with
the whole model) or keeps them (`sharded=True`, eval_mode "tensor_parallel": `ModelWeights.shard`
tells the engine where to all-reduce and gather).

`extract_weights(model)` is called at the start of every `generate()`. Two layouts:
  - "rows" (GPU, and the pure-Paddle fallback): matrices as the model stores them, [in, out],
    the live parameters themselves except q/k/v, concatenated into one [H, (nh + 2 nkv) hd]
    matrix (one matmul per step instead of three), and gate/up into [H, 2 I] when
    `fuse_gate_up`;
  - "cols" (CPU with the custom ops): every matrix packed TRANSPOSED, [out, in], by the
    rollout_pack_transposed op (q/k/v and gate/up fused in the same pass): the decode step then
    runs y^T = W^T x^T, a tall weight times B columns, which MKL runs ~1.5x faster than x W
    with B rows at B = 16 (measured in bench/); the prefill uses x W^T (transpose_y).
A LoRA layer that is active and not merged contributes W + lora_A @ lora_B * scaling; on CPU a
non-float32 weight is cast to float32. Every derived tensor (fused, transposed, LoRA-merged,
cast) is recomputed from the parameters on every call -- the "cols" buffers are kept between
calls but overwritten each time -- so the engine always uses the model's current weights (the
actor trains between rollouts) and never a stale copy.
"""
from dataclasses import dataclass, field
from typing import List, Optional

import paddle

from .moe_mlp import is_moe_mlp, moe_weights
from .rope_order import HalfRotationOrder
from .tp_weights import TensorParallelGather, TensorParallelShard, sharded_heads, split_kind, weight_source

__all__ = ["LayerWeights", "ModelWeights", "TensorParallelGather", "TensorParallelShard", "extract_weights", "split_kind"]


@dataclass
class LayerWeights:
    """Matrices are [in, out] (x @ W) when ModelWeights.transposed is False, else [out, in]."""

    ln_attn: paddle.Tensor
    qkv: paddle.Tensor  # q/k/v fused: (nh + 2 nkv) hd outputs
    qkv_bias: Optional[paddle.Tensor]
    qkv_layout: int  # 0: [q | k | v]; 1: PaddleNLP fuse_attention_qkv interleave
    o: paddle.Tensor
    ln_mlp: paddle.Tensor
    gate_up: Optional[paddle.Tensor]  # 2 I outputs ([gate | up]) when fused
    gate: Optional[paddle.Tensor]
    up: Optional[paddle.Tensor]
    down: Optional[paddle.Tensor]  # None on a mixture-of-experts layer
    q_norm: Optional[paddle.Tensor] = None  # [hd]: RMSNorm of each q head before RoPE (a family with q/k norm)
    k_norm: Optional[paddle.Tensor] = None  # [hd]
    moe: Optional[object] = None  # `ppo.rollout.moe_mlp.MoeWeights` of a routed mixture-of-experts MLP


@dataclass
class ModelWeights:
    embed: paddle.Tensor  # [V, H]
    layers: List[LayerWeights]
    norm: paddle.Tensor
    lm_head: paddle.Tensor
    lm_head_transposed: bool  # True: lm_head is [V, H] (tied embeddings, or the "cols" layout)
    eps: float
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rotary: object = field(repr=False, default=None)  # the model's rotary module (cos/sin tables)
    dtype: str = "float32"
    transposed: bool = False  # layer matrices stored [out, in] ("cols" layout)
    shard: Optional["TensorParallelShard"] = None  # set when the weights are this rank's slices


def unwrap_model(model):
    """Strip paddle.DataParallel (`._layers`) and paddlenlp.peft.LoRAModel (`.model`) wrappers."""
    for _ in range(8):
        name = type(model).__name__
        if isinstance(model, paddle.DataParallel) or (name == "DataParallel" and hasattr(model, "_layers")):
            model = model._layers
        elif name == "LoRAModel" and hasattr(model, "model"):
            model = model.model
        else:
            return model
    return model


def _decoder(causal_lm):
    from ..models.families import FAMILIES

    for attr in [f.prefix for f in FAMILIES.values()] + ["model"]:
        dec = getattr(causal_lm, attr, None)
        if dec is not None and hasattr(dec, "layers") and hasattr(dec, "embed_tokens"):
            return dec
    raise TypeError(
        f"RolloutEngine: unsupported model {type(causal_lm).__name__}: expected a PaddleNLP Llama/Qwen2 causal LM "
        "(a decoder at .llama/.qwen2/.model with embed_tokens, layers and norm)"
    )


def effective_weight(linear):
    """The weight the layer multiplies by now: W, or W + lora_A @ lora_B * scaling for an active,
    unmerged LoRA layer (computed here, once per call)."""
    w = linear.weight
    if hasattr(linear, "lora_A") and hasattr(linear, "lora_B"):
        if not getattr(linear, "merged", False) and not getattr(linear, "disable_lora", False):
            if hasattr(linear, "get_delta_weight"):
                delta = linear.get_delta_weight()
            else:
                delta = linear.lora_A @ linear.lora_B * linear.scaling
            w = w + delta.astype(w.dtype)
    return w


def _bias(linear):
    return getattr(linear, "bias", None)


_USE_PADDLENLP = "generate with PaddleNLP's generate: RolloutEngine(use_rollout_engine=False), argument use_fusemt false"


def _check_config(cfg):
    if getattr(cfg, "alibi", False):
        raise NotImplementedError("RolloutEngine: alibi models are not supported; " + _USE_PADDLENLP)
    if getattr(cfg, "use_long_sequence_strategies", False):
        raise NotImplementedError("RolloutEngine: long-sequence strategies are not supported; " + _USE_PADDLENLP)
    if getattr(cfg, "use_sliding_window", False):
        raise NotImplementedError("RolloutEngine: sliding-window attention is not supported; " + _USE_PADDLENLP)


class _Packer:
    """Casts to `compute_dtype` and packs projection weights into fused matrices: `[in, sum out]`
    ("rows") or, with `cols`, `[sum out, in]` written by `pack_transposed` into buffers kept in
    `workspace` (dict or None) under their call order."""

    def __init__(self, compute_dtype, cols, pack_transposed, workspace):
        self.compute_dtype, self.cols, self.pack_transposed, self.workspace = compute_dtype, cols, pack_transposed, workspace
        self.calls = 0

    def cast(self, t):
        if t is None:
            return None
        if str(t.dtype).replace("paddle.", "") != self.compute_dtype:
            return t.astype(self.compute_dtype)
        return t

    def buffer(self, shape, dtype):
        key = self.calls
        self.calls += 1
        if self.workspace is None:
            return paddle.empty(shape, dtype=dtype)
        buf = self.workspace.get(key)
        if buf is None or list(buf.shape) != list(shape) or buf.dtype != dtype:
            buf = paddle.empty(shape, dtype=dtype)
            self.workspace[key] = buf
        return buf

    def pack(self, ws):
        ws = [self.cast(w) for w in ws]
        if self.cols:
            dst = self.buffer([sum(int(w.shape[1]) for w in ws), int(ws[0].shape[0])], ws[0].dtype)
            return self.pack_transposed(dst, ws)
        return ws[0] if len(ws) == 1 else paddle.concat(ws, axis=1)


def _qk_norms(attn, family, qkv_bias, packer, order=None):
    """`(q_norm, k_norm)` weights of a family whose attention normalises q and k heads, else Nones."""
    if family is None or not family.qk_norm:
        return None, None
    if qkv_bias is not None:
        raise NotImplementedError("RolloutEngine: q/k norms after a q/k/v bias are not supported")
    q_norm, k_norm = attn.q_norm.weight, attn.k_norm.weight
    if order is not None:
        q_norm, k_norm = paddle.index_select(q_norm, order.head), paddle.index_select(k_norm, order.head)
    return packer.cast(q_norm), packer.cast(k_norm)


def _unfused_qkv(attn, tp, order):
    """`([q, k, v] weights [in, out], [q, k, v] biases or Nones)` of separate projections, q and
    k columns reordered by `order` (a `HalfRotationOrder` or None)."""
    mats = [tp.weight(lin, effective_weight(lin)) for lin in (attn.q_proj, attn.k_proj, attn.v_proj)]
    biases = [tp.bias(attn.q_proj), tp.bias(attn.k_proj), tp.bias(attn.v_proj)]
    if order is not None:
        for i, columns in ((0, order.q), (1, order.k)):
            mats[i] = paddle.index_select(mats[i], columns, axis=1)
            if biases[i] is not None:
                biases[i] = paddle.index_select(biases[i], columns)
    return mats, biases


def _layer_weights(layer, tp, packer, fuse_gate_up, family=None, order=None):
    """One decoder layer's `LayerWeights` (fused q/k/v, gate/up fused unless kept apart; the
    q/k norms when `family` has them; q/k columns in `order` when given)."""
    attn, mlp, pack = layer.self_attn, layer.mlp, packer.pack
    if hasattr(attn, "qkv_proj"):
        if order is not None:
            raise NotImplementedError("RolloutEngine: a fused qkv_proj with interleaved RoPE is not supported; "
                                      + _USE_PADDLENLP)
        qkv = pack([tp.weight(attn.qkv_proj, effective_weight(attn.qkv_proj))])  # slices: whole kv-head groups
        qkv_bias = packer.cast(tp.bias(attn.qkv_proj))
        layout_id = 1
    else:
        mats, bs = _unfused_qkv(attn, tp, order)
        qkv = pack(mats)
        qkv_bias = packer.cast(paddle.concat(bs)) if bs[0] is not None else None
        layout_id = 0
    moe, down = None, None
    if is_moe_mlp(mlp):
        if tp.sharded:
            raise NotImplementedError("RolloutEngine: a mixture-of-experts layer with keep_tensor_parallel")
        moe = moe_weights(mlp, packer.cast, lambda lin: tp.weight(lin, effective_weight(lin)))
        gate_up, gate, up = None, None, None
    elif hasattr(mlp, "gate_up_fused_proj"):
        gate_up, gate, up = pack([tp.weight(mlp.gate_up_fused_proj, effective_weight(mlp.gate_up_fused_proj), fused_parts=2)]), None, None
    elif fuse_gate_up or packer.cols:
        gate_up, gate, up = pack([tp.weight(lin, effective_weight(lin)) for lin in (mlp.gate_proj, mlp.up_proj)]), None, None
    else:
        gate_up, gate, up = (None, pack([tp.weight(mlp.gate_proj, effective_weight(mlp.gate_proj))]),
                             pack([tp.weight(mlp.up_proj, effective_weight(mlp.up_proj))]))
    if moe is None:
        down = pack([tp.weight(mlp.down_proj, effective_weight(mlp.down_proj))])
    if (moe is None and _bias(mlp.down_proj) is not None) or _bias(attn.o_proj) is not None:
        raise NotImplementedError("RolloutEngine: o_proj / MLP biases are not supported; " + _USE_PADDLENLP)
    q_norm, k_norm = _qk_norms(attn, family, qkv_bias, packer, order)
    return LayerWeights(
        ln_attn=packer.cast(layer.input_layernorm.weight), qkv=qkv, qkv_bias=qkv_bias, qkv_layout=layout_id,
        o=pack([tp.weight(attn.o_proj, effective_weight(attn.o_proj))]),
        ln_mlp=packer.cast(layer.post_attention_layernorm.weight), gate_up=gate_up, gate=gate, up=up,
        down=down, q_norm=q_norm, k_norm=k_norm, moe=moe,
    )


def _lm_head_weights(lm, tp, packer, shard):
    """`(LM head weight, whether it is [V, H], vocabulary size)` (the whole vocabulary's size
    when each rank keeps a slice of a sharded head)."""
    head = lm.lm_head
    transposed = bool(getattr(head, "transpose_y", False))
    if _bias(head) is not None:
        raise NotImplementedError("RolloutEngine: lm_head bias is not supported")
    lm_w = packer.cast(tp.weight(head, effective_weight(head), transpose_y=transposed))
    vocab = int(lm_w.shape[0] if transposed else lm_w.shape[1])
    if shard is not None and shard.head_sharded:
        vocab *= shard.degree
    if packer.cols and not transposed:
        lm_w, transposed = packer.pack([lm_w]), True
    return lm_w, transposed, vocab


def compute_dtype_of(weight):
    """The dtype the engine computes in for a model whose embedding is `weight`: float32 on CPU
    (the CPU kernels' dtype), the model's own dtype on other devices."""
    return "float32" if weight.place.is_cpu_place() else str(weight.dtype).replace("paddle.", "")


def extract_weights(model, fuse_gate_up=False, compute_dtype=None, layout="rows", pack_transposed=None,
                    workspace=None, sharded=False, group=None):
    """Collect the weights for one generate() call (see module docstring). layout "cols" needs
    `pack_transposed` (ops.pack_transposed(dst, [K, N_i] tensors) writes [sum N_i, K] into dst).
    `workspace` (a dict kept by the engine, optional) holds the packed buffers between calls so
    they are rewritten in place instead of reallocated (page faults cost as much as the copy);
    their CONTENTS are always recomputed from the current parameters. `sharded` keeps a
    tensor-parallel model's slices (see `TensorParallelShard`; "rows" layout only); `group`: a
    tensor-parallel model's model-parallel group."""
    if layout not in ("rows", "cols"):
        raise ValueError(f"layout must be 'rows' or 'cols', got {layout!r}")
    cols = layout == "cols"
    lm = unwrap_model(model)
    cfg = lm.config
    _check_config(cfg)
    dec = _decoder(lm)
    tp = weight_source(lm, group=group, sharded=sharded)
    nh = cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", None) or nh
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    shard, nh, nkv = sharded_heads(lm, dec, tp, nh, nkv, cols)
    from ..models.families import FAMILIES

    family = FAMILIES.get(getattr(cfg, "model_type", None))
    embed = tp.weight(dec.embed_tokens)
    if compute_dtype is None:
        compute_dtype = compute_dtype_of(embed)
    packer = _Packer(compute_dtype, cols, pack_transposed, workspace)
    order = HalfRotationOrder.of(family, nh, nkv, hd)
    layers = [_layer_weights(layer, tp, packer, fuse_gate_up, family, order) for layer in dec.layers]
    lm_w, transposed, vocab = _lm_head_weights(lm, tp, packer, shard)
    return ModelWeights(
        embed=packer.cast(embed), layers=layers, norm=packer.cast(dec.norm.weight), lm_head=lm_w,
        lm_head_transposed=transposed, eps=float(cfg.rms_norm_eps), num_heads=nh, num_kv_heads=nkv, head_dim=hd,
        vocab_size=vocab, rotary=getattr(dec.layers[0].self_attn, "rotary_emb", None), dtype=compute_dtype,
        transposed=cols, shard=shard,
    )


def rotary_tables(weights, length, dtype):
    """cos/sin [length, hd] rows from the model's own rotary module (so every RoPE variant and
    rope_theta the model supports is honoured), float32 unless `dtype` says otherwise."""
    rot = weights.rotary
    if rot is None:
        raise NotImplementedError("RolloutEngine: the model has no rotary_emb module")
    hd = weights.head_dim
    dummy = paddle.zeros([1, 1, 1, hd], dtype="float32")
    cos, sin = rot(dummy, seq_len=length)
    cos = cos.reshape([-1, hd])
    sin = sin.reshape([-1, hd])
    if cos.shape[0] < length:
        raise ValueError(
            f"RolloutEngine: prompt + new tokens needs {length} positions but the model's rotary table has "
            f"{cos.shape[0]} (max_position_embeddings)"
        )
    return cos[:length].astype(dtype), sin[:length].astype(dtype)
