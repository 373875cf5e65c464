"""Choosing response tokens by a score: the top-k rank mask shared by the covariance losses
(``ppo.algos.covariance_losses``) and token selection by entropy (``top_entropy_frac``).

Counts and ranks stay tensors (no ``.item()``): a rank is a token's position in a stable
descending sort, so ties go to the earlier token in row-major order.
"""
import paddle

from .masked import _float_mask

__all__ = ["count_from_fraction", "high_entropy_mask", "top_k_mask"]


def top_k_mask(score, eligible, k):
    """Boolean mask of the ``min(k, #eligible)`` eligible entries with the largest ``score``.

    Formula: ``rank_i`` = position of ``i`` when the eligible scores are sorted descending
    (stable: equal scores keep row-major order; ineligible entries sort last);
    ``out_i = eligible_i and rank_i < k``. The selection is over all entries of the tensor
    together (a micro-batch's tokens), not per row. ``k``: an int or a scalar tensor.
    Example: scores ``[[1, 3], [3, 2]]``, all eligible, ``k = 2`` -> ``[[F, T], [T, F]]``;
    with ``[0, 1]`` ineligible the second pick is 2: ``[[F, T], [F, T]]``.
    Shapes: ``score``, ``eligible`` ``[B, T]`` (any equal shapes) -> bool of that shape.
    """
    flat = score.detach().reshape([-1])
    el = eligible.astype("bool").reshape([-1])
    key = paddle.where(el, flat, paddle.full_like(flat, float("-inf")))
    order = paddle.argsort(key, descending=True, stable=True)
    rank = paddle.argsort(order, stable=True).astype("float64")  # inverse permutation
    k = k.astype("float64") if isinstance(k, paddle.Tensor) else float(k)
    return paddle.logical_and(el, rank < k).reshape(score.shape)


def count_from_fraction(mask, fraction, round_up=False):
    """How many tokens a fraction of the masked tokens is, as a float64 scalar tensor.

    Formula: ``N = sum(mask != 0)``; ``max(1, floor(fraction * N))`` (verl's
    ``max(int(ratio * N), 1)`` for Clip-Cov / KL-Cov), or with ``round_up``
    ``max(1, floor(fraction * N + 0.9999))`` (the ceiling as the Beyond-80/20 authors'
    code writes it, so that ``0.3 * 10 = 3.0000000000000004`` stays 3); 0 when ``N = 0``.
    The product is taken in float64, as Python's ``int(ratio * N)`` does.
    Example: ``N = 7``: fraction 0.2 -> 1 (``floor(1.4)``), with ``round_up`` -> 2.
    Shapes: ``mask`` ``[B, T]`` -> scalar.
    """
    n = paddle.sum((mask != 0).astype("float64"))
    x = n * fraction + (0.9999 if round_up else 0.0)
    return paddle.where(n > 0, paddle.maximum(paddle.floor(x), paddle.ones_like(x)), paddle.zeros_like(x))


def high_entropy_mask(entropy, mask, top_frac):
    """Mask of the highest-entropy ``top_frac`` of the response tokens (the "forking tokens").

    Formula (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
    Effective Reinforcement Learning for LLM Reasoning", the ``I[H_t >= tau_rho]`` of their
    objective): with ``N`` masked tokens, keep the ``k = max(1, ceil(top_frac * N))``
    masked tokens of largest entropy ``H_t`` (``count_from_fraction(..., round_up=True)``;
    ties to the earlier token); the rest and every masked-out token get 0.
    Example: entropies ``[0.1, 0.9, 0.5, 0.7]``, all real, ``top_frac = 0.5`` -> keep
    ``[0, 1, 0, 1]``; with the 0.9 token masked out, ``N = 3``, ``k = ceil(1.5) = 2`` ->
    ``[0, 0, 1, 1]``.
    Compared with: the authors' ``get_global_entropy_top_mask``
    (Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR ``verl/trainer/ppo/core_algos.py:53-86``: a
    top-k over the micro-batch's response tokens, ``k = max(1, int(N * ratio + 0.9999))``)
    gives the same mask. TRL's ``get_high_entropy_mask`` (``grpo_trainer.py:1396-1432``) keeps
    tokens at or above the ``1 - top_frac`` quantile (linear interpolation) gathered over
    processes: ``1 + floor(top_frac * (N - 1))`` tokens without ties, the same count unless
    ``0 < frac(top_frac * N) < top_frac`` (``N = 7``, ``top_frac = 0.3``: TRL 2, here 3).
    Shapes: ``entropy``, ``mask`` ``[B, T]`` -> float mask ``[B, T]`` (dtype of ``entropy``).
    """
    if not 0.0 < top_frac <= 1.0:
        raise ValueError(f"top_entropy_frac must be in (0, 1], got {top_frac}")
    real = _float_mask(mask, entropy) != 0
    k = count_from_fraction(real, top_frac, round_up=True)
    return top_k_mask(entropy, real, k).astype(entropy.dtype)
