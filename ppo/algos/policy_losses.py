"""Token losses of CISPO and GMPO for the policy-loss registry (``ppo.algos.policy_registry``).

Each function returns ``(token_loss, stats)``: ``token_loss`` ``[B, T]`` with gradient, to be
reduced by ``aggregate_loss`` over the response mask (the inputs are zeroed outside the mask
first, so a masked-out token loss is finite, that of zero inputs, whatever junk was there),
``stats`` detached scalars with the names of ``ppo_policy_loss``'s stats.
Log-ratios are clamped to ``[-20, 20]`` before ``exp``, as ``ppo_policy_loss`` does.
"""
import paddle

from .losses import ratio_stats
from .masked import _float_mask, masked_mean, zero_masked_inputs
from .setting import Setting

__all__ = ["cispo_token_losses", "gmpo_token_losses", "CISPO_SETTINGS", "GMPO_SETTINGS"]

CISPO_CLIP_LOW = Setting("cispo_clip_low", float, None,
                         "cispo: the weight's lower bound is 1 - this (None: no lower bound, as MiniMax-M1).")
CISPO_CLIP_HIGH = Setting("cispo_clip_high", float, 4.0, "cispo: the weight's upper bound is 1 + this (None: no upper bound).",
                          optional=True)
CISPO_SETTINGS = (CISPO_CLIP_LOW, CISPO_CLIP_HIGH)
GMPO_CLIP_LOW = Setting("gmpo_clip_low", float, 0.4, "gmpo: lower clip of the token log-ratio (-this).")
GMPO_CLIP_HIGH = Setting("gmpo_clip_high", float, 0.4, "gmpo: upper clip of the token log-ratio.")
GMPO_SETTINGS = (GMPO_CLIP_LOW, GMPO_CLIP_HIGH)
"""The settings of the two losses below (the registry's entries list them; the functions default to them)."""


def _log_ratio(logprobs, old_logprobs, advantages, mask):
    """``(m, logp, old, adv, logp - old clamped to [-20, 20])``: ``m`` the float mask, the
    inputs zeroed outside it (``zero_masked_inputs``), ``old`` and ``adv`` detached and cast to
    the dtype of ``logprobs``."""
    m = _float_mask(mask, logprobs)
    logp, old, adv = zero_masked_inputs(m, logprobs, old_logprobs.detach().astype(logprobs.dtype),
                                        advantages.detach().astype(logprobs.dtype))
    return m, logp, old, adv, paddle.clip(logp - old, min=-20.0, max=20.0)


def cispo_token_losses(logprobs, old_logprobs, advantages, mask, cispo_clip_low=None, cispo_clip_high=CISPO_CLIP_HIGH.default):
    """CISPO: a clipped, stop-gradient importance weight times the log-prob (MiniMax-M1, 2025).

    Formula (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention", the CISPO objective): ``r = exp(logp - old)``, ``w = sg(clip(r, 1 - eps_low, 1 + eps_high))``,
    token loss ``L = -w * A * logp`` (maximising ``sg(w) A log pi``), reduced by
    ``aggregate_loss`` (the paper: ``token-mean`` over the group's tokens). ``cispo_clip_low``
    = ``eps_low`` (None: no lower bound, as the paper runs it), ``cispo_clip_high`` =
    ``eps_high`` (None: no upper bound). The default 4.0 caps the weight at 5, the ``eps_max``
    ScaleRL (Khatri et al. 2025) uses and TRL recommends. Unlike PPO's clip, no token loses
    its gradient: ``dL/dlogp = -w * A`` for every token.
    Regimes (one token, ``A = 2``, ``logp = log r``): ``r = 1.5`` inside the band ->
    ``w = 1.5``, ``L = -3 log 1.5``, ``dL/dlogp = -3``; ``r = 8`` above ``1 + 4`` -> ``w = 5``,
    ``L = -10 log 8``, ``dL/dlogp = -10``; ``r = 0.5`` with ``cispo_clip_low = 0.2`` ->
    ``w = 0.8``, ``dL/dlogp = -1.6``.
    Stats: ``policy/clipfrac_avg`` = fraction of tokens whose weight was clipped (``w != r``),
    plus ``policy/approxkl_avg``, ``val/ratio`` (of ``r``), ``val/ratio_var``.
    Shapes: ``[B, T]`` inputs -> ``([B, T], stats)``.
    Compared with: verl ``verl/trainer/ppo/core_algos.py:1721-1779``
    (``compute_policy_loss_cispo``: the same loss, clipping to ``[1 - clip_ratio_low,
    1 + clip_ratio_high]``) and TRL ``trl/trainer/grpo_trainer.py:3080-3082`` (``loss_type
    "cispo"``: the weight capped at ``epsilon_high``, no lower bound); both give these
    numbers with the matching bounds (tests/test_policy_loss_registry.py).
    """
    m, logprobs, old, adv, d = _log_ratio(logprobs, old_logprobs, advantages, mask)
    ratio = paddle.exp(d)
    w = ratio
    if cispo_clip_high is not None:
        w = paddle.minimum(w, paddle.full_like(w, 1.0 + cispo_clip_high))
    if cispo_clip_low is not None:
        w = paddle.maximum(w, paddle.full_like(w, 1.0 - cispo_clip_low))
    w = w.detach()
    token_loss = -w * adv * logprobs
    stats = ratio_stats(logprobs, old, ratio, m)
    stats["policy/clipfrac_avg"] = masked_mean((w != ratio).astype(logprobs.dtype), m).detach()
    return token_loss, stats


def gmpo_token_losses(logprobs, old_logprobs, advantages, mask, gmpo_clip_low=GMPO_CLIP_LOW.default,
                      gmpo_clip_high=GMPO_CLIP_HIGH.default):
    """GMPO: the geometric mean of the token ratios, clipped per token in log space.

    Formula (Zhao et al. 2025, "Geometric-Mean Policy Optimization", the GMPO objective): per sequence
    ``J = (prod_t |min(r_t A, clip(r_t, e^-c_l, e^c_h) A)|)^(1/|o|) * sgn(A)``, i.e. with
    ``d_t = logp_t - old_t``: ``d'_t = min(d_t, clip(d_t, -c_l, c_h))`` when ``A > 0``,
    ``max(d_t, clip(d_t, -c_l, c_h))`` when ``A < 0`` (a ratio moving the favoured way is
    held at the bound), ``s = exp(mean_t d'_t)`` over the row's masked tokens and the
    sequence loss ``-A * s``. ``A`` is the masked mean of the row's advantages (for GRPO-family
    estimators every token has the same one); ``c_l``, ``c_h`` = ``gmpo_clip_low`` /
    ``gmpo_clip_high``, 0.4 as the authors' scripts (``CLIPRANGE=0.4``).
    Token form: ``L_t = -A * sg(s) * (1 + d'_t - sg(d'_t))``: every token's value is ``-A s``
    and ``d L_t = -A s d d'_t``, so with ``seq-mean-token-mean`` (the paper's reduction) the
    loss is ``mean_b(-A_b s_b)`` with exactly GMPO's gradient ``-A s mean_t d d'_t``; other
    ``loss_agg_mode``s weight each row by its token count. A token dropped by the token
    selection or weighted by an importance weight then drops or weights only its own share
    of the gradient.
    Regimes (one token, ``A = 1``, bounds 0.4): ``d = 0.2`` -> ``s = e^0.2``, loss ``-e^0.2``,
    ``dL/dlogp = -e^0.2``; ``d = 0.6`` -> held at ``0.4``: loss ``-e^0.4``, gradient 0;
    ``d = -0.6`` -> not held (``min(-0.6, -0.4) = -0.6``): loss ``-e^-0.6``. ``A = -1`` mirrors
    it: ``d = -0.6`` is held at ``-0.4`` (loss ``e^-0.4``, gradient 0). Two tokens ``d = (0.2,
    0.6)``, ``A = 1`` -> ``s = e^((0.2 + 0.4) / 2) = e^0.3``.
    Stats: ``policy/clipfrac_avg`` = fraction of tokens held at a bound (``d'_t != d_t``; verl
    also counts tokens outside the band that the ``min``/``max`` leaves alone),
    ``val/ratio`` / ``val/ratio_var`` of ``s`` on the row's tokens, ``policy/approxkl_avg``.
    Shapes: ``[B, T]`` inputs -> ``([B, T], stats)``.
    Compared with: the authors' ``train_zero_math_gmpo.py:675-688`` (callsys/GMPO, the
    ``gmpo`` branch, one sequence per micro-batch), verl
    ``verl/trainer/ppo/core_algos.py:1635-1718`` (``compute_policy_loss_geo_mean``, mean over
    rows) and TRL ``trl/experimental/gmpo/gmpo_trainer.py:82-105``; they give these losses and
    gradients (tests/test_policy_loss_registry.py). With ``top_entropy_frac`` TRL's GMPO takes
    the geometric mean over the kept tokens only; here ``s`` stays the mean over all of them.
    """
    m, logprobs, old, adv, d = _log_ratio(logprobs, old_logprobs, advantages, mask)
    a = masked_mean(adv, m, axis=-1).unsqueeze(-1)
    sgn = paddle.sign(a)
    held = paddle.clip(d, min=-gmpo_clip_low, max=gmpo_clip_high)
    d_eff = sgn * paddle.minimum(sgn * d, sgn * held)
    s = paddle.exp(masked_mean(d_eff.detach(), m, axis=-1)).unsqueeze(-1)
    token_loss = -a * s * (1.0 + d_eff - d_eff.detach())
    at_bound = paddle.where(a > 0, d > gmpo_clip_high, paddle.logical_and(a < 0, d < -gmpo_clip_low))
    stats = ratio_stats(logprobs, old, s.expand(d.shape), m)
    stats["policy/clipfrac_avg"] = masked_mean(at_bound.astype(logprobs.dtype), m).detach()
    return token_loss, stats
