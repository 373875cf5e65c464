"""Listwise, unpaired and rejected-only preference losses with the registry's call
signature ``fn(inputs, hp)`` (see :class:`~ppo.algos.preference_registry.PreferenceInputs`).

Lists: ``policy``, ``reference``, ``lengths``, ``scores``, ``valid`` are ``[B, K]``: K answers
per prompt, ``scores`` higher = better, ``valid`` 0 on padding answers (their values are
never read). Unpaired and rejected-only data are ``[N, 1]`` (``scores`` = 1 desirable, 0 not).
Log-probs are SUMS over answer tokens; reference log-probs are detached.
List statistics keep the pairwise names: ``rewards/chosen`` / ``rewards/rejected`` are the
mean implicit rewards of each list's best / worst scored answer, ``rewards/margins`` their
difference, ``rewards/accuracies`` the fraction of ordered pairs whose rewards agree with
the scores.
"""
import math

import paddle
import paddle.nn.functional as F

from .preference import _per_token, kto_loss

__all__ = ["rrhf_loss", "lipo_lambda_loss", "pro_loss", "kto_unpaired_loss", "bco_loss", "dro_list_loss", "npo_loss", "list_preference_stats"]

_NEG = -1e30


def _valid(x):
    if x.valid is None:
        return paddle.ones_like(x.policy, dtype="bool")
    return x.valid.astype("bool")


def _ordered_pairs(scores, valid):
    """``[B, K, K]`` bool: ``[b, i, j]`` when answer i scores above answer j, both valid."""
    both = paddle.logical_and(valid.unsqueeze(-1), valid.unsqueeze(-2))
    return paddle.logical_and(scores.unsqueeze(-1) > scores.unsqueeze(-2), both)


def _pick(values, index):
    return paddle.take_along_axis(values, index.unsqueeze(-1), axis=-1).squeeze(-1)


def list_preference_stats(rewards, scores, valid):
    """Detached ``rewards/{chosen,rejected,accuracies,margins}`` of ``[B, K]`` implicit rewards
    (see the module docstring); ``scores`` ``[B, K]``, ``valid`` ``[B, K]`` bool."""
    rewards, scores = rewards.detach(), scores.detach().astype(rewards.dtype)
    big = paddle.full_like(scores, 1e30)
    best = paddle.argmax(paddle.where(valid, scores, -big), axis=-1)
    worst = paddle.argmin(paddle.where(valid, scores, big), axis=-1)
    chosen, rejected = paddle.mean(_pick(rewards, best)), paddle.mean(_pick(rewards, worst))
    pairs = _ordered_pairs(scores, valid).astype(rewards.dtype)
    right = (rewards.unsqueeze(-1) > rewards.unsqueeze(-2)).astype(rewards.dtype)
    accuracy = paddle.sum(pairs * right) / paddle.clip(paddle.sum(pairs), min=1.0)
    return {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/accuracies": accuracy,
            "rewards/margins": chosen - rejected}


def _mean_logps(x, name):
    """``logp / length`` ``[B, K]``, 0 at invalid answers."""
    if x.lengths is None:
        raise ValueError(f"{name} needs the answer lengths")
    valid = _valid(x)
    return paddle.where(valid, _per_token(x.policy, x.lengths, name), paddle.zeros_like(x.policy))


def rrhf_loss(x, hp):
    """RRHF (Yuan et al. 2023, "Rank Responses to align Human Feedback"), no reference.

    ``p_i = logp_i / |y_i|`` (length-normalised); per prompt
    ``L_rank = sum_{i, j: score_i > score_j} max(0, p_j - p_i)``, and
    ``L = mean_b L_rank + nll`` with ``nll`` the token-mean NLL of the best answers
    (required). Rewards ``p``. Hand check: scores [2, 1, 0], p = [-1, -0.5, -2] ->
    ``L_rank = max(0, -0.5 + 1) + 0 + 0 = 0.5``.
    Source: RRHF ``train.py::RRHFTrainer.rrhf_loss`` (sum over violated pairs) and ``sft_loss``.
    """
    if x.nll is None:
        raise ValueError("rrhf needs the NLL of the best answers (inputs.nll)")
    valid = _valid(x)
    p = _mean_logps(x, "rrhf")
    pairs = _ordered_pairs(x.scores, valid)
    violation = F.relu(p.unsqueeze(-2) - p.unsqueeze(-1))  # [b, i, j] = max(0, p_j - p_i)
    rank = paddle.sum(paddle.where(pairs, violation, paddle.zeros_like(violation)), axis=[1, 2])
    loss = paddle.mean(rank) + x.nll
    stats = list_preference_stats(p, x.scores, valid)
    stats.update({"rrhf/rank_loss": paddle.mean(rank).detach(), "rrhf/nll_loss": x.nll.detach()})
    return loss, stats


def _lambda_weights(s, psi, valid):
    """LambdaLoss weights ``|G_i - G_j| |1/D_i - 1/D_j|`` ``[B, K, K]`` (no gradient):
    ``G = 2^psi - 1``, ``D = log2(1 + tau)`` with ``tau`` the rank (from 1) of ``s`` among the
    valid answers of its list, descending; ties are broken by position (earlier first)."""
    s = s.detach()
    K = s.shape[-1]
    idx = paddle.arange(K)
    earlier = (idx.unsqueeze(0) < idx.unsqueeze(1)).astype("bool").unsqueeze(0)  # [1, i, j]: j < i
    above = paddle.logical_or(s.unsqueeze(-2) > s.unsqueeze(-1),
                              paddle.logical_and(s.unsqueeze(-2) == s.unsqueeze(-1), earlier))
    above = paddle.logical_and(above, valid.unsqueeze(-2))  # [b, i, j]: valid j ranks above i
    tau = 1.0 + paddle.sum(above.astype(s.dtype), axis=-1)
    inv_d = math.log(2.0) / paddle.log(1.0 + tau)
    gain = paddle.pow(paddle.full_like(psi, 2.0), psi) - 1.0
    return (paddle.abs(gain.unsqueeze(-1) - gain.unsqueeze(-2)) * paddle.abs(inv_d.unsqueeze(-1) - inv_d.unsqueeze(-2))).detach()


def lipo_lambda_loss(x, hp):
    """LiPO-lambda (Liu et al. 2024, "LiPO: Listwise Preference Optimization through
    Learning-to-Rank"): ``s_i = beta (pi_i - ref_i)``, labels ``psi = scores``;
    ``L = mean_b -sum_{i, j: psi_i > psi_j} Delta_ij log s(s_i - s_j)`` with the lambda weight
    ``Delta_ij = |G_i - G_j| |1/D(tau_i) - 1/D(tau_j)|``, ``G = 2^psi - 1``,
    ``D(tau) = log2(1 + tau)``, ``tau`` the rank of ``s`` in its list (detached; ties by
    position, so a policy equal to its reference still gets a gradient).
    Hand check (K = 2, psi = [1, 0], s = [0, 0]): ``Delta = 1 * (1 - 1/log2 3)``,
    ``L = Delta log 2``. Rewards ``s``.
    """
    if x.reference is None:
        raise ValueError("lipo needs reference log-probs")
    valid = _valid(x)
    zeros = paddle.zeros_like(x.policy)
    s = hp["beta"] * paddle.where(valid, x.policy - x.reference.detach(), zeros)
    psi = paddle.where(valid, x.scores.astype(s.dtype), zeros)
    pairs = _ordered_pairs(psi, valid)
    terms = -_lambda_weights(s, psi, valid) * F.log_sigmoid(s.unsqueeze(-1) - s.unsqueeze(-2))
    per_list = paddle.sum(paddle.where(pairs, terms, paddle.zeros_like(terms)), axis=[1, 2])
    return paddle.mean(per_list), list_preference_stats(s, psi, valid)


def pro_loss(x, hp):
    """PRO (Song et al. 2023, "Preference Ranking Optimization"), no reference: a
    Plackett-Luce loss over the ranking's prefixes of ``r = logp / |y|``:
    ``L = mean_b sum_k -log( exp(r_k) / sum_{i: score_i <= score_k} exp(r_i) )`` over valid
    answers (the worst one's term is 0; the paper's temperature is 1). The paper adds
    ``beta_sft * NLL`` of the best answer: the trainer's ``sft_loss_ratio``. Rewards ``r``.
    Hand check (K = 2, r = [0, 0]): ``L = log 2``.
    """
    valid = _valid(x)
    r = _mean_logps(x, "pro")
    scores = x.scores.astype(r.dtype)
    below = scores.unsqueeze(-1) >= scores.unsqueeze(-2)  # [b, k, i]: score_i <= score_k
    members = paddle.logical_and(below, valid.unsqueeze(-2))
    masked = paddle.where(members, r.unsqueeze(-2).expand(members.shape), paddle.full(members.shape, _NEG, r.dtype))
    terms = paddle.logsumexp(masked, axis=-1) - r
    per_list = paddle.sum(paddle.where(valid, terms, paddle.zeros_like(terms)), axis=-1)
    return paddle.mean(per_list), list_preference_stats(r, scores, valid)


def dro_list_loss(x, hp):
    """DRO (Richemond et al. 2024, "Offline Regularised Reinforcement Learning for LLM
    Alignment") on lists whose ``scores`` are rewards: with ``rho = pi - ref`` and
    ``tau = beta``, ``L(theta, V) = 1/2 E[(r - V(x) - tau rho)^2]``. The paper learns ``V`` with
    a value network from single answers; with K answers per prompt the minimising ``V`` is the
    list mean ``V_b = mean_k (r_k - tau rho_k)`` (detached: at the minimum dL/dV = 0, so the
    policy gradient is the same), giving
    ``L = mean_b 1/(2 n_b) sum_{k valid} (r_k - tau rho_k - V_b)^2``. Rewards ``tau rho``.
    Hand check: r = [1, 0], rho = 0, tau 1 -> V = 0.5, ``L = 0.125``.
    """
    if x.reference is None:
        raise ValueError("dro needs reference log-probs")
    valid = _valid(x)
    zeros = paddle.zeros_like(x.policy)
    weights = valid.astype(x.policy.dtype)
    tau_rho = hp["beta"] * paddle.where(valid, x.policy - x.reference.detach(), zeros)
    residual = paddle.where(valid, x.scores.astype(zeros.dtype), zeros) - tau_rho
    count = paddle.clip(paddle.sum(weights, axis=-1), min=1.0)
    value = (paddle.sum(residual * weights, axis=-1) / count).detach()
    per_list = 0.5 * paddle.sum(weights * (residual - value.unsqueeze(-1)) ** 2, axis=-1) / count
    stats = list_preference_stats(tau_rho, x.scores, valid)
    stats["dro/value"] = paddle.mean(value)
    return paddle.mean(per_list), stats


def kto_unpaired_loss(x, hp):
    """KTO (Ethayarajh et al. 2024) on unpaired binary feedback ``[N, 1]``: :func:`kto_loss`
    with ``desirable = scores > 0``, z0 = ``kl_point``, ``desirable_weight`` and
    ``undesirable_weight`` (the paper keeps ``w_d n_d / (w_u n_u)`` in [1, 4/3]).
    ``rewards/accuracies`` = fraction of examples whose log-ratio sign matches the label."""
    if x.reference is None or x.kl_point is None:
        raise ValueError("kto_unpaired needs reference log-probs and the KL reference point")
    logps, ref = x.policy.reshape([-1]), x.reference.reshape([-1]).detach()
    desirable = x.scores.reshape([-1]) > 0
    loss, stats = kto_loss(logps, ref, desirable.astype("int64"), x.kl_point, beta=hp["beta"],
                           desirable_weight=hp["desirable_weight"], undesirable_weight=hp["undesirable_weight"])
    agree = ((logps - ref) > 0) == desirable
    stats["rewards/accuracies"] = agree.astype(logps.dtype).mean().detach()
    return loss, stats


def bco_loss(x, hp):
    """BCO (Jung et al. 2024, "Binary Classifier Optimization for LLM alignment") on unpaired
    binary feedback ``[N, 1]``: a logistic classifier on the implicit reward ``z = beta (pi - ref)``
    shifted by ``delta``: ``L = mean -log s(z - delta)`` (desirable) / ``-log s(-(z - delta))``
    (undesirable). ``delta`` is the detached batch mean of ``z`` (TRL's ``BCOTrainer`` keeps a
    running mean over batches instead; the underlying-distribution-matching weights are not used).
    Hand check: beta 1, log-ratios [1, -1], labels [1, 0] -> delta 0, ``L = -log s(1)``.
    ``rewards/accuracies`` = fraction with ``z > delta`` matching the label; ``bco/delta``.
    """
    if x.reference is None:
        raise ValueError("bco needs reference log-probs")
    z = hp["beta"] * (x.policy.reshape([-1]) - x.reference.reshape([-1]).detach())
    delta = paddle.mean(z).detach()
    desirable = x.scores.reshape([-1]) > 0
    losses = paddle.where(desirable, -F.log_sigmoid(z - delta), -F.log_sigmoid(delta - z))
    weights = desirable.astype(z.dtype)
    rewards = z.detach()
    chosen = paddle.sum(rewards * weights) / paddle.clip(paddle.sum(weights), min=1.0)
    rejected = paddle.sum(rewards * (1.0 - weights)) / paddle.clip(paddle.sum(1.0 - weights), min=1.0)
    stats = {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margins": chosen - rejected,
             "rewards/accuracies": ((rewards > delta) == desirable).astype(z.dtype).mean(), "bco/delta": delta}
    return paddle.mean(losses), stats


def npo_loss(x, hp):
    """NPO (Zhang et al. 2024, "Negative Preference Optimization") on rejected-only data
    ``[N, 1]``: ``L = mean -(2 / beta) log s(-beta (pi - ref))``
    ``= (2 / beta) log(1 + (pi_theta / pi_ref)^beta)``. Rewards ``beta (pi - ref)``
    (``rewards/rejected``). Hand check: ``pi = ref`` -> ``L = (2 / beta) log 2``."""
    if x.reference is None:
        raise ValueError("npo needs reference log-probs")
    beta = hp["beta"]
    ratio = x.policy.reshape([-1]) - x.reference.reshape([-1]).detach()
    loss = paddle.mean(-(2.0 / beta) * F.log_sigmoid(-beta * ratio))
    return loss, {"rewards/rejected": paddle.mean(beta * ratio).detach()}
