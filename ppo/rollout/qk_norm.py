"""The rollout engine's q/k norm: RMSNorm over each q and k head of the fused q/k/v projection,
before RoPE (Qwen3's ``self_attn.q_norm`` / ``k_norm``; `ppo.models.families`).

The engine's attention op takes the fused projection ``[q | k | v]`` and applies RoPE itself,
so the norms go in between: the q and k columns are normalised per head of ``head_dim``
(variance in float32, as the training forward) and the three parts joined again. "rows"
layout: ``qkv [B, T, W]`` or ``[B, W]``; "cols" layout: ``qkv [W, B]``, its heads transposed to
``[heads * B, head_dim]`` and back; both through the op set's RMSNorm over rows of ``head_dim``.
"""
import paddle


def _heads_rms(ops, x, weight, head_dim, eps, cols):
    if cols:  # [n * hd, B] -> rows [n * B, hd] for the compiled op (2.5x faster than Paddle ops here) -> back
        n, B = x.shape[0] // head_dim, x.shape[1]
        rows = x.reshape([n, head_dim, B]).transpose([0, 2, 1]).contiguous().reshape([-1, head_dim])
        y = ops.rms_norm(rows, weight, eps, False)
        return y.reshape([n, B, head_dim]).transpose([0, 2, 1]).reshape(x.shape)
    return ops.rms_norm(x.reshape([-1, head_dim]), weight, eps, False).reshape(x.shape)


def apply_qk_norm(ops, qkv, q_weight, k_weight, num_heads, num_kv_heads, head_dim, eps, cols):
    """`qkv` (``[q | k | v]`` columns, see the module docstring) with its q heads normalised by
    `q_weight [head_dim]` and its k heads by `k_weight [head_dim]`; v unchanged."""
    axis = 0 if cols else -1
    q, k, v = paddle.split(qkv, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], axis=axis)
    q = _heads_rms(ops, q, q_weight, head_dim, eps, cols)
    k = _heads_rms(ops, k, k_weight, head_dim, eps, cols)
    return paddle.concat([q, k, v], axis=axis)
