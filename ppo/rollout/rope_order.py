"""Reordering q/k columns so that the rollout engine's half-split RoPE computes a family's
interleaved one (transformers' ERNIE 4.5 / GLM ``apply_rotary_pos_emb``, `ppo.models.families`).

Interleaved RoPE rotates each head's pairs ``(2i, 2i + 1)`` by frequency i; the engine's kernels
rotate ``(i, i + hd / 2)``. Moving column 2i to i and 2i + 1 to i + hd / 2 in both the q and the
k projection (weights, biases, q/k norm weights) turns one into the other, and the attention
scores ``q . k`` of each head are unchanged by a common reordering of q and k.
"""
from dataclasses import dataclass

import paddle


@dataclass
class HalfRotationOrder:
    """Column indices that reorder each q and k head of a family whose RoPE rotates the
    interleaved pairs ``(2i, 2i + 1)`` (ERNIE 4.5) to the half-split pairs ``(i, i + hd / 2)``
    the engine rotates: ``q [nh * hd]``, ``k [nkv * hd]``, ``head [hd]`` (for q/k norm weights).
    Attention scores ``q . k`` are unchanged by one common reordering of q and k; v is untouched."""

    q: paddle.Tensor
    k: paddle.Tensor
    head: paddle.Tensor

    @classmethod
    def of(cls, family, nh, nkv, hd):
        """The orders of `family` (None when its RoPE is already half-split)."""
        if family is None or not family.rope_interleaved:
            return None
        head = paddle.to_tensor(list(range(0, hd, 2)) + list(range(1, hd, 2)), dtype="int64")

        def columns(heads):
            return (paddle.arange(heads, dtype="int64").unsqueeze(1) * hd + head.unsqueeze(0)).reshape([-1])

        return cls(columns(nh), columns(nkv), head)
