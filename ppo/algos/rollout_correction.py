"""Rollout/training mismatch: diagnostics and importance-sampling corrections.

The rollout engine's per-token log-probs (fused ops, another dtype, chunked decoding) are
not exactly the training forward's, so an on-policy step is slightly off-policy. From the
two ``[B, T]`` log-probs of the sampled tokens and the response mask these functions give
the mismatch metrics and the importance weights ``w = pi_train / pi_rollout`` that multiply
each token's policy loss (``PolicyLoss(..., rollout_is_weights=w)`` in
``ppo.algos.policy_registry``): truncated (TIS, ``min(w, C)``) and/or masked (MIS, a token
or sequence whose weight is outside ``[lower, upper]`` gets weight 0: it gives no gradient
and still counts in the loss's normaliser). Weights are detached: they change the measure,
not the objective. Equal log-probs give weights of exactly 1, so the corrected loss is then
bit-equal to the uncorrected one.
Sources: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training" (TIS); Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse
from the Training-Inference Mismatch" (token/sequence IS, MIS).
"""
import paddle

from .masked import _float_mask, _zero_outside, masked_mean

__all__ = ["ROLLOUT_IS_LEVELS", "ROLLOUT_IS_THRESHOLD", "rollout_correction", "rollout_is_weights", "rollout_mismatch_metrics"]

ROLLOUT_IS_LEVELS = ("token", "sequence", "none")
ROLLOUT_IS_THRESHOLD = 2.0
"""The default TIS truncation (verl's): the argument `rollout_is_threshold` and the functions below."""
SAFETY_BOUND = 20.0  # log-weights are clamped to [-20, 20] before exp (verl's SAFETY_BOUND)


def _prepared(old_logprobs, rollout_logprobs, mask):
    old = old_logprobs.detach()
    rollout = rollout_logprobs.detach().astype(old.dtype)
    return _float_mask(mask, old), old, rollout


def rollout_mismatch_metrics(old_logprobs, rollout_logprobs, mask):
    """How far the rollout engine's log-probs are from the training forward's.

    Formulas (``d_t = old_t - rollout_t`` on the ``N`` masked tokens, ``S`` non-empty rows):
    ``rollout/logprob_diff_mean = sum_t |d_t| / N`` and ``rollout/logprob_diff_max =
    max_t |d_t|`` (TRL ``grpo_trainer.py:2779-2790``, ``sampling/sampling_logp_difference/{mean,
    max}``); ``rollout/ppl_ratio = (1/S) sum_b exp(mean_t rollout_bt - mean_t old_bt)``, the
    mean over sequences of ``PPL_train / PPL_rollout`` with ``PPL = exp(-mean_t logp)`` (verl
    ``rollout_corr_helper.py:905-921``, ``ppl_ratio``, which also averages over empty rows,
    where the ratio is 1). All 0 for an empty mask; ``ppl_ratio`` is 1 when the two agree.
    Example: ``old = [[-1, -2]]``, ``rollout = [[-1.5, -1.5]]`` -> ``|d| = [0.5, 0.5]``: mean and
    max 0.5; the row means are equal (-1.5) so ``ppl_ratio = 1``.
    Shapes: ``[B, T]`` -> dict of detached scalars.
    """
    m, old, rollout = _prepared(old_logprobs, rollout_logprobs, mask)
    abs_diff = _zero_outside(paddle.abs(old - rollout), m)
    seq_log_ratio = masked_mean(rollout, m, axis=-1) - masked_mean(old, m, axis=-1)
    nonempty = paddle.sum(m, axis=-1) > 0
    per_seq = paddle.where(nonempty, paddle.exp(seq_log_ratio), paddle.zeros_like(seq_log_ratio))
    count = paddle.sum(nonempty.astype(old.dtype))
    return {
        "rollout/logprob_diff_mean": masked_mean(abs_diff, m),
        "rollout/logprob_diff_max": paddle.max(abs_diff),
        "rollout/ppl_ratio": paddle.sum(per_seq) / paddle.clip(count, min=1.0),
    }


def _units_fraction(flags, m, rollout_is):
    """Fraction of the units (masked tokens, or non-empty rows at sequence level) where ``flags``."""
    if rollout_is == "token":
        return masked_mean(flags.astype(m.dtype), m)
    rows = paddle.sum(m, axis=-1) > 0
    return masked_mean(flags[:, 0].astype(m.dtype), rows.astype(m.dtype))


def rollout_is_weights(old_logprobs, rollout_logprobs, mask, rollout_is="token", rollout_is_threshold=ROLLOUT_IS_THRESHOLD,
                       rollout_is_lower=None, rollout_is_upper=None):
    """Importance weights ``pi_train / pi_rollout`` per token, truncated and/or masked.

    Formula: ``log w_t = old_t - rollout_t`` (``rollout_is="token"``) or, for every token of
    row ``b``, ``log w_b = sum_t (old_bt - rollout_bt)`` over its masked tokens (``"sequence"``:
    the product of the token ratios). MIS: a unit (token or row) with ``w < rollout_is_lower``
    or ``w > rollout_is_upper`` gets weight 0 (None: no bound). TIS: the kept weights become
    ``min(w, rollout_is_threshold)`` (None: no truncation); ``exp`` sees the log-weight clamped
    to ``[-20, 20]``, the bounds are checked on the unclamped ``w``. 0 outside the mask.
    Regimes (token level, ``C = 2``, bounds ``[0.5, 3]``): ``w = 1.5`` -> 1.5; ``w = 2.5`` ->
    truncated to 2; ``w = 4`` -> masked: 0; ``w = 0.4`` -> masked: 0; ``w = 1`` when the
    log-probs agree. Sequence level, row log-diffs ``[0.3, 0.4]`` -> ``w = e^0.7`` on both.
    Stats (detached): ``rollout/is_weight_mean`` (masked mean of the final weights over
    tokens), ``rollout/is_weight_max``, ``rollout/is_weight_min`` (over masked tokens),
    ``rollout/is_truncated_frac`` and ``rollout/is_masked_frac``: the fraction of units
    (tokens; non-empty rows at sequence level) truncated / masked.
    Compared with: verl ``verl/trainer/ppo/rollout_corr_helper.py:481-598``
    (``compute_rollout_correction_weights``: ``rollout_is`` token / sequence, truncation at
    ``rollout_is_threshold``, the same ``[-20, 20]`` clamp) and TRL
    ``trl/trainer/grpo_trainer.py:2579-2623`` (``vllm_importance_sampling_mode``
    ``token_truncate`` / ``sequence_truncate`` with ``clip_min`` None, ``token_mask`` /
    ``sequence_mask``: weight 0 outside ``[clip_min, clip_max]``). verl's masking
    (``rollout_rs``) instead removes the tokens from the response mask (they leave the
    normaliser too); verl's first version (``verl/trainer/ppo/mismatch_helper.py`` of commit 21271aab,
    ``rollout_is_mode="clip"``) zeroed the weight as here and TRL does.
    Shapes: ``[B, T]`` -> ``(weights [B, T], stats)``.
    """
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"rollout_is weights are 'token' or 'sequence', got {rollout_is!r}")
    if rollout_is_threshold is not None and not rollout_is_threshold > 0:
        raise ValueError(f"rollout_is_threshold must be > 0, got {rollout_is_threshold}")
    if rollout_is_lower is not None and rollout_is_upper is not None and not rollout_is_lower < rollout_is_upper:
        raise ValueError(f"rollout_is_lower must be < rollout_is_upper, got {rollout_is_lower}, {rollout_is_upper}")
    m, old, rollout = _prepared(old_logprobs, rollout_logprobs, mask)
    log_w = _zero_outside(old - rollout, m)
    if rollout_is == "sequence":
        log_w = paddle.sum(log_w, axis=-1, keepdim=True).expand(log_w.shape)
    raw = paddle.exp(log_w)
    kept = paddle.ones_like(m) != 0
    if rollout_is_lower is not None:
        kept = paddle.logical_and(kept, raw >= rollout_is_lower)
    if rollout_is_upper is not None:
        kept = paddle.logical_and(kept, raw <= rollout_is_upper)
    w = paddle.exp(paddle.clip(log_w, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    truncated = paddle.zeros_like(kept)
    if rollout_is_threshold is not None:
        truncated = paddle.logical_and(kept, w > rollout_is_threshold)
        w = paddle.minimum(w, paddle.full_like(w, rollout_is_threshold))
    w = _zero_outside(paddle.where(kept, w, paddle.zeros_like(w)), m)
    real = m != 0
    stats = {
        "rollout/is_weight_mean": masked_mean(w, m),
        "rollout/is_weight_max": paddle.max(w),
        "rollout/is_weight_min": _masked_min(w, real),
        "rollout/is_truncated_frac": _units_fraction(truncated, m, rollout_is),
        "rollout/is_masked_frac": _units_fraction(~kept, m, rollout_is),
    }
    return w.detach(), {k: v.detach() for k, v in stats.items()}


def _masked_min(x, real):
    """Minimum of ``x`` over ``real`` positions; 0 when there are none."""
    low = paddle.min(paddle.where(real, x, paddle.full_like(x, float("inf"))))
    return paddle.where(paddle.any(real), low, paddle.zeros_like(low))


def rollout_correction(old_logprobs, rollout_logprobs, mask, rollout_is="none", rollout_is_threshold=ROLLOUT_IS_THRESHOLD,
                       rollout_is_lower=None, rollout_is_upper=None):
    """One step's rollout correction: ``(weights or None, stats)``.

    ``stats``: :func:`rollout_mismatch_metrics` always, and with ``rollout_is`` ``"token"`` or
    ``"sequence"`` the weights of :func:`rollout_is_weights` and their stats; ``"none"``
    gives ``None`` weights (measure only, no correction).
    Shapes: ``[B, T]`` -> ``([B, T] or None, dict of detached scalars)``.
    """
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is must be one of {ROLLOUT_IS_LEVELS}, got {rollout_is!r}")
    stats = {k: v.detach() for k, v in rollout_mismatch_metrics(old_logprobs, rollout_logprobs, mask).items()}
    if rollout_is == "none":
        return None, stats
    weights, is_stats = rollout_is_weights(old_logprobs, rollout_logprobs, mask, rollout_is, rollout_is_threshold,
                                           rollout_is_lower, rollout_is_upper)
    stats.update(is_stats)
    return weights, stats
