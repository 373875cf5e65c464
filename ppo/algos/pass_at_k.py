"""Pass@k advantages for GRPO groups (Chen et al. 2025, "Pass@k Training for Adaptively
Balancing Exploration and Exploitation of Large Reasoning Models", the analytic form).

Registered as the ``pass_at_k`` advantage estimator (``ppo.algos.advantage_registry.ADV_ESTIMATORS``).
"""
import paddle

from .groups import group_view

__all__ = ["pass_at_k_advantages"]


def _falling_ratio(top, bottom, j):
    """``C(top, j) / C(bottom, j) = prod_{i < j} (top - i) / (bottom - i)`` for a tensor ``top``
    (integer-valued, may be -1) and an int ``bottom >= j``; each factor is clipped at 0, so the
    ratio is 0 as soon as ``top < j`` (the first non-positive factor is exactly 0) and 1 for
    ``j = 0``."""
    out = paddle.ones_like(top)
    for i in range(j):
        out = out * paddle.clip((top - i) / float(bottom - i), min=0.0)
    return out


def pass_at_k_advantages(scores, group_size, k, threshold=0.5, scale_by_std=True, eps=1e-6):
    """Analytic pass@k group advantages, one per sequence.

    A response is correct when its score is above ``threshold``. In a group of ``n =
    group_size`` responses with ``n_neg`` incorrect ones, draw every k-subset ("k-group")
    and give it reward 1 when it holds a correct response, else 0. Over the ``C(n, k)``
    k-groups (Chen et al. 2025, the analytic derivation):
    ``rho = 1 - C(n_neg, k) / C(n, k)`` (mean k-group reward: the unbiased pass@k),
    ``sigma = sqrt(rho * (1 - rho))`` (their std, a Bernoulli's),
    ``A_pos = (1 - rho) / (sigma + eps)`` and
    ``A_neg = (1 - rho - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / (sigma + eps)``.
    Derivation: a response's advantage is the mean of ``(R(g) - rho) / sigma`` over the
    ``C(n - 1, k - 1)`` k-groups ``g`` holding it. Every k-group holding a correct response
    has ``R = 1``, hence ``A_pos``. Of those holding an incorrect one, ``C(n_neg - 1, k - 1)``
    hold only incorrect responses (``R = 0``), the rest ``R = 1``: the mean of ``R - rho`` is
    ``1 - rho - C(n_neg - 1, k - 1) / C(n - 1, k - 1)``.
    ``scale_by_std=False`` leaves out the division by ``sigma + eps`` (Dr.GRPO's choice).
    Worked case (``n = 4``, one correct, ``k = 2``): ``rho = 1 - C(3,2)/C(4,2) = 1/2``,
    ``sigma = 1/2``, ``A_pos = 1``, ``A_neg = (1/2 - C(2,1)/C(3,1)) / (1/2) = -1/3`` (up to
    ``eps``). ``k = 1`` gives GRPO with the population std: ``rho = c / n``,
    ``A_pos = (1 - rho) / sigma``, ``A_neg = -rho / sigma``. A group where every k-group
    passes (``n_neg < k``) or none does (no correct response) gets exactly 0: both
    numerators are exactly 0 there.
    Shapes: ``scores`` ``[B]``, ``B = num_groups * group_size`` -> ``[B]`` (no gradient).
    Source: Chen et al. 2025 (arXiv 2508.10751); the authors' ``code/passk_adv.py``
    (``calc_adv``, RUCAIBox/Passk_Training) computes the same expressions with
    ``sigma + 1e-6`` for rewards that are exactly 1 or 0. verl's ``grpo_passk`` estimator is
    another method (only the best response of a group gets ``r_max - r_second``).
    """
    if not 1 <= k <= group_size:
        raise ValueError(f"pass@k advantages need 1 <= k <= group_size, got k={k}, group_size={group_size}")
    g = group_view(scores.detach(), group_size)
    correct = g > threshold
    n_neg = paddle.sum((~correct).astype(g.dtype), axis=1, keepdim=True)
    rho = 1.0 - _falling_ratio(n_neg, group_size, k)
    a_pos = 1.0 - rho
    a_neg = 1.0 - rho - _falling_ratio(n_neg - 1.0, group_size - 1, k - 1)
    if scale_by_std:
        sigma = paddle.sqrt(rho * (1.0 - rho))
        a_pos, a_neg = a_pos / (sigma + eps), a_neg / (sigma + eps)
    adv = paddle.where(correct, a_pos.expand(g.shape), a_neg.expand(g.shape))
    return adv.reshape([-1])
