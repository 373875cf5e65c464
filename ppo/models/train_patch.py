"""Fused RMSNorm, RoPE, SwiGLU and attention for PaddleNLP's Llama and Qwen2 layers in training and scoring.

On a CPU build, PaddleNLP's RMSNorm squares with ``pow(2)`` and multiplies by broadcasts, its
RoPE rotates with two slices, a negation and a concat, and each launches several elementwise
kernels forward and backward. The patch routes them through `ppo.models.fused_train_ops`: one
C++ kernel per op and direction (``csrc/cpu/train_ops.cc``) when the custom-op library is
built and the tensors are float32, else the ops' pure-Paddle twins (same formulas):

- ``RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w`` (variance in float32, as PaddleNLP);
- ``rope(x) = x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = concat(-x2, x1)``;
- ``swiglu(gate, up) = silu(gate) * up`` (Llama's ``swiglu``, Qwen2's MLP);
- ``attention = softmax(q k^T / sqrt(D) + mask) v`` (``scaled_dot_product_attention``'s plain path).

The patch is on by default (``use_train_patch``) and announced once in the log; on a CUDA
build it is not applied and the models use Paddle's fused GPU kernels instead
(``use_fused_rms_norm`` / ``use_fused_rope`` in their config, see `patch_overrides`).
It acts on the classes, so every Llama / Qwen2 model of the process uses it.
"""
import functools
import inspect
import logging
import math

import paddle

from ppo.models.fused_train_ops import fused_rms_norm, fused_rope, fused_sdpa, fused_swiglu, kernels_usable

logger = logging.getLogger("ppo.models.train_patch")

_ORIGINALS = {}


def _rms_norm_forward(self, hidden_states):
    if self.config.use_fused_rms_norm:
        return _ORIGINALS[type(self)](self, hidden_states)
    return fused_rms_norm(hidden_states, self.weight, self.variance_epsilon)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids):
    """PaddleNLP's ``apply_rotary_pos_emb`` (same arguments: ``q``, ``k`` ``[B, S, heads, D]``,
    ``cos``/``sin`` ``[1, S_max, 1, D]``, ``position_ids [B, S]`` or None) through `fused_rope`."""
    if position_ids is None:
        cos = cos[0, : q.shape[1], 0, :].unsqueeze(0)
        sin = sin[0, : q.shape[1], 0, :].unsqueeze(0)
    else:
        rows = position_ids.reshape([-1])  # index_select: advanced indexing costs ~30x more here
        cos = paddle.index_select(cos.squeeze(axis=[0, 2]), rows).reshape([*position_ids.shape, -1])
        sin = paddle.index_select(sin.squeeze(axis=[0, 2]), rows).reshape([*position_ids.shape, -1])
    return fused_rope(q, k, cos, sin)


def _qwen2_mlp_forward(self, x):
    """Qwen2MLP.forward with `fused_swiglu` for the silu activation (PaddleNLP's own otherwise)."""
    if not self.fuse_swiglu:
        return _ORIGINALS["qwen2_mlp"](self, x)
    if self.fuse_attention_ffn:
        return self.down_proj(fused_swiglu(self.gate_up_fused_proj(x)))
    return self.down_proj(fused_swiglu(self.gate_proj(x), self.up_proj(x)))


_SDPA_OFF = ("alibi", "attn_mask_startend_row_indices", "sequence_parallel", "reshard_layer", "output_attentions")


def _make_sdpa(original):
    """PaddleNLP's ``scaled_dot_product_attention`` (same arguments) through `fused_sdpa` on
    the plain path; the original for flash attention, alibi, sequence parallel, returned
    attention weights, attention dropout in training, a KV cache (or k/v heads not repeated
    to q's) or a missing mask."""
    signature = inspect.signature(original)

    def scaled_dot_product_attention(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        a = bound.arguments
        q, k, v, mask, config = a["query_states"], a["key_states"], a["value_states"], a["attention_mask"], a["config"]
        dropout = getattr(config, "attention_dropout", 0.0) and a.get("training", True)
        if (not _ORIGINALS or config.use_flash_attention or dropout or mask is None or any(a.get(n) for n in _SDPA_OFF)
                or list(q.shape) != list(k.shape) or not kernels_usable(q, k, v, mask)):
            return original(*args, **kwargs)
        B, S, H, D = q.shape
        return fused_sdpa(q, k, v, mask.reshape([mask.shape[0], 1, S, S]), 1.0 / math.sqrt(D))

    scaled_dot_product_attention.original = original
    return scaled_dot_product_attention


def _attention_class_property(module):
    """A class property for ``attn_func``: PaddleNLP's attention layers bind the module's
    ``scaled_dot_product_attention`` (or a partial of it) when built, so layers built before
    the patch get the patched function on lookup."""
    patched = module.scaled_dot_product_attention

    def get(self):
        fn = self.__dict__.get("attn_func")
        if fn is patched.original:
            return patched
        if isinstance(fn, functools.partial) and fn.func is patched.original:
            return functools.partial(patched, *fn.args, **fn.keywords)
        return fn

    def set_(self, value):
        self.__dict__["attn_func"] = value

    return property(get, set_)


def _attention_classes():
    from paddlenlp.transformers.llama import modeling as llama
    from paddlenlp.transformers.qwen2 import modeling as qwen2

    return [(llama, llama.LlamaAttention), (qwen2, qwen2.Qwen2Attention)]


def _targets():
    """`(modeling module, RMSNorm class)` of the PaddleNLP models the patch covers."""
    from paddlenlp.transformers.llama import modeling as llama
    from paddlenlp.transformers.qwen2 import modeling as qwen2

    return [(llama, llama.LlamaRMSNorm), (qwen2, qwen2.Qwen2RMSNorm)]


def is_applied():
    """Whether the patch is installed (the families of `ppo.models.families` read it to pick
    the fused ops or their twins)."""
    return bool(_ORIGINALS)


def apply_train_patch():
    """Install the patch (idempotent); returns True when it was installed by this call."""
    if _ORIGINALS:
        return False
    for module, norm_class in _targets():
        _ORIGINALS[norm_class] = norm_class.forward
        _ORIGINALS[module] = module.apply_rotary_pos_emb
        norm_class.forward = _rms_norm_forward
        module.apply_rotary_pos_emb = apply_rotary_pos_emb
        module.scaled_dot_product_attention = _make_sdpa(module.scaled_dot_product_attention)
    for module, attention in _attention_classes():
        attention.attn_func = _attention_class_property(module)
    llama, qwen2 = (m for m, _ in _targets())
    _ORIGINALS["llama_swiglu"] = llama.swiglu
    llama.swiglu = fused_swiglu
    _ORIGINALS["qwen2_mlp"] = qwen2.Qwen2MLP.forward
    qwen2.Qwen2MLP.forward = _qwen2_mlp_forward
    from ppo import kernels

    how = "C++ kernels (csrc/cpu/train_ops.cc)" if kernels.notice_fallback() else "pure-Paddle twins"
    logger.info(f"train patch on: RMSNorm, RoPE, SwiGLU and attention of PaddleNLP's Llama/Qwen2 run as fused ops, {how} "
                "(use_train_patch false turns it off)")
    return True


def remove_train_patch():
    """Restore PaddleNLP's own RMSNorm, RoPE and SwiGLU."""
    if not _ORIGINALS:
        return
    for module, norm_class in _targets():
        norm_class.forward = _ORIGINALS.pop(norm_class)
        module.apply_rotary_pos_emb = _ORIGINALS.pop(module)
        module.scaled_dot_product_attention = module.scaled_dot_product_attention.original
    for _, attention in _attention_classes():
        del attention.attn_func
    llama, qwen2 = (m for m, _ in _targets())
    llama.swiglu = _ORIGINALS.pop("llama_swiglu")
    qwen2.Qwen2MLP.forward = _ORIGINALS.pop("qwen2_mlp")


def patch_overrides(enabled, cuda=None, dtype="float32"):
    """Model-config overrides for `use_train_patch`: on a CUDA build, Paddle's fused RMSNorm and
    RoPE kernels, and flash attention for a bfloat16/float16 model (its kernels take only
    those); on a CPU build none (the CPU patch is installed instead)."""
    cuda = paddle.is_compiled_with_cuda() if cuda is None else cuda
    if not enabled:
        remove_train_patch()
        return {}
    if cuda:
        overrides = {"use_fused_rms_norm": True, "use_fused_rope": True}
        if dtype in ("bfloat16", "float16"):
            overrides["use_flash_attention"] = True
        return overrides
    apply_train_patch()
    return {}
