"""Test helpers: the pair losses of the preference-loss registry called with per-pair tensors,
as the tests that predate the registry wrote them (`dpo_loss`: DPO, IPO, SLiC, SimPO, ORPO;
`pair_loss`: PaddleNLP's kto_pair, sppo_hard, nca_pair, dpop). Training code calls the registry
(`ppo.algos.PREFERENCE_LOSSES`, `dpo.preference_objective`)."""
import paddle

from ppo.algos.preference_registry import PREFERENCE_LOSSES, PreferenceInputs

DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge", "simpo", "orpo")


def _stack_pair(chosen, rejected):
    """``[B, 2]`` from two ``[B]`` tensors (or lists); None when either is None."""
    if chosen is None or rejected is None:
        return None
    as_tensor = lambda v: v if isinstance(v, paddle.Tensor) else paddle.to_tensor(v)  # noqa: E731
    return paddle.stack([as_tensor(chosen), as_tensor(rejected)], axis=-1)


def dpo_loss(
    policy_chosen_logps,
    policy_rejected_logps,
    ref_chosen_logps=None,
    ref_rejected_logps=None,
    beta=0.1,
    loss_type="sigmoid",
    label_smoothing=0.0,
    simpo_gamma=0.5,
    chosen_lengths=None,
    rejected_lengths=None,
    reference_free=False,
    policy_chosen_nll=None,
    orpo_lambda=None,
):
    """DPO-family preference loss on summed sequence log-probs ``[B]``: the registry entry
    ``PREFERENCE_LOSSES[loss_type]`` (``ppo.algos.preference_registry``) on the pairs.

    With ``h = (pi_c - pi_r) - (ref_c - ref_r)`` (``ref`` terms 0 when ``reference_free``):
    ``sigmoid`` (DPO; cDPO with ``label_smoothing = e``): ``-(1 - e) log s(beta h) - e log s(-beta h)``;
    ``ipo``: ``(h - 1 / (2 beta))^2`` (log-probs divided by the lengths when given);
    ``hinge`` (SLiC): ``relu(1 - beta h)``; ``simpo`` (``a = logp / length``):
    ``-log s(beta (a_c - a_r) - simpo_gamma)`` (smoothed like cDPO); ``orpo``: ``-lambda log s(log_odds)``
    plus ``policy_chosen_nll`` (``lambda = orpo_lambda`` or ``beta``). Each formula in full sits
    in the docstring of its function in ``ppo.algos.preference_pairs``.
    Returns ``(mean loss over pairs, stats)`` with ``rewards/{chosen,rejected,accuracies,margins}``.
    Unknown ``loss_type`` raises ``ValueError``.
    Source: Rafailov et al. 2023; Azar et al. 2023; Zhao et al. 2023; Meng et al. 2024;
    Hong et al. 2024; TRL ``DPOTrainer.dpo_loss``, ``CPOTrainer.cpo_loss``, ``ORPOTrainer.odds_ratio_loss``.
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"Unknown DPO loss_type {loss_type!r}; valid types: {list(DPO_LOSS_TYPES)}")
    inputs = PreferenceInputs(
        _stack_pair(policy_chosen_logps, policy_rejected_logps),
        reference=_stack_pair(ref_chosen_logps, ref_rejected_logps),
        lengths=_stack_pair(chosen_lengths, rejected_lengths),
        nll=policy_chosen_nll,
    )
    hp = dict(beta=beta, label_smoothing=label_smoothing, simpo_gamma=simpo_gamma, reference_free=reference_free,
              orpo_lambda=orpo_lambda)
    return PREFERENCE_LOSSES[loss_type](inputs, hp)


PAIR_LOSS_TYPES = ("kto_pair", "sppo_hard", "nca_pair", "dpop")
"""Reference-based pair losses of PaddleNLP's ``DPOCriterion`` that ``dpo_loss`` does not cover."""


def pair_loss(
    policy_chosen_logps,
    policy_rejected_logps,
    ref_chosen_logps,
    ref_rejected_logps,
    beta=0.1,
    loss_type="kto_pair",
    dpop_lambda=50.0,
):
    """PaddleNLP's reference-based pair losses on summed sequence log-probs ``[B]``: the
    registry entry ``PREFERENCE_LOSSES[loss_type]`` on the pairs.

    With ``a = pi_c - ref_c``, ``b = pi_r - ref_r``, ``h = a - b``, ``s`` = sigmoid:
    ``kto_pair``: ``K_c = max(0, mean a)``, ``K_r = max(0, mean b)``, mean of the 2B terms
    ``1 - s(beta (a_i - K_r))`` and ``1 - s(beta (K_c - b_i))``; ``sppo_hard``:
    ``(a_i - 1/(2 beta))^2 + (b_i + 1/(2 beta))^2``; ``nca_pair``:
    ``-log s(beta a_i) - 0.5 log s(-beta a_i) - 0.5 log s(-beta b_i)``; ``dpop``:
    ``-log s(beta (h_i - lambda max(0, ref_c - pi_c)))``, ``lambda = dpop_lambda``.
    Returns ``(mean loss, stats)`` with ``rewards/{chosen,rejected,accuracies,margins}`` from
    ``beta a``, ``beta b``. Unknown ``loss_type`` raises ``ValueError``.
    Hand check (B=1, beta=1, a=0, b=0): kto_pair 0.5; sppo_hard 0.5; nca_pair 2 log 2.
    Source: PaddleNLP ``paddlenlp/trl/dpo_criterion.py::DPOCriterion.dpo_loss``.
    """
    if loss_type not in PAIR_LOSS_TYPES:
        raise ValueError(f"Unknown pair loss_type {loss_type!r}; valid types: {list(PAIR_LOSS_TYPES)}")
    inputs = PreferenceInputs(
        _stack_pair(policy_chosen_logps, policy_rejected_logps), reference=_stack_pair(ref_chosen_logps, ref_rejected_logps)
    )
    return PREFERENCE_LOSSES[loss_type](inputs, dict(beta=beta, dpop_lambda=dpop_lambda))

