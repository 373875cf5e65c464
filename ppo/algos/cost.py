"""Cost-model losses and metrics of Safe RLHF (Dai et al. 2023, "Safe RLHF: Safe
Reinforcement Learning from Human Feedback"), as in safe-rlhf's
``safe_rlhf/values/cost/trainer.py::CostTrainer.loss``.

A cost model scores answers like a reward model, but a higher score means a less
safe answer, and its sign carries meaning: a safe answer should cost below 0, an
unsafe one above 0 (PPO-Lagrangian constrains the expected cost to stay <= 0).
Each pair holds the *safer* answer (lower cost wanted) and the *unsafer* one.

Safety signs follow the data (``SafetyPreferenceDataset``, safe-rlhf):
``+1`` for a safe answer, ``-1`` for an unsafe one. The cost sign is their
negation: ``sigma = -safety_sign`` (``+1`` unsafe, ``-1`` safe), and the sign terms
``-log sigmoid(sigma * c)`` push an unsafe answer's cost above 0 and a safe one's below 0.

Stats (detached scalars): ``cost/loss``, ``cost/accuracy`` (pairwise:
``mean[c_unsafer > c_safer]``), ``cost/sign_accuracy`` (``mean`` over both answers of
``[sigma * c > 0]``, a cost of exactly 0 counts as wrong), ``cost/margin``
(``mean(c_unsafer - c_safer)``).
"""
import paddle
import paddle.nn.functional as F

from .masked import masked_mean, zero_masked_inputs
from .preference import pair_divergence_span, scores_at

__all__ = ["pairwise_cost_loss", "tokenwise_pairwise_cost_loss", "cost_metrics"]


def _cost_signs(safety_sign, like):
    """``sigma = -safety_sign`` as ``like``'s dtype (``+1`` unsafe, ``-1`` safe)."""
    if not isinstance(safety_sign, paddle.Tensor):
        safety_sign = paddle.to_tensor(safety_sign)
    return -safety_sign.astype(like.dtype)


def cost_metrics(safer_costs, unsafer_costs, safer_sign, unsafer_sign):
    """Pairwise and sign accuracy of end costs.

    Formula: ``accuracy = mean_b[c_u,b > c_s,b]``;
    ``sign_accuracy = (sum_b [sigma_s,b * c_s,b > 0] + sum_b [sigma_u,b * c_u,b > 0]) / (2B)``
    with ``sigma = -safety_sign``; ``margin = mean_b(c_u,b - c_s,b)``.
    Shapes: every argument ``[B]``; safety signs ``+1`` safe / ``-1`` unsafe (int or float).
    Returns ``{"cost/accuracy", "cost/sign_accuracy", "cost/margin"}`` (detached scalars).
    Source: safe-rlhf ``CostTrainer.loss`` / ``CostTrainer.eval`` (``accuracy``, ``accuracy_sign``).
    """
    sigma_s, sigma_u = _cost_signs(safer_sign, safer_costs), _cost_signs(unsafer_sign, unsafer_costs)
    right_sign = paddle.concat([sigma_s * safer_costs > 0, sigma_u * unsafer_costs > 0]).astype(safer_costs.dtype)
    return {
        "cost/accuracy": paddle.mean((unsafer_costs > safer_costs).astype(safer_costs.dtype)).detach(),
        "cost/sign_accuracy": paddle.mean(right_sign).detach(),
        "cost/margin": paddle.mean(unsafer_costs - safer_costs).detach(),
    }


def pairwise_cost_loss(safer_costs, unsafer_costs, safer_sign, unsafer_sign, regularization=0.0):
    """Sequence-wise cost-model loss of safe-rlhf (``loss_type == 'sequence-wise'``).

    Formula, with ``sigma = -safety_sign`` and end costs ``c_s`` (safer), ``c_u`` (unsafer):
    ``L = mean_b[-log sigmoid(c_u - c_s) - log sigmoid(sigma_s c_s) - log sigmoid(sigma_u c_u)]
    + reg * mean(stack([c_s, c_u])^2)`` (the last term is ``reg * (mean(c_s^2) + mean(c_u^2)) / 2``).
    Shapes: every argument ``[B]``; safety signs ``+1`` safe / ``-1`` unsafe.
    Returns ``(loss, stats)``: ``cost/loss`` and the ``cost_metrics`` of the end costs.
    Source: safe-rlhf ``safe_rlhf/values/cost/trainer.py::CostTrainer.loss``.
    """
    sigma_s, sigma_u = _cost_signs(safer_sign, safer_costs), _cost_signs(unsafer_sign, unsafer_costs)
    loss = paddle.mean(
        -F.log_sigmoid(unsafer_costs - safer_costs)
        - F.log_sigmoid(sigma_s * safer_costs)
        - F.log_sigmoid(sigma_u * unsafer_costs)
    )
    if regularization:
        loss = loss + regularization * paddle.mean(paddle.stack([safer_costs, unsafer_costs]) ** 2)
    return loss, {"cost/loss": loss.detach(), **cost_metrics(safer_costs, unsafer_costs, safer_sign, unsafer_sign)}


def tokenwise_pairwise_cost_loss(
    safer_token_costs,
    unsafer_token_costs,
    safer_input_ids,
    unsafer_input_ids,
    safer_mask,
    unsafer_mask,
    safer_sign,
    unsafer_sign,
    regularization=0.0,
):
    """Token-wise cost-model loss of safe-rlhf (``loss_type == 'token-wise'``).

    For pair ``b`` the span ``S_b = [d_b, e_b]`` runs from the first index where the two
    ``input_ids`` rows differ to the later of the two last mask indices
    (``pair_divergence_span``); with ``sigma = -safety_sign``:
    ``L_b = mean_S -log sigmoid(c_u,t - c_s,t) + mean_S -log sigmoid(sigma_s,b c_s,t)
    + mean_S -log sigmoid(sigma_u,b c_u,t) + reg * (mean_S c_s,t^2 + mean_S c_u,t^2) / 2``;
    ``L = mean_b L_b``. Every token of the span carries the answer's sign, costs inside
    ``S_b`` are used as given even past the shorter sequence's end (as safe-rlhf), costs
    outside it are ignored.
    Stats use the end costs at each sequence's own last mask index (``cost_metrics``).
    Shapes: token costs, ids and masks ``[B, L]``; signs ``[B]`` (``+1`` safe / ``-1`` unsafe).
    Source: safe-rlhf ``safe_rlhf/values/cost/trainer.py::CostTrainer.loss``.
    """
    span, safer_end, unsafer_end = pair_divergence_span(safer_input_ids, unsafer_input_ids, safer_mask, unsafer_mask)
    span = span.astype(safer_token_costs.dtype)
    sigma_s = _cost_signs(safer_sign, safer_token_costs).unsqueeze(-1)
    sigma_u = _cost_signs(unsafer_sign, unsafer_token_costs).unsqueeze(-1)
    safer, unsafer = zero_masked_inputs(span, safer_token_costs, unsafer_token_costs)
    per_pair = (
        masked_mean(-F.log_sigmoid(unsafer - safer), span, axis=-1)
        + masked_mean(-F.log_sigmoid(sigma_s * safer), span, axis=-1)
        + masked_mean(-F.log_sigmoid(sigma_u * unsafer), span, axis=-1)
    )
    if regularization:
        squares = masked_mean(safer**2, span, axis=-1) + masked_mean(unsafer**2, span, axis=-1)
        per_pair = per_pair + regularization * squares / 2
    loss = paddle.mean(per_pair)
    safer_end_costs, unsafer_end_costs = scores_at(safer_token_costs, safer_end), scores_at(unsafer_token_costs, unsafer_end)
    stats = cost_metrics(safer_end_costs, unsafer_end_costs, safer_sign, unsafer_sign)
    return loss, {"cost/loss": loss.detach(), **stats}
