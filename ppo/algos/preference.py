"""Preference losses: reward-model (Bradley-Terry) losses, the DPO family and KTO.

All losses return ``(loss, stats)`` with ``loss`` a scalar and ``stats`` detached
scalars: ``rm/{loss,accuracy,margin}`` for reward models and
``rewards/{chosen,rejected,accuracies,margins}`` for the DPO family / KTO.
Sequence log-probs passed to the DPO family are SUMS over response tokens
(see ``losses.sequence_logprobs``); SimPO/ORPO (and IPO when lengths are given)
divide them by the response lengths here.
"""
import paddle
import paddle.nn.functional as F

from .masked import _float_mask, last_nonzero_index, masked_mean, zero_masked_inputs
from .setting import Setting

__all__ = [
    "pairwise_reward_loss",
    "tokenwise_pairwise_reward_loss",
    "pair_divergence_span",
    "scores_at",
    "kto_kl_reference_point",
    "kto_loss",
]

BETA = Setting("beta", float, 0.1, "Inverse temperature of the implicit reward (ORPO: the weight lambda of the "
               "odds-ratio term).", bounds=(0.0, False, None, False))
DESIRABLE_WEIGHT = Setting("desirable_weight", float, 1.0, "KTO weight of the desirable (chosen) examples.")
UNDESIRABLE_WEIGHT = Setting("undesirable_weight", float, 1.0, "KTO weight of the undesirable (rejected) examples.")
"""Three of the preference family's settings (``ppo.algos.PREFERENCE_SETTINGS`` lists them), declared
here so that :func:`kto_loss` defaults to them."""



ORPO_MAX_MEAN_LOGP = -1e-6


def log1mexp(a):
    """``log(1 - exp(a))`` for ``a <= 0``, stable over the whole range.

    Formula (Maechler 2012, "Accurately Computing log(1 - exp(-|a|))"):
    ``log(-expm1(a))`` for ``a > -ln 2`` and ``log1p(-exp(a))`` otherwise. Each branch
    only sees inputs of its own range (the other positions get a harmless -1), so
    neither the value nor the gradient picks up NaN from the branch not taken.
    ``a = 0`` gives ``-inf`` (``1 - p = 0``); callers clamp first.
    Example: ``a = -1e-8`` in float32: ``log1p(-exp(a)) = log1p(-1) = -inf`` (its
    gradient NaN), while ``log(-expm1(a)) = log(1e-8) = -18.42``.
    Shapes: any -> same.
    """
    near_zero = a > -0.6931471805599453
    dummy = paddle.full_like(a, -1.0)
    big = paddle.log(-paddle.expm1(paddle.where(near_zero, a, dummy)))
    small = paddle.log1p(-paddle.exp(paddle.where(near_zero, dummy, a)))
    return paddle.where(near_zero, big, small)


def _rm_stats(loss, better, worse):
    return {
        "rm/loss": loss.detach(),
        "rm/accuracy": paddle.mean((better > worse).astype(better.dtype)).detach(),
        "rm/margin": paddle.mean(better - worse).detach(),
    }


def pairwise_reward_loss(better_scores, worse_scores, margin=None, regularization=0.0):
    """Sequence-wise Bradley-Terry reward-model loss.

    Formula: ``L = mean_b[-log sigmoid(s+_b - s-_b - m_b)] + reg * (mean(s+^2) + mean(s-^2))``
    (``m`` = ``margin``, a number or ``[B]`` tensor, default 0; Llama-2 margin loss).
    Stats: ``rm/loss``, ``rm/accuracy = mean[s+ > s-]``, ``rm/margin = mean(s+ - s-)``.
    Shapes: ``better_scores``, ``worse_scores`` ``[B]`` (end-of-sequence scores).
    Source: Ouyang et al. 2022 (InstructGPT); safe-rlhf / PaddleNLP ``RewardTrainer``
    (``loss_type == 'sequence-wise'``, regularization); TRL ``RewardTrainer`` (margin).
    """
    diff = better_scores - worse_scores
    if margin is not None:
        diff = diff - margin
    loss = -paddle.mean(F.log_sigmoid(diff))
    if regularization:
        loss = loss + regularization * (paddle.mean(better_scores**2) + paddle.mean(worse_scores**2))
    return loss, _rm_stats(loss, better_scores, worse_scores)


def tokenwise_pairwise_reward_loss(
    better_token_scores,
    worse_token_scores,
    better_input_ids,
    worse_input_ids,
    better_mask,
    worse_mask,
    regularization=0.0,
):
    """Token-wise reward-model loss of safe-rlhf (``loss_type == 'token-wise'``).

    For pair ``b``: ``e_b = max(last index of better_mask_b, last index of worse_mask_b)``,
    ``d_b`` = first index where the two ``input_ids`` rows differ; over the slice
    ``S_b = [d_b, e_b]``:
    ``L_b = mean_{t in S_b} -log sigmoid(s+_bt - s-_bt) + reg * (mean_{S_b} s-^2 + mean_{S_b} s+^2)``;
    ``L = mean_b L_b``. Token scores inside ``S_b`` are used as given, even past the
    shorter sequence's end (as safe-rlhf does); scores outside ``S_b`` are ignored.
    Identical pairs are a data error (safe-rlhf asserts); here, without ``.item()``,
    their divergence index is taken as 0.
    Stats use the end scores ``s(e)`` at each sequence's own last mask index:
    ``rm/loss``, ``rm/accuracy = mean[s+_end > s-_end]``, ``rm/margin = mean(s+_end - s-_end)``.
    Shapes: token scores, input ids and masks ``[B, L]`` (``mask`` = attention mask).
    Source: safe-rlhf ``safe_rlhf/values/reward/trainer.py::RewardTrainer.loss``;
    PaddleNLP ``llm/alignment/rm`` reward trainer.
    """
    span, better_end, worse_end = pair_divergence_span(better_input_ids, worse_input_ids, better_mask, worse_mask)
    span = span.astype(better_token_scores.dtype)
    better, worse = zero_masked_inputs(span, better_token_scores, worse_token_scores)
    per_pair = masked_mean(-F.log_sigmoid(better - worse), span, axis=-1)
    if regularization:
        per_pair = per_pair + regularization * (masked_mean(worse**2, span, axis=-1) + masked_mean(better**2, span, axis=-1))
    loss = paddle.mean(per_pair)
    return loss, _rm_stats(loss, scores_at(better_token_scores, better_end), scores_at(worse_token_scores, worse_end))


def pair_divergence_span(better_input_ids, worse_input_ids, better_mask, worse_mask):
    """The tokens a token-wise pair loss covers (safe-rlhf's reward and cost trainers).

    For pair ``b``: ``e_b = max(last index of better_mask_b, last index of worse_mask_b)``,
    ``d_b`` = first index where the two ``input_ids`` rows differ (0 for identical rows);
    the span is ``[d_b, e_b]``.
    Returns ``(span [B, L] bool, better_end [B], worse_end [B])`` (int64 last mask indices).
    Shapes: ids and masks ``[B, L]``.
    """
    better_end = last_nonzero_index(better_mask)
    worse_end = last_nonzero_index(worse_mask)
    end = paddle.maximum(better_end, worse_end).unsqueeze(-1)
    differ = (better_input_ids != worse_input_ids).astype("int32")
    diverge = paddle.argmax(differ, axis=-1).astype("int64").unsqueeze(-1)  # first True
    pos = paddle.arange(better_input_ids.shape[-1], dtype="int64").unsqueeze(0).expand(better_input_ids.shape)
    return paddle.logical_and(pos >= diverge, pos <= end), better_end, worse_end


def scores_at(token_scores, index):
    """``token_scores[b, index_b]`` (negative indices clipped to 0). Shapes: ``[B, L]``, ``[B]`` -> ``[B]``."""
    return paddle.take_along_axis(token_scores, paddle.clip(index, min=0).unsqueeze(-1), axis=-1).squeeze(-1)


def _dpo_stats(chosen_rewards, rejected_rewards):
    chosen_rewards = chosen_rewards.detach()
    rejected_rewards = rejected_rewards.detach()
    return {
        "rewards/chosen": paddle.mean(chosen_rewards),
        "rewards/rejected": paddle.mean(rejected_rewards),
        "rewards/accuracies": paddle.mean((chosen_rewards > rejected_rewards).astype(chosen_rewards.dtype)),
        "rewards/margins": paddle.mean(chosen_rewards - rejected_rewards),
    }


def _per_token(logps, lengths, name):
    if lengths is None:
        raise ValueError(f"{name} needs chosen_lengths and rejected_lengths (log-probs are sums)")
    if not isinstance(lengths, paddle.Tensor):
        lengths = paddle.to_tensor(lengths)
    return logps / paddle.clip(lengths.astype(logps.dtype), min=1.0)


def _smoothed_sigmoid_loss(z, label_smoothing):
    loss = -F.log_sigmoid(z)
    if label_smoothing:
        loss = loss * (1.0 - label_smoothing) - F.log_sigmoid(-z) * label_smoothing
    return loss


def kto_kl_reference_point(policy_kl_logps, ref_kl_logps):
    """KTO reference point ``z0 = max(0, mean(policy_kl_logps - ref_kl_logps))``, detached.

    Computed on mismatched (prompt, completion) pairs; average it across ranks
    before passing it to :func:`kto_loss` if needed. Shapes: ``[B]`` -> scalar.
    Source: TRL ``KTOTrainer.kto_loss``.
    """
    return paddle.clip(paddle.mean(policy_kl_logps - ref_kl_logps), min=0.0).detach()


def kto_loss(
    policy_logps,
    ref_logps,
    is_desirable,
    kl_ref_point,
    beta=BETA.default,
    desirable_weight=DESIRABLE_WEIGHT.default,
    undesirable_weight=UNDESIRABLE_WEIGHT.default,
):
    """Kahneman-Tversky Optimisation loss on unpaired examples.

    Formula (``r = logp - ref``, ``z0 = max(0, kl_ref_point)``, detached):
    desirable: ``L = w_d * (1 - sigmoid(beta * (r - z0)))``;
    undesirable: ``L = w_u * (1 - sigmoid(beta * (z0 - r)))``; loss = mean over the batch.
    Stats: ``rewards/chosen`` / ``rewards/rejected`` = mean ``beta * r`` over the
    desirable / undesirable examples (0 if none), ``rewards/margins`` their
    difference, ``kto/kl`` = ``z0``.
    Shapes: ``policy_logps``, ``ref_logps`` ``[B]`` (summed log-probs),
    ``is_desirable`` ``[B]`` bool/int, ``kl_ref_point`` scalar tensor or number
    (e.g. from :func:`kto_kl_reference_point`).
    Source: Ethayarajh et al. 2024 (KTO); TRL ``KTOTrainer.kto_loss``.
    """
    dtype = policy_logps.dtype
    if isinstance(kl_ref_point, paddle.Tensor):
        z0 = paddle.clip(kl_ref_point.detach().astype(dtype), min=0.0)
    else:
        z0 = paddle.full([], max(float(kl_ref_point), 0.0), dtype=dtype)
    logratio = policy_logps - ref_logps.detach()
    desirable = _float_mask(is_desirable, policy_logps)
    d_loss = desirable_weight * (1.0 - F.sigmoid(beta * (logratio - z0)))
    u_loss = undesirable_weight * (1.0 - F.sigmoid(beta * (z0 - logratio)))
    losses = paddle.where(desirable != 0, d_loss, u_loss)
    loss = paddle.mean(losses)
    rewards = (beta * logratio).detach()
    chosen = masked_mean(rewards, desirable)
    rejected = masked_mean(rewards, 1.0 - desirable)
    stats = {
        "rewards/chosen": chosen,
        "rewards/rejected": rejected,
        "rewards/margins": chosen - rejected,
        "kto/kl": z0.detach(),
    }
    return loss, stats
