"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models"): the policy entropy falls in proportion to the covariance
between a token's log-prob and its advantage, so these losses act on the few tokens with the
largest covariance.

Token covariance (the paper's ``Cov(y_i)``): ``cov_t = (logp_t - mean(logp)) *
(A_t - mean(A))``, the means over the masked tokens of the call (a micro-batch, as in the
authors' code). Both functions return ``(token_loss [B, T], stats)`` for the policy-loss
registry (``ppo.algos.policy_registry``). Log-ratios are clamped to ``[-20, 20]`` before
``exp`` as in ``ppo_policy_loss`` (the authors' code does not clamp).
"""
import paddle

from .losses import CLIP_RANGE_RATIO, ratio_stats
from .masked import _float_mask, _zero_outside, masked_mean, zero_masked_inputs
from .setting import Setting
from .token_selection import count_from_fraction, top_k_mask

__all__ = ["clip_cov_token_losses", "kl_cov_token_losses", "token_covariance", "CLIP_COV_SETTINGS", "KL_COV_SETTINGS"]

CLIP_COV_RATIO = Setting("clip_cov_ratio", float, 2e-4, "clip_cov: fraction of the response tokens whose loss is dropped (at least 1).")
CLIP_COV_LB = Setting("clip_cov_lb", float, 1.0, "clip_cov: a dropped token's covariance is above this.")
CLIP_COV_UB = Setting("clip_cov_ub", float, 5.0, "clip_cov: a dropped token's covariance is below this.")
CLIP_COV_SETTINGS = (CLIP_COV_RATIO, CLIP_COV_LB, CLIP_COV_UB)
KL_COV_RATIO = Setting("kl_cov_ratio", float, 2e-4, "kl_cov: fraction of the response tokens (largest covariance) given the KL penalty.")
KL_COV_COEF = Setting("kl_cov_coef", float, 1.0, "kl_cov: weight of the |logp - old logp| penalty.")
KL_COV_SETTINGS = (KL_COV_RATIO, KL_COV_COEF)
"""The settings of the two losses below (the registry's entries list them; the functions default to them)."""


def token_covariance(logprobs, advantages, mask):
    """Each token's centred product ``(logp_t - mean(logp)) * (A_t - mean(A))``.

    Means over the masked tokens; 0 outside the mask; no gradient.
    Example: ``logp = [-1, -3]``, ``A = [2, 0]`` -> means ``-2``, ``1`` -> ``[1, 1]``.
    Shapes: ``[B, T]`` -> ``[B, T]``.
    """
    m = _float_mask(mask, logprobs)
    lp, adv = zero_masked_inputs(m, logprobs.detach(), advantages.detach().astype(logprobs.dtype))
    cov = (lp - masked_mean(lp, m)) * (adv - masked_mean(adv, m))
    return _zero_outside(cov, m)


def _prepared(logprobs, old_logprobs, advantages, mask):
    """``(m, logp, old, adv, r)``: the float mask, the inputs zeroed outside it
    (``zero_masked_inputs``; ``old``, ``adv`` detached) and the clamped ratio."""
    m = _float_mask(mask, logprobs)
    logp, old, adv = zero_masked_inputs(m, logprobs, old_logprobs.detach().astype(logprobs.dtype),
                                        advantages.detach().astype(logprobs.dtype))
    return m, logp, old, adv, paddle.exp(paddle.clip(logp - old, min=-20.0, max=20.0))


def clip_cov_token_losses(logprobs, old_logprobs, advantages, mask, clip_range_ratio=CLIP_RANGE_RATIO.default,
                          clip_range_ratio_low=None, clip_range_ratio_high=None, clip_cov_ratio=CLIP_COV_RATIO.default,
                          clip_cov_lb=CLIP_COV_LB.default, clip_cov_ub=CLIP_COV_UB.default, uniforms=None):
    """Clip-Cov: PPO's clipped loss, with a few random high-covariance tokens taken out.

    Formula (Cui et al. 2025, Clip-Cov): ``L1 = -A r``, ``L2 = -A clip(r, 1 - eps_l, 1 + eps_h)``;
    candidates are the masked tokens that PPO's clip left alone (``L2 <= L1``) with
    ``clip_cov_lb < cov_t < clip_cov_ub``; ``n = max(1, floor(clip_cov_ratio * N))`` of them
    (``N`` masked tokens; all if fewer) are drawn uniformly at random, and those tokens'
    loss is set to 0 (so they give no gradient); every other token keeps ``max(L1, L2)``.
    The draw: the ``n`` candidates with the smallest ``uniforms`` (``[B, T]`` in ``[0, 1)``;
    None draws them with ``paddle.rand``, the global generator).
    Regimes: a candidate is dropped (loss 0, gradient 0); a token above ``clip_cov_ub`` or
    clipped by PPO is never dropped; with ``n`` >= the candidates every candidate is dropped.
    Worked case: ``logp = [-1, -3, -2]``, ``old = logp``, ``A = [3, 0, 0]``, all real: means
    ``-2``, ``1``, ``cov = [2, 1, 0]``; with bounds ``(1, 5)`` only token 0 is a candidate and
    ``n = 1``: token losses ``[0, 0, 0]`` (``-A r`` is 0 for the others), the gradient of
    token 0 (``-3`` under PPO) is 0.
    Stats: ``policy/clipfrac_avg`` (PPO's clip), ``policy/cov_clipfrac_avg`` (fraction of
    tokens dropped; verl's ``actor/pg_clipfrac`` for this loss), ``policy/approxkl_avg``,
    ``val/ratio``, ``val/ratio_var``.
    Compared with: the authors' ``compute_policy_loss_clip_cov``
    (PRIME-RL/Entropy-Mechanism-of-RL ``verl/trainer/ppo/core_algos.py:469-518``) and verl
    ``verl/trainer/ppo/core_algos.py:1450-1552``: the same candidates, count and token losses
    (``torch.randperm`` picks the random subset there).
    Shapes: ``[B, T]`` inputs -> ``([B, T], stats)``.
    """
    if not clip_cov_ratio > 0 or not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov needs clip_cov_ratio > 0 and clip_cov_lb < clip_cov_ub, got "
                         f"{clip_cov_ratio}, ({clip_cov_lb}, {clip_cov_ub})")
    low = clip_range_ratio if clip_range_ratio_low is None else clip_range_ratio_low
    high = clip_range_ratio if clip_range_ratio_high is None else clip_range_ratio_high
    m, logprobs, old, adv, ratio = _prepared(logprobs, old_logprobs, advantages, mask)
    real = m != 0
    pg1 = -adv * ratio
    pg2 = -adv * paddle.clip(ratio, min=1.0 - low, max=1.0 + high)
    by_ppo = pg2 > pg1
    cov = token_covariance(logprobs, adv, m)
    candidates = real & ~by_ppo & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    if uniforms is None:
        uniforms = paddle.rand(m.shape, dtype="float32")
    dropped = top_k_mask(-uniforms.astype("float32"), candidates, count_from_fraction(real, clip_cov_ratio))
    token_loss = paddle.where(dropped, paddle.zeros_like(pg1), paddle.maximum(pg1, pg2))
    stats = ratio_stats(logprobs, old, ratio, m)
    stats["policy/clipfrac_avg"] = masked_mean(by_ppo.astype(m.dtype), m).detach()
    stats["policy/cov_clipfrac_avg"] = masked_mean(dropped.astype(m.dtype), m).detach()
    return token_loss, stats


def kl_cov_token_losses(logprobs, old_logprobs, advantages, mask, kl_cov_ratio=KL_COV_RATIO.default,
                        kl_cov_coef=KL_COV_COEF.default):
    """KL-Cov: the unclipped policy-gradient loss, with a KL penalty on the top-covariance tokens.

    Formula (Cui et al. 2025, KL-Cov): ``L_t = -A_t r_t`` (no clip), and for the
    ``k = max(1, floor(kl_cov_ratio * N))`` masked tokens of largest ``cov_t``
    ``L_t = -A_t r_t + kl_cov_coef * |logp_t - old_t|``.
    Regimes: a selected token off-policy by ``d = logp - old`` gets ``+beta |d|`` and the
    gradient ``-A r + beta sign(d)``; an unselected one ``-A r``; on-policy (``d = 0``) the
    penalty is 0 in value (its subgradient there is 0 too).
    Worked case: ``logp = [-1, -3, -2]``, ``old = [-1.5, -3, -2]``, ``A = [3, 0, 0]``: ``cov``
    uses ``logp`` -> ``[2, 1, 0]``; ``k = 1`` picks token 0: ``L_0 = -3 e^0.5 + 0.5``,
    ``dL_0/dlogp = -3 e^0.5 + 1``.
    Stats: ``policy/cov_klfrac_avg`` (fraction of tokens penalised), ``policy/approxkl_avg``,
    ``val/ratio``, ``val/ratio_var``; no clip, so no clip fraction.
    Compared with: the authors' ``compute_policy_loss_kl_cov``
    (PRIME-RL/Entropy-Mechanism-of-RL ``verl/trainer/ppo/core_algos.py:426-467``, with
    ``k_percent`` in percent: their 7B script's 0.2 is ``kl_cov_ratio = 0.002``) and verl
    ``verl/trainer/ppo/core_algos.py:1555-1632`` (``kl_cov_ratio`` a fraction, default 0.0002,
    ``ppo_kl_coef`` 1): the same selection (``torch.topk``) and token losses.
    Shapes: ``[B, T]`` inputs -> ``([B, T], stats)``.
    """
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov needs kl_cov_ratio > 0, got {kl_cov_ratio}")
    m, logprobs, old, adv, ratio = _prepared(logprobs, old_logprobs, advantages, mask)
    real = m != 0
    pg = -adv * ratio
    chosen = top_k_mask(token_covariance(logprobs, adv, m), real, count_from_fraction(real, kl_cov_ratio))
    token_loss = paddle.where(chosen, pg + kl_cov_coef * paddle.abs(logprobs - old), pg)
    stats = ratio_stats(logprobs, old, ratio, m)
    stats["policy/cov_klfrac_avg"] = masked_mean(chosen.astype(m.dtype), m).detach()
    return token_loss, stats
