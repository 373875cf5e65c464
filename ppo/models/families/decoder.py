"""Paddle layers of a pre-norm RoPE decoder shared by the families this package writes itself.

One decoder layer is ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` with RMSNorm, rotary
embeddings on q and k (`rotate_half` over the head's two halves, as PaddleNLP's Llama and
transformers), grouped-query attention and a SwiGLU MLP. What a family changes is data on its
config: ``head_dim`` (independent of ``hidden_size / num_attention_heads``), ``qk_norm``
(RMSNorm over each head's ``head_dim`` on q and k before RoPE, Qwen3's ``q_norm`` / ``k_norm``),
``rope_interleaved`` (RoPE on the pairs ``(2i, 2i + 1)``, ERNIE 4.5's), ``use_bias`` (a bias
on every projection, ERNIE 4.5's) and ``qkv_bias`` (on q/k/v only, Qwen2-MoE's); the last three
default to off when the config lacks them.

Weights are named as PaddleNLP names Llama's (``<prefix>.layers.i.self_attn.q_proj.weight``
``[in, out]``, ...), so `ppo.models.hf_format` renames them as it renames Llama's. Inputs
and outputs follow PaddleNLP's causal LMs: ``forward(input_ids [B, T], position_ids [B, T],
attention_mask [B, T] or additive/boolean [B, 1, T, T], past_key_values, use_cache, ...)``.

With the train patch on (`ppo.models.train_patch`, ``use_train_patch``) RMSNorm, RoPE, SwiGLU
and attention run the fused ops of `ppo.models.fused_train_ops`; off, their pure-Paddle twins
(the same formulas).
"""
import logging
import math

import paddle
import paddle.nn as nn
from paddle.distributed.fleet.utils import recompute
from paddlenlp.transformers.model_outputs import BaseModelOutputWithPast, MoEModelOutputWithPast
from paddlenlp.transformers.qwen2.modeling import Qwen2Model, Qwen2RotaryEmbedding

from ...common.parallel_groups import model_parallel_group
from .. import fused_train_ops as ops
from . import tensor_parallel as tp

logger = logging.getLogger(__name__)


UNIMPLEMENTED_SWITCHES = ("use_flash_attention", "use_fused_rms_norm", "use_fused_rope")
_warned = set()


def warn_unimplemented_switches(config, name):
    """Log once per switch that PaddleNLP's GPU switches (flash attention, fused RMSNorm / RoPE)
    do nothing in these classes: they run the plain ops (or the train patch's fused CPU ops)."""
    for switch in UNIMPLEMENTED_SWITCHES:
        if getattr(config, switch, False) and (name, switch) not in _warned:
            _warned.add((name, switch))
            logger.warning(f"{name}: {switch} is not implemented by this family's Paddle classes; it does nothing "
                           "here (attention and norms run Paddle's plain ops)")


def _patched():
    from .. import train_patch

    return train_patch.is_applied()


def rms_norm(x, weight, eps):
    """RMSNorm of ``x [..., D]`` with ``weight [D]`` (variance in float32)."""
    return ops.fused_rms_norm(x, weight, eps) if _patched() else ops.rms_norm_reference(x, weight, eps)


class RMSNorm(nn.Layer):
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last axis of size ``dim``."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = self.create_parameter([dim], dtype=paddle.get_default_dtype(),
                                            default_initializer=nn.initializer.Constant(1.0))
        self.variance_epsilon = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.variance_epsilon)


class HeadRMSNorm(RMSNorm):
    """`RMSNorm` over each head's ``head_dim`` (q/k norm), its weight shared by every head. Under
    tensor parallelism a rank holds only its heads, so its weight gradient is a partial sum over
    them: the weight enters through Megatron-LM's ``f`` (identity forward, gradient all-reduced
    over the model-parallel group), which makes the gradient whole and equal on every rank."""

    def __init__(self, dim, eps, split_heads=False):
        super().__init__(dim, eps)
        self.split_heads = split_heads  # this rank holds a part of the heads (tensor parallelism)

    def forward(self, x):
        weight = self.weight
        group = model_parallel_group() if self.split_heads else None
        if group is not None and not weight.stop_gradient:
            weight = tp.gradient_all_reduced(weight, group)
        return rms_norm(x, weight, self.variance_epsilon)


_HALF_ORDER = {}


def half_order(head_dim):
    """Index ``[D]`` that reorders a head ``(x0, x1, x2, x3, ...)`` to ``(x0, x2, ..., x1, x3, ...)``:
    the interleaved pairs ``(2i, 2i + 1)`` become the half-split pairs ``(i, i + D / 2)``."""
    if head_dim not in _HALF_ORDER:
        _HALF_ORDER[head_dim] = paddle.to_tensor(list(range(0, head_dim, 2)) + list(range(1, head_dim, 2)), dtype="int64")
    return _HALF_ORDER[head_dim]


def rope(q, k, cos, sin, position_ids, interleaved=False):
    """q ``[B, S, Hq, D]``, k ``[B, S, Hk, D]`` rotated at ``position_ids [B, S]`` with the
    rotary tables ``cos``/``sin`` ``[1, P, 1, D]`` (frequencies ``[f, f]``, `rotate_half`).
    ``interleaved`` (transformers' ERNIE 4.5 / GLM ``apply_rotary_pos_emb``) rotates the pairs
    ``(2i, 2i + 1)`` by frequency i: q and k are returned reordered by `half_order`, rotated in
    the half-split layout; attention only takes ``q . k`` per head, which one common reordering
    of both leaves unchanged (the cache holds k in that order too)."""
    if interleaved:
        order = half_order(q.shape[-1])
        q, k = paddle.index_select(q, order, axis=-1), paddle.index_select(k, order, axis=-1)
    rows = position_ids.reshape([-1])
    cos = paddle.index_select(cos.squeeze(axis=[0, 2]), rows).reshape([*position_ids.shape, -1])
    sin = paddle.index_select(sin.squeeze(axis=[0, 2]), rows).reshape([*position_ids.shape, -1])
    return ops.fused_rope(q, k, cos, sin) if _patched() else ops.rope_reference(q, k, cos, sin)


def attend(q, k, v, mask, scale):
    """``softmax(scale q k^T + mask) v``: q ``[B, Sq, H, D]``, k/v ``[B, Sk, H, D]``, additive
    mask ``[B, 1, Sq, Sk]``; returns ``[B, Sq, H * D]``."""
    if _patched() and q.shape[1] == k.shape[1]:
        return ops.fused_sdpa(q, k, v, mask, scale)
    return ops.sdpa_reference(q, k, v, mask, scale)


def repeat_kv(x, n_rep):
    """``[B, S, nkv, D]`` -> ``[B, S, nkv * n_rep, D]``, each KV head repeated for its query group."""
    if n_rep == 1:
        return x
    B, S, nkv, D = x.shape
    return x.unsqueeze(-2).tile([1, 1, 1, n_rep, 1]).reshape([B, S, nkv * n_rep, D])


class Attention(nn.Layer):
    """Grouped-query attention with ``config.head_dim`` per head and, with ``config.qk_norm``,
    RMSNorm of each q and k head before RoPE; ``config.use_bias``: biases on q/k/v/o;
    ``config.qkv_bias``: on q/k/v only (Qwen2-MoE's). Under tensor parallelism (`tensor_parallel`)
    this rank's ``num_heads`` / ``num_kv_heads`` are the config's divided by the degree."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        n = tp.degree(config)  # tensor parallel: this rank's heads (whole heads, see `tensor_parallel`)
        self.num_heads, self.num_kv_heads = config.num_attention_heads // n, config.num_key_value_heads // n
        self.head_dim = config.head_dim
        H, hd = config.hidden_size, self.head_dim
        qkv_bias, bias = tp.projection_biases(config)
        nh, nkv = config.num_attention_heads, config.num_key_value_heads
        self.q_proj = tp.column_linear(config, H, nh * hd, qkv_bias)
        self.k_proj = tp.column_linear(config, H, nkv * hd, qkv_bias)
        self.v_proj = tp.column_linear(config, H, nkv * hd, qkv_bias)
        self.o_proj = tp.row_linear(config, nh * hd, H, bias)
        self.rope_interleaved = bool(getattr(config, "rope_interleaved", False))
        if config.qk_norm:
            self.q_norm = HeadRMSNorm(hd, config.rms_norm_eps, split_heads=n > 1)
            self.k_norm = HeadRMSNorm(hd, config.rms_norm_eps, split_heads=n > 1)
        self.rotary_emb = Qwen2RotaryEmbedding(hd, max_position_embeddings=config.max_position_embeddings,
                                               base=config.rope_theta)
        self.enable_recompute = False
        self.recompute_granularity = config.recompute_granularity

    def forward(self, x, position_ids, attention_mask, past_key_value=None, use_cache=False):
        """x ``[B, S, H]`` -> ``([B, S, H], (k, v) cache ``[B, S_past + S, nkv, D]`` or None)``."""
        B, S = x.shape[0], x.shape[1]
        hd = self.head_dim
        q = self.q_proj(x).reshape([B, S, self.num_heads, hd])
        k = self.k_proj(x).reshape([B, S, self.num_kv_heads, hd])
        v = self.v_proj(x).reshape([B, S, self.num_kv_heads, hd])
        if self.config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        past = 0 if past_key_value is None else past_key_value[0].shape[1]
        cos, sin = self.rotary_emb(v, seq_len=past + S)
        q, k = rope(q, k, cos, sin, position_ids, self.rope_interleaved)
        if past_key_value is not None:
            k = paddle.concat([past_key_value[0], k], axis=1)
            v = paddle.concat([past_key_value[1], v], axis=1)
        present = (k, v) if use_cache else None
        group = self.num_heads // self.num_kv_heads
        args = (q, repeat_kv(k, group), repeat_kv(v, group), attention_mask, 1.0 / math.sqrt(hd))
        if self.enable_recompute and self.recompute_granularity == "core_attn" and not x.stop_gradient:
            out = recompute(attend, *args, use_reentrant=self.config.recompute_use_reentrant)
        else:
            out = attend(*args)
        return self.o_proj(out), present


class MLP(nn.Layer):
    """``down(silu(gate(x)) * up(x))``, ``intermediate_size`` wide (default the config's), with biases
    when ``config.use_bias``; under tensor parallelism gate/up column- and down row-parallel."""

    def __init__(self, config, intermediate_size=None):
        super().__init__()
        H, inner = config.hidden_size, intermediate_size or config.intermediate_size
        bias = tp.projection_biases(config)[1]
        self.gate_proj = tp.column_linear(config, H, inner, bias)
        self.up_proj = tp.column_linear(config, H, inner, bias)
        self.down_proj = tp.row_linear(config, inner, H, bias)

    def forward(self, x):
        swiglu = ops.fused_swiglu if _patched() else ops.swiglu_reference
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.enable_recompute = False
        self.recompute_granularity = config.recompute_granularity

    def attention_block(self, x, position_ids, attention_mask, past_key_value=None, use_cache=False):
        """``(x + attn(norm(x)), cache)``: the layer's first residual branch."""
        h = self.input_layernorm(x)
        if self.enable_recompute and self.recompute_granularity == "full_attn" and not h.stop_gradient:
            a, present = recompute(self.self_attn, h, position_ids, attention_mask, past_key_value, use_cache,
                                   use_reentrant=self.config.recompute_use_reentrant)
        else:
            a, present = self.self_attn(h, position_ids, attention_mask, past_key_value, use_cache)
        return x + a, present

    def forward(self, x, position_ids, attention_mask, past_key_value=None, use_cache=False):
        x, present = self.attention_block(x, position_ids, attention_mask, past_key_value, use_cache)
        return x + self.mlp(self.post_attention_layernorm(x)), present


def decoder_forward(model, input_ids=None, position_ids=None, attention_mask=None, inputs_embeds=None, use_cache=None,
                    past_key_values=None, output_hidden_states=None, return_dict=None, **kwargs):
    """The decoder stack of `model` (a family's base model: ``embed_tokens``, ``layers``,
    ``norm``): `BaseModelOutputWithPast` (``last_hidden_state [B, T, H]``, the new cache), or
    `MoEModelOutputWithPast` with ``router_logits`` when layers return them after their cache."""
    if kwargs.get("output_attentions") or kwargs.get("attn_mask_startend_row_indices") is not None:
        raise NotImplementedError(f"{type(model).__name__}: output_attentions / attn_mask_startend_row_indices")
    config = model.config
    use_cache = config.use_cache if use_cache is None else use_cache
    h = model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
    B, S = h.shape[0], h.shape[1]
    past_key_values = past_key_values or [None] * len(model.layers)
    past = 0 if past_key_values[0] is None else past_key_values[0][0].shape[1]
    if attention_mask is None:
        attention_mask = paddle.ones([B, past + S], dtype="bool")
    mask = Qwen2Model._prepare_decoder_attention_mask(attention_mask, (B, S), past, h.dtype)
    if position_ids is None:
        position_ids = paddle.arange(past, past + S, dtype="int64").expand([B, S])
    hidden_states, cache, router_logits = [], [], []
    for layer, layer_past in zip(model.layers, past_key_values):
        if output_hidden_states:
            hidden_states.append(h)
        # a replayed routing goes in as an argument, so that a recomputed forward replays it too
        replay = getattr(layer, "replay_indices", None)
        args = (h, position_ids, mask, layer_past, use_cache) + (() if replay is None else (replay,))
        if model.enable_recompute and config.recompute_granularity == "full" and not h.stop_gradient:
            outputs = recompute(layer, *args, use_reentrant=config.recompute_use_reentrant)
        else:
            outputs = layer(*args)
        h, present = outputs[0], outputs[1]
        router_logits.extend(outputs[2:])  # a mixture-of-experts layer's router logits [B*T, E]
        cache.append(present)
    h = model.norm(h)
    if output_hidden_states:
        hidden_states.append(h)
    fields = dict(last_hidden_state=h, past_key_values=tuple(cache) if use_cache else None,
                  hidden_states=tuple(hidden_states) if output_hidden_states else None)
    out = (MoEModelOutputWithPast(**fields, router_logits=tuple(router_logits)) if router_logits
           else BaseModelOutputWithPast(**fields))
    return out if return_dict or return_dict is None and config.use_return_dict else out.to_tuple()


class LMHead(nn.Layer):
    """``hidden [B, T, H] @ weight``: ``[H, V]``, or the tied embedding ``[V, H]`` with
    ``transpose_y`` (the attribute `ppo.models.causal_lm.lm_head_weight` reads). Under tensor
    parallelism with a split vocabulary the weight is this rank's ``[H, V / n]`` (tied:
    ``[V / n, H]``) and the logits are gathered unless ``tensor_parallel_output``
    (PaddleNLP's `parallel_matmul`)."""

    def __init__(self, config, embedding_weight=None):
        super().__init__()
        self.config = config
        self.transpose_y = embedding_weight is not None
        if self.transpose_y:
            self.weight = embedding_weight
            return
        split = tp.vocab_split(config)
        vocab = config.vocab_size // tp.degree(config) if split else config.vocab_size
        self.weight = self.create_parameter([config.hidden_size, vocab], dtype=paddle.get_default_dtype())
        if split:
            self.weight.is_distributed, self.weight.split_axis = True, 1

    def forward(self, hidden_states, tensor_parallel_output=None):
        if not getattr(self.weight, "is_distributed", False):
            return paddle.matmul(hidden_states, self.weight, transpose_y=self.transpose_y)
        from paddlenlp.transformers.llama.modeling import parallel_matmul

        if tensor_parallel_output is None:
            tensor_parallel_output = bool(getattr(self.config, "tensor_parallel_output", False))
        return parallel_matmul(hidden_states, self.weight, transpose_y=self.transpose_y,
                               tensor_parallel_output=tensor_parallel_output)
