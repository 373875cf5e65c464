"""Policy, value, KL, entropy and SFT losses.

Every loss returns ``(loss, stats)``: ``loss`` a scalar tensor with gradient,
``stats`` a dict of detached scalar tensors with TRL/verl metric names. Token losses
are reduced by :func:`aggregate_loss` according to ``loss_agg_mode``:

* ``token-mean``          ``sum(loss * mask) / num_tokens`` (``num_tokens`` defaults to
                          ``sum(mask)`` of this micro-batch; pass the global count of real
                          tokens across gradient accumulation / ranks to normalise by it);
* ``seq-mean-token-sum``  mean over non-empty sequences of the token sum;
* ``seq-mean-token-mean`` mean over non-empty sequences of the token mean;
* ``seq-mean-token-sum-norm`` (Dr.GRPO) token sum divided by a constant length
                          ``loss_scale_factor``, averaged over sequences.
"""
import paddle
import paddle.nn.functional as F

from .kl import kl_penalty
from .masked import _float_mask, _zero_outside, masked_mean, masked_sum, masked_var, zero_masked_inputs
from .setting import Setting

__all__ = [
    "LOSS_AGG_MODES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "entropy_bonus_loss",
    "entropy_bonus_from_token_entropy",
    "aggregate_loss",
    "ppo_policy_loss",
    "ppo_clip_token_losses",
    "ratio_stats",
    "value_loss",
    "kl_loss",
    "entropy_from_logits",
    "token_logprobs",
    "sequence_logprobs",
    "sft_loss",
]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
DUAL_CLIP = Setting("dual_clip", float, None, "Dual-clip constant (>1) for negative advantages.",
                    bounds=(1.0, False, None, False))
IMPORTANCE_SAMPLING_LEVEL = Setting("importance_sampling_level", str, "token",
                                    "token (PPO) | sequence (GSPO: sequence-level ratio, geometric mean).",
                                    choices=IMPORTANCE_SAMPLING_LEVELS)
"""The two settings of :func:`ppo_clip_token_losses` beyond the clip ratios, declared once: the
policy-loss registry's entries list them (``ppo_clip`` both, ``gspo`` ``dual_clip``), the argument
fields and start-up checks come from them, and the function's own guard is theirs."""
_POSITIVE = (0.0, False, None, False)
CLIP_RANGE_RATIO = Setting("clip_range_ratio", float, 0.2, "PPO ratio clip.", bounds=_POSITIVE)
CLIP_RANGE_RATIO_LOW = Setting("clip_range_ratio_low", float, None, "Lower ratio clip (default clip_range_ratio).",
                               bounds=_POSITIVE)
CLIP_RANGE_RATIO_HIGH = Setting("clip_range_ratio_high", float, None, "Upper ratio clip (default clip_range_ratio).",
                                bounds=_POSITIVE)
"""The clip ratios (PaddleNLP's ``clip_range_ratio``); the functions below default to them."""


def aggregate_loss(loss, mask, loss_agg_mode="token-mean", num_tokens=None, num_seqs=None, loss_scale_factor=None):
    """Reduce a per-token loss ``[B, T]`` to a scalar.

    Formula (``m`` = mask, masked-out entries zeroed first):
    ``token-mean``: ``sum(loss * m) / N`` with ``N = num_tokens`` if given (python
    number or tensor: the real-token count of the whole optimisation step, so that
    summing micro-batch losses equals the full-batch loss) else ``sum(m)``;
    ``seq-mean-token-sum``: ``sum_b [n_b > 0] * sum_t loss_bt m_bt / S``;
    ``seq-mean-token-mean``: ``sum_b [n_b > 0] * (sum_t loss_bt m_bt / n_b) / S``,
    where ``n_b = sum_t m_bt`` and ``S = num_seqs`` if given else the number of
    non-empty rows (rows with an empty mask are excluded);
    ``seq-mean-token-sum-norm``: ``sum_b sum_t loss_bt m_bt / (S * L)`` with the
    constant ``L = loss_scale_factor`` (Dr.GRPO's ``MAX_TOKENS``, e.g. the longest
    allowed response), so the per-token weight does not depend on response lengths.
    ``num_tokens`` only applies to ``token-mean`` and ``num_seqs`` only to the
    ``seq-mean-*`` modes; ``loss_scale_factor`` is required by (and only used in)
    ``seq-mean-token-sum-norm``. Unknown modes raise ``ValueError``.
    Example (``seq-mean-token-sum-norm``, ``L = 4``): losses ``[[1, 2, 0], [3, 0, 0]]``,
    mask ``[[1, 1, 0], [1, 0, 0]]`` -> ``(3 + 3) / (2 * 4) = 0.75``.
    Shapes: ``loss``, ``mask`` ``[B, T]`` -> scalar.
    Source: verl ``core_algos.agg_loss`` (``seq-mean-token-sum-norm`` divides by
    ``loss_scale_factor``); Liu et al. 2025 (Dr.GRPO); OpenRLHF
    ``tests/test_loss_aggregation.py``.
    """
    m = _float_mask(mask, loss)
    if loss_agg_mode == "token-mean":
        total = masked_sum(loss, m)
        denom = paddle.sum(m) if num_tokens is None else num_tokens
        if isinstance(denom, paddle.Tensor):
            denom = denom.astype(loss.dtype)
            return total / paddle.clip(denom, min=1e-8)
        return total / max(float(denom), 1e-8)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        seq_sum = masked_sum(loss, m, axis=-1)
        n_b = paddle.sum(m, axis=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_loss = seq_sum / paddle.clip(n_b, min=1e-8)
        elif loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None or not loss_scale_factor > 0:
                raise ValueError(
                    f"loss_agg_mode 'seq-mean-token-sum-norm' needs a positive loss_scale_factor, got {loss_scale_factor!r}"
                )
            seq_loss = seq_sum / float(loss_scale_factor)
        else:
            seq_loss = seq_sum
        nonempty = (n_b > 0).astype(loss.dtype)
        total = paddle.sum(seq_loss * nonempty)
        denom = paddle.sum(nonempty) if num_seqs is None else num_seqs
        if isinstance(denom, paddle.Tensor):
            denom = denom.astype(loss.dtype)
            return total / paddle.clip(denom, min=1e-8)
        return total / max(float(denom), 1e-8)
    raise ValueError(f"Unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {list(LOSS_AGG_MODES)}")


def _detached(x):
    return x.detach()


def _policy_log_ratio(logprobs, old_logprobs, m, importance_sampling_level):
    """Log importance ratio `[B, T]` per token: `logp - old` clamped to [-20, 20], or (GSPO,
    "sequence") each row's masked mean log-ratio, clamped to at most 10, carried by the
    gradient of `logp - sg(logp)` (see `ppo_policy_loss`)."""
    if importance_sampling_level == "sequence":
        seq_log_ratio = masked_mean(logprobs - old_logprobs, m, axis=-1).detach().unsqueeze(-1)
        return paddle.clip(logprobs - logprobs.detach() + seq_log_ratio, max=10.0)
    return paddle.clip(logprobs - old_logprobs, min=-20.0, max=20.0)


def _dual_clipped(clipped, advantages, dual_clip, m):
    """Token losses `[B, T]` with the dual clip `min(L, -c * A)` where `A < 0` (none when
    `dual_clip` is None) and the masked fraction of tokens it bounds."""
    if dual_clip is None:
        return clipped, paddle.zeros([], dtype=clipped.dtype)
    pg3 = -advantages * dual_clip
    neg = advantages < 0
    token_loss = paddle.where(neg, paddle.minimum(clipped, pg3), clipped)
    return token_loss, masked_mean(paddle.logical_and(neg, clipped > pg3).astype(clipped.dtype), m)


def ppo_clip_token_losses(
    logprobs, old_logprobs, advantages, mask, clip_range_ratio=CLIP_RANGE_RATIO.default, clip_range_ratio_low=None,
    clip_range_ratio_high=None, dual_clip=None, importance_sampling_level=IMPORTANCE_SAMPLING_LEVEL.default,
):
    """Per-token clipped PPO surrogate ``[B, T]`` and its stats, before aggregation.

    The token part of :func:`ppo_policy_loss` (its docstring has the formulas): returns
    ``(token_loss, stats)`` with ``token_loss`` ``[B, T]`` (with gradient; at masked-out
    positions the finite loss of zero inputs, whatever junk was there) and ``stats`` holding every
    stat of :func:`ppo_policy_loss` except ``loss/policy_avg``. The policy-loss registry
    (``ppo.algos.policy_registry``, entries ``ppo_clip`` and ``gspo``) aggregates it the
    same way, so both give the same numbers to the last bit.
    Shapes: ``logprobs``, ``old_logprobs``, ``advantages``, ``mask`` ``[B, T]``.
    """
    low = clip_range_ratio if clip_range_ratio_low is None else clip_range_ratio_low
    high = clip_range_ratio if clip_range_ratio_high is None else clip_range_ratio_high
    DUAL_CLIP.checked(dual_clip)
    IMPORTANCE_SAMPLING_LEVEL.checked(importance_sampling_level)
    m = _float_mask(mask, logprobs)
    logprobs, old_logprobs, advantages = zero_masked_inputs(
        m, logprobs, old_logprobs.detach().astype(logprobs.dtype), advantages.detach().astype(logprobs.dtype))
    ratio = paddle.exp(_policy_log_ratio(logprobs, old_logprobs, m, importance_sampling_level))
    pg1 = -advantages * ratio
    pg2 = -advantages * paddle.clip(ratio, min=1.0 - low, max=1.0 + high)
    clipped = paddle.maximum(pg1, pg2)
    clipfrac = masked_mean((pg2 > pg1).astype(logprobs.dtype), m)
    token_loss, dual_frac = _dual_clipped(clipped, advantages, dual_clip, m)
    return token_loss, {
        **ratio_stats(logprobs, old_logprobs, ratio, m),
        "policy/clipfrac_avg": _detached(clipfrac),
        "policy/dual_clipfrac_avg": _detached(dual_frac),
    }


def ratio_stats(logprobs, old_logprobs, ratio, mask):
    """The stats every policy loss reports about its ratio: ``policy/approxkl_avg``
    ``= 0.5 * masked_mean((logp - old)^2)`` (the k2 estimator of PaddleNLP/TRL PPO logging)
    and ``val/ratio`` / ``val/ratio_var``, the masked mean / unbiased variance of ``ratio``
    (``[B, T]``: the token ratio, or a sequence ratio repeated on the row's tokens); all
    detached scalars. ``mask`` a float mask of the dtype of ``logprobs``."""
    diff = _zero_outside(logprobs - old_logprobs, mask)
    return {
        "policy/approxkl_avg": _detached(0.5 * masked_mean(diff * diff, mask)),
        "val/ratio": _detached(masked_mean(ratio, mask)),
        "val/ratio_var": _detached(masked_var(ratio, mask)),
    }


def ppo_policy_loss(
    logprobs, old_logprobs, advantages, mask, clip_range_ratio=CLIP_RANGE_RATIO.default, clip_range_ratio_low=None,
    clip_range_ratio_high=None, dual_clip=None, loss_agg_mode="token-mean", num_tokens=None, num_seqs=None,
    importance_sampling_level=IMPORTANCE_SAMPLING_LEVEL.default,
    loss_scale_factor=None,
):
    """Clipped PPO surrogate loss with optional asymmetric (DAPO) and dual clip.

    Formula (``r = exp(logp - old)``, log-ratio clamped to [-20, 20] for safety,
    ``eps_l``/``eps_h`` default to ``clip_range_ratio``):
    ``L1 = -A * r``, ``L2 = -A * clip(r, 1 - eps_l, 1 + eps_h)``, ``L = max(L1, L2)``;
    with ``dual_clip = c > 1`` (Ye et al. 2020, "Mastering Complex Control in MOBA
    Games"; verl ``compute_policy_loss``): for ``A < 0``, ``L = min(L, -c * A)``.
    The token losses (:func:`ppo_clip_token_losses`) are reduced with :func:`aggregate_loss`.
    ``importance_sampling_level="sequence"`` (GSPO, Zheng et al. 2025): every token of
    row ``b`` uses the sequence ratio ``s_b = exp(mean_t (logp - old))`` (geometric
    mean of the token ratios over the masked tokens) as its value, with the gradient
    of ``s_b * (logp_t - sg(logp_t))`` (GSPO-token form: ``d s / d logp_t = s_b``);
    the log of ``s_b`` is clamped to at most 10, and the clip bounds apply to ``s_b``.
    Example: log-ratios ``[0.2, -0.1, 0.5]`` with the last token masked give
    ``s = exp(0.05)`` on both real tokens. verl ``compute_policy_loss_gspo`` forces
    ``seq-mean-token-mean`` (GSPO's paper's); the registry entry ``gspo`` defaults to it, here
    ``loss_agg_mode`` is taken as given.
    Stats: ``loss/policy_avg``; ``policy/approxkl_avg = 0.5 * masked_mean((logp - old)^2)``
    (the k2 estimator used by PaddleNLP/TRL PPO logging); ``policy/clipfrac_avg``
    = fraction of tokens with ``L2 > L1``; ``policy/dual_clipfrac_avg`` = fraction of
    tokens with ``A < 0`` and ``max(L1, L2) > -c * A`` (0 when disabled); ``val/ratio``
    and ``val/ratio_var`` the masked mean / unbiased variance of ``r``.
    Shapes: ``logprobs``, ``old_logprobs``, ``advantages``, ``mask`` ``[B, T]``.
    Source: Schulman et al. 2017 (PPO); verl ``core_algos.compute_policy_loss``;
    TRL ``PPOTrainer``; DAPO (Yu et al. 2025) for the clip-higher bounds.
    """
    token_loss, token_stats = ppo_clip_token_losses(
        logprobs, old_logprobs, advantages, mask, clip_range_ratio, clip_range_ratio_low, clip_range_ratio_high,
        dual_clip, importance_sampling_level,
    )
    loss = aggregate_loss(token_loss, _float_mask(mask, logprobs), loss_agg_mode, num_tokens=num_tokens,
                          num_seqs=num_seqs, loss_scale_factor=loss_scale_factor)
    return loss, {"loss/policy_avg": _detached(loss), **token_stats}


def value_loss(
    values,
    old_values,
    returns,
    mask,
    clip_range_value=None,
    loss_agg_mode="token-mean",
    num_tokens=None,
    num_seqs=None,
    loss_scale_factor=None,
):
    """Clipped value loss.

    Formula: ``v_clip = clip(v, old - c, old + c)`` (equal to ``old + clip(v - old, -c, c)``
    in exact arithmetic, and bit-equal to ``v`` whenever ``v`` is inside the band, so
    rounding never counts as clipping: ``v=0.29, old=-0.27, c=5`` reports 0);
    ``L = 0.5 * max((v - R)^2, (v_clip - R)^2)`` per token (``c = clip_range_value``;
    ``None`` disables clipping: ``L = 0.5 * (v - R)^2``), reduced with
    :func:`aggregate_loss`.
    Stats: ``loss/value_avg``; the fraction of tokens where the clipped term is
    strictly larger (only possible when ``v`` was actually clipped),
    reported as ``val/clipfrac_avg`` (TRL name) and as
    ``value/clipfrac_avg`` (same value).
    Shapes: all ``[B, T]``.
    Source: OpenAI baselines ppo2; TRL ``PPOTrainer`` (``vf_loss``); verl
    ``core_algos.compute_value_loss``; PaddleNLP ``critic_loss_fn``.
    """
    m = _float_mask(mask, values)
    values, old_values, returns = zero_masked_inputs(
        m, values, old_values.detach().astype(values.dtype), returns.detach().astype(values.dtype))
    vf1 = (values - returns) ** 2
    if clip_range_value is None:
        token_loss = vf1
        clipfrac = paddle.zeros([], dtype=values.dtype)
    else:
        v_clip = paddle.minimum(paddle.maximum(values, old_values - clip_range_value), old_values + clip_range_value)
        vf2 = (v_clip - returns) ** 2
        token_loss = paddle.maximum(vf1, vf2)
        clipfrac = masked_mean((vf2 > vf1).astype(values.dtype), m)
    loss = 0.5 * aggregate_loss(token_loss, m, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                                loss_scale_factor=loss_scale_factor)
    stats = {
        "loss/value_avg": _detached(loss),
        "val/clipfrac_avg": _detached(clipfrac),
        "value/clipfrac_avg": _detached(clipfrac),
    }
    return loss, stats


def kl_loss(logprobs, ref_logprobs, mask, kind="k3", loss_agg_mode="token-mean", num_tokens=None, num_seqs=None,
            clamp=None, loss_scale_factor=None):
    """KL-to-reference term placed in the loss (GRPO style, instead of reward shaping).

    Formula: ``L = aggregate(kl_penalty(logp, ref, kind, clamp), mask)`` (k3 by default,
    as in GRPO; ``clamp`` as in :func:`kl_penalty`); the caller multiplies by its
    coefficient.
    Stats: ``loss/kl``. Shapes: ``[B, T]`` -> scalar.
    Source: Shao et al. 2024 (GRPO eq. 4); verl ``use_kl_loss`` / ``kl_loss_type``.
    """
    m = _float_mask(mask, logprobs)
    logprobs, ref_logprobs = zero_masked_inputs(m, logprobs, ref_logprobs.detach().astype(logprobs.dtype))
    kl = kl_penalty(logprobs, ref_logprobs, kind, clamp=clamp)
    loss = aggregate_loss(kl, m, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                          loss_scale_factor=loss_scale_factor)
    return loss, {"loss/kl": _detached(loss)}


def entropy_from_logits(logits):
    """Entropy of the categorical distribution given by ``logits`` (last axis).

    Formula: ``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` (numerically stable,
    no explicit log of probabilities). Shapes: ``[B, T, V]`` -> ``[B, T]``.
    Source: verl ``verl/utils/torch_functional.py::entropy_from_logits``.
    """
    probs = F.softmax(logits, axis=-1)
    return paddle.logsumexp(logits, axis=-1) - paddle.sum(probs * logits, axis=-1)


def entropy_bonus_loss(logits, mask, temperature=1.0, loss_agg_mode="token-mean", num_tokens=None, num_seqs=None,
                       loss_scale_factor=None):
    """Aggregated policy entropy, with gradient, for an entropy bonus.

    Formula: ``H = aggregate(entropy_from_logits(z / temperature), mask)``; the caller
    subtracts ``entropy_coeff * H`` from its loss (maximising entropy).
    Stats: ``actor/entropy`` (verl name; the aggregated value).
    Shapes: ``logits`` ``[B, T, V]``, ``mask`` ``[B, T]`` -> scalar.
    Source: verl ``dp_actor`` (``policy_loss = pg_loss - entropy_coeff * entropy_loss``).
    """
    z = logits if temperature == 1.0 else logits / temperature
    return entropy_bonus_from_token_entropy(entropy_from_logits(z), mask, loss_agg_mode, num_tokens=num_tokens,
                                            num_seqs=num_seqs, loss_scale_factor=loss_scale_factor)


def entropy_bonus_from_token_entropy(token_entropy, mask, loss_agg_mode="token-mean", num_tokens=None, num_seqs=None,
                                     loss_scale_factor=None):
    """:func:`entropy_bonus_loss` from per-token entropies ``[B, T]`` (e.g. the chunked
    LM-head path, ``token_logprobs_from_hidden(..., with_entropy=True)``) -> scalar, stats."""
    (token_entropy,) = zero_masked_inputs(mask, token_entropy)
    loss = aggregate_loss(token_entropy, mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                          loss_scale_factor=loss_scale_factor)
    return loss, {"actor/entropy": _detached(loss)}


def token_logprobs(logits, labels, temperature=1.0):
    """Log-probability of each label token under ``softmax(logits / temperature)``.

    Formula: ``logp[b, t] = z[b, t, y] - logsumexp_v z[b, t, v]`` with
    ``z = logits / temperature`` and ``y = labels[b, t]`` (same as gathering
    ``log_softmax``, without materialising it). Labels ``< 0`` (e.g. ``-100``) give 0.
    Logits and labels must already be aligned (the caller shifts by one).
    Shapes: ``logits`` ``[B, T, V]``, ``labels`` ``[B, T]`` -> ``[B, T]``.
    Source: TRL / verl ``logprobs_from_logits``; the temperature must match sampling
    (TRL ``PPOTrainer`` divides logits by the generation temperature).
    """
    z = logits if temperature == 1.0 else logits / temperature
    valid = labels >= 0
    safe = paddle.where(valid, labels, paddle.zeros_like(labels)).astype("int64")
    picked = paddle.take_along_axis(z, safe.unsqueeze(-1), axis=-1).squeeze(-1)
    logp = picked - paddle.logsumexp(z, axis=-1)
    return paddle.where(valid, logp, paddle.zeros_like(logp))


def sequence_logprobs(logits, labels, mask, temperature=1.0, average=False):
    """Sum (or mean, ``average=True``) of label log-probs over masked tokens.

    Formula: ``S_b = sum_t mask_bt * token_logprobs(logits, labels)_bt``; with
    ``average=True`` divided by ``sum_t mask_bt``.
    Shapes: ``logits`` ``[B, T, V]``, ``labels``/``mask`` ``[B, T]`` -> ``[B]``.
    Source: TRL ``DPOTrainer.get_batch_logps``.
    """
    lp = token_logprobs(logits, labels, temperature=temperature)
    if average:
        return masked_mean(lp, mask, axis=-1)
    return masked_sum(lp, mask, axis=-1)


def sft_loss(logits, labels, ignore_index=-100):
    """Masked token-mean negative log-likelihood.

    Formula: ``L = sum_{t: y_t != ignore} -log softmax(z_t)[y_t] / N`` with
    ``N = #{t: y_t != ignore}`` (computed by hand: ``F.cross_entropy`` with
    ``reduction='mean'`` and ``ignore_index`` divides by all tokens on this Paddle).
    Logits and labels must already be aligned (the caller shifts by one).
    Shapes: ``logits`` ``[B, T, V]``, ``labels`` ``[B, T]`` -> ``(loss, num_tokens)``,
    both scalars (``num_tokens`` detached, in the logits dtype) so the caller can
    renormalise over gradient accumulation.
    Source: PaddleNLP / HF causal-LM loss.
    """
    V = logits.shape[-1]
    flat_labels = labels.reshape([-1]).astype("int64")
    per_token = F.cross_entropy(
        logits.reshape([-1, V]), flat_labels, ignore_index=ignore_index, reduction="none"
    ).reshape([-1])
    valid = (flat_labels != ignore_index).astype(logits.dtype)
    per_token = _zero_outside(per_token, valid)
    num_tokens = paddle.sum(valid)
    loss = paddle.sum(per_token) / paddle.clip(num_tokens, min=1.0)
    return loss, num_tokens.detach()
