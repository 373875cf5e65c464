"""Pairwise preference losses with the registry's call signature ``fn(inputs, hp)``.

``inputs`` is a :class:`~ppo.algos.preference_registry.PreferenceInputs` whose tensors are
``[B, 2]`` (column 0 the chosen answer, column 1 the rejected one); ``policy`` and
``reference`` hold SUMMED answer log-probs, ``lengths`` the answer token counts. ``hp`` is a
dict of hyperparameters (missing keys take their registry defaults). Every function returns
``(mean loss over pairs, stats)`` with detached ``rewards/{chosen,rejected,accuracies,margins}``.
Reference log-probs are detached.
"""
import paddle
import paddle.nn.functional as F

from .preference import ORPO_MAX_MEAN_LOGP, _dpo_stats, _per_token, _smoothed_sigmoid_loss, kto_loss, log1mexp

__all__ = [
    "dpo_sigmoid_loss",
    "ipo_loss",
    "hinge_loss",
    "simpo_loss",
    "orpo_loss",
    "cpo_loss",
    "rdpo_loss",
    "kto_pair_loss",
    "sppo_hard_loss",
    "nca_pair_loss",
    "dpop_loss",
    "kto_paired_loss",
]


def _columns(t):
    return t[:, 0], t[:, 1]


def _pair_logps(x, hp, name, allow_reference_free):
    """``(pi_c, pi_r, ref_c, ref_r)`` ``[B]`` each; the reference is 0 under ``reference_free``."""
    pc, pr = _columns(x.policy)
    if allow_reference_free and hp["reference_free"]:
        return pc, pr, paddle.zeros_like(pc), paddle.zeros_like(pr)
    if x.reference is None:
        hint = " unless reference_free=True" if allow_reference_free else ""
        raise ValueError(f"loss_type {name!r} needs reference log-probs{hint}")
    rc, rr = _columns(x.reference.detach())
    return pc, pr, rc, rr


def _mean_logps(x, name):
    """Length-normalised log-probs ``a = logp / length`` of both sides ``[B]`` each."""
    if x.lengths is None:
        raise ValueError(f"{name} needs chosen_lengths and rejected_lengths (log-probs are sums)")
    lc, lr = _columns(x.lengths)
    pc, pr = _columns(x.policy)
    return _per_token(pc, lc, name), _per_token(pr, lr, name)


def dpo_sigmoid_loss(x, hp):
    """DPO (Rafailov et al. 2023); cDPO with ``label_smoothing = e``.

    ``h = (pi_c - pi_r) - (ref_c - ref_r)``; ``L = -(1 - e) log s(beta h) - e log s(-beta h)``.
    Rewards ``beta (pi - ref)``. Source: TRL ``DPOTrainer.dpo_loss`` (``sigmoid``).
    """
    pc, pr, rc, rr = _pair_logps(x, hp, "sigmoid", True)
    beta = hp["beta"]
    losses = _smoothed_sigmoid_loss(beta * ((pc - pr) - (rc - rr)), hp["label_smoothing"])
    return paddle.mean(losses), _dpo_stats(beta * (pc - rc), beta * (pr - rr))


def ipo_loss(x, hp):
    """IPO (Azar et al. 2023): ``L = (h - 1 / (2 beta))^2``.

    When ``lengths`` are given the four log-probs are first divided by them (TRL averages
    log-probs for IPO). Rewards ``beta (pi - ref)`` of the (averaged) log-probs.
    """
    pc, pr, rc, rr = _pair_logps(x, hp, "ipo", True)
    if x.lengths is not None:
        lc, lr = _columns(x.lengths)
        pc, rc = _per_token(pc, lc, "ipo"), _per_token(rc, lc, "ipo")
        pr, rr = _per_token(pr, lr, "ipo"), _per_token(rr, lr, "ipo")
    beta = hp["beta"]
    losses = ((pc - pr) - (rc - rr) - 1.0 / (2.0 * beta)) ** 2
    return paddle.mean(losses), _dpo_stats(beta * (pc - rc), beta * (pr - rr))


def hinge_loss(x, hp):
    """SLiC hinge (Zhao et al. 2023): ``L = relu(1 - beta h)``; rewards ``beta (pi - ref)``."""
    pc, pr, rc, rr = _pair_logps(x, hp, "hinge", True)
    beta = hp["beta"]
    losses = F.relu(1.0 - beta * ((pc - pr) - (rc - rr)))
    return paddle.mean(losses), _dpo_stats(beta * (pc - rc), beta * (pr - rr))


def simpo_loss(x, hp):
    """SimPO (Meng et al. 2024), no reference; ``a = logp / length``:
    ``L = -(1-e) log s(beta (a_c - a_r) - gamma) - e log s(-(...))``, ``gamma = simpo_gamma``.
    Rewards ``beta a``. Source: TRL ``CPOTrainer.cpo_loss`` (``simpo``)."""
    ac, ar = _mean_logps(x, "simpo")
    beta = hp["beta"]
    z = beta * (ac - ar) - hp["simpo_gamma"]
    return paddle.mean(_smoothed_sigmoid_loss(z, hp["label_smoothing"])), _dpo_stats(beta * ac, beta * ar)


def orpo_loss(x, hp):
    """ORPO (Hong et al. 2024), no reference; ``a = logp / length``:
    ``log_odds = (a_c - a_r) - (log(1 - exp(a_c)) - log(1 - exp(a_r)))``,
    ``L = -lambda mean log s(log_odds) + nll`` (``nll``: the chosen answers' token-mean NLL,
    when given). ``lambda = hp['orpo_lambda']`` or, if None, ``beta`` (TRL's
    ``ORPOConfig.beta``). ``log(1 - exp(a))`` is :func:`log1mexp` of ``min(a, -1e-6)``: the
    clamp keeps ``log(1 - p) >= -13.8`` finite and the clamped part without gradient.
    Stats add ``orpo/log_odds_ratio`` and ``orpo/nll_loss``. Source: TRL ``ORPOTrainer.odds_ratio_loss``.
    """
    ac, ar = _mean_logps(x, "orpo")
    beta = hp["beta"]
    lam = beta if hp.get("orpo_lambda") is None else hp["orpo_lambda"]
    ac_c = paddle.clip(ac, max=ORPO_MAX_MEAN_LOGP)
    ar_c = paddle.clip(ar, max=ORPO_MAX_MEAN_LOGP)
    log_odds = (ac - ar) - (log1mexp(ac_c) - log1mexp(ar_c))
    loss = -lam * paddle.mean(F.log_sigmoid(log_odds))
    stats = {"orpo/log_odds_ratio": paddle.mean(log_odds).detach()}
    if x.nll is not None:
        loss = loss + x.nll
        stats["orpo/nll_loss"] = x.nll.detach()
    stats.update(_dpo_stats(beta * ac, beta * ar))
    return loss, stats


def cpo_loss(x, hp):
    """CPO (Xu et al. 2024, "Contrastive Preference Optimization"), no reference:
    ``L = -mean log s(beta (pi_c - pi_r)) + nll`` with ``pi`` the summed log-probs and ``nll``
    the chosen answers' token-mean NLL (required). Rewards ``beta pi``.
    Source: TRL ``CPOTrainer.cpo_loss`` (``sigmoid``, ``cpo_alpha = 1``).
    """
    if x.nll is None:
        raise ValueError("cpo needs the NLL of the chosen answers (inputs.nll)")
    pc, pr = _columns(x.policy)
    beta = hp["beta"]
    loss = paddle.mean(-F.log_sigmoid(beta * (pc - pr))) + x.nll
    stats = _dpo_stats(beta * pc, beta * pr)
    stats["cpo/nll_loss"] = x.nll.detach()
    return loss, stats


def rdpo_loss(x, hp):
    """R-DPO (Park et al. 2024, "Disentangling Length from Quality in DPO"):
    ``L = -log s(beta h + alpha (|y_c| - |y_r|))`` with ``h`` DPO's log-ratio margin,
    ``|y|`` the answer token counts and ``alpha = rdpo_alpha``. Rewards ``beta (pi - ref)``.

    The regularised objective maximises ``r - alpha |y|`` under the KL penalty, so the reward
    implied by the policy is ``beta log(pi / ref) + alpha |y|`` (plus a prompt-only term): a
    longer chosen answer already carries part of the margin, so the policy needs less of its
    own log-ratio margin to fit it and gains nothing from preferring length.
    """
    if x.lengths is None:
        raise ValueError("rdpo needs the answer lengths")
    pc, pr, rc, rr = _pair_logps(x, hp, "rdpo", False)
    lc, lr = _columns(x.lengths.astype(pc.dtype))
    beta = hp["beta"]
    z = beta * ((pc - pr) - (rc - rr)) + hp["rdpo_alpha"] * (lc - lr)
    return paddle.mean(-F.log_sigmoid(z)), _dpo_stats(beta * (pc - rc), beta * (pr - rr))


def kto_pair_loss(x, hp):
    """PaddleNLP's ``kto_pair`` (HALOs eq. 7): ``a = pi_c - ref_c``, ``b = pi_r - ref_r``,
    ``K_c = max(0, mean a)``, ``K_r = max(0, mean b)``; the 2B terms
    ``1 - s(beta (a_i - K_r))`` and ``1 - s(beta (K_c - b_i))`` are averaged."""
    pc, pr, rc, rr = _pair_logps(x, hp, "kto_pair", False)
    a, b, beta = pc - rc, pr - rr, hp["beta"]
    chosen_kl = paddle.clip(paddle.mean(a), min=0.0)
    rejected_kl = paddle.clip(paddle.mean(b), min=0.0)
    losses = paddle.concat([1.0 - F.sigmoid(beta * (a - rejected_kl)), 1.0 - F.sigmoid(beta * (chosen_kl - b))], axis=0)
    return paddle.mean(losses), _dpo_stats(beta * a, beta * b)


def sppo_hard_loss(x, hp):
    """SPPO with hard win probabilities (Wu et al. 2024):
    ``L_i = (a_i - 1/(2 beta))^2 + (b_i + 1/(2 beta))^2``."""
    pc, pr, rc, rr = _pair_logps(x, hp, "sppo_hard", False)
    a, b, beta = pc - rc, pr - rr, hp["beta"]
    losses = (a - 0.5 / beta) ** 2 + (b + 0.5 / beta) ** 2
    return paddle.mean(losses), _dpo_stats(beta * a, beta * b)


def nca_pair_loss(x, hp):
    """NCA (Chen et al. 2024): ``L_i = -log s(beta a_i) - 0.5 log s(-beta a_i) - 0.5 log s(-beta b_i)``."""
    pc, pr, rc, rr = _pair_logps(x, hp, "nca_pair", False)
    a, b, beta = pc - rc, pr - rr, hp["beta"]
    losses = -F.log_sigmoid(beta * a) - 0.5 * F.log_sigmoid(-beta * a) - 0.5 * F.log_sigmoid(-beta * b)
    return paddle.mean(losses), _dpo_stats(beta * a, beta * b)


def dpop_loss(x, hp):
    """DPO-Positive / Smaug (Pal et al. 2024):
    ``L_i = -log s(beta (h_i - lambda max(0, ref_c - pi_c)))``, ``lambda = dpop_lambda``."""
    pc, pr, rc, rr = _pair_logps(x, hp, "dpop", False)
    a, b, beta = pc - rc, pr - rr, hp["beta"]
    losses = -F.log_sigmoid(beta * ((a - b) - hp["dpop_lambda"] * paddle.clip(rc - pc, min=0.0)))
    return paddle.mean(losses), _dpo_stats(beta * a, beta * b)


def kto_paired_loss(x, hp):
    """KTO (Ethayarajh et al. 2024) on pairs, as TRL converts paired data: each chosen answer
    is a desirable example, each rejected one an undesirable example; :func:`kto_loss` over
    the 2B examples with ``kl_point`` as z0. ``rewards/accuracies`` compares the two
    log-ratios of each pair (they share the prompt)."""
    pc, pr, rc, rr = _pair_logps(x, hp, "kto", False)
    if x.kl_point is None:
        raise ValueError("kto needs the KL reference point (inputs.kl_point)")
    B = pc.shape[0]
    desirable = paddle.concat([paddle.ones([B], "int64"), paddle.zeros([B], "int64")])
    loss, stats = kto_loss(
        paddle.concat([pc, pr]), paddle.concat([rc, rr]), desirable, x.kl_point, beta=hp["beta"],
        desirable_weight=hp["desirable_weight"], undesirable_weight=hp["undesirable_weight"],
    )
    stats["rewards/accuracies"] = ((pc - rc) > (pr - rr)).astype(pc.dtype).mean().detach()
    return loss, stats
