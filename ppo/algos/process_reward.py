"""Process reward models (PRMs): the step loss they train with and the step rewards they give.

A PRM scores a response step by step: a placeholder token after each step (PaddleNLP's
``placeholder_token``, Math-Shepherd's ``ки``) marks where the score model's score is read,
and each step is labelled good or bad (PaddleNLP's ``reward_tokens`` ``+,-``). Training is a
binary classification at the marked positions (Wang et al. 2024, "Math-Shepherd: Verify and
Reinforce LLMs Step-by-step without Human Annotations"; a 2-way softmax over the logits of
the two reward tokens, as OpenRLHF's PRM trainer computes it, is a sigmoid of their logit
difference, which is what the score head gives here).

In RL the step scores become rewards in one of three ways (``prm_reduction``):

- ``last``: the last step's score is the response's score (an outcome reward);
- ``min``: the lowest step score is the response's score (a chain is as good as its worst
  step; Lightman et al. 2023, "Let's Verify Step by Step", score solutions by the product or
  minimum of their step scores);
- ``step``: every step's score is a reward at the step's last token, so the returns of the
  later steps reach the earlier tokens (PPO: GAE over those token rewards; GRPO: DeepSeekMath's
  process supervision, :func:`process_group_advantages`).

Shapes: ``step_scores``, ``step_mask`` ``[B, S]`` (S steps at most per row; mask 1 on real
steps), ``step_end`` ``[B, S]`` the token index (into ``[B, T]``) of each step's last token.
Masked steps are never read; inputs are never written into.
"""
import paddle
import paddle.nn.functional as F

from .groups import group_view
from .masked import _float_mask, _zero_outside, zero_masked_inputs

__all__ = [
    "PRM_REDUCTIONS",
    "process_reward_loss",
    "reduce_step_scores",
    "step_token_rewards",
    "process_group_advantages",
    "add_to_last_step",
]

PRM_REDUCTIONS = ("last", "min", "step")


def process_reward_loss(step_logits, step_labels, step_mask):
    """Binary cross-entropy of a PRM's scores at the marked steps, and its step accuracy.

    Formula, over the valid steps ``V`` (``step_mask != 0``):
    ``loss = -1/|V| sum_V [y log sigmoid(s) + (1 - y) log(1 - sigmoid(s))]`` (computed as
    ``softplus(s) - y * s``, stable for any ``s``); ``prm/step_accuracy = 1/|V| sum_V
    [(s > 0) == (y > 0.5)]``; ``prm/positive_frac`` the share of good steps. 0 for an empty mask.
    Shapes: ``step_logits``, ``step_labels`` (0/1 or soft), ``step_mask`` ``[B, S]`` -> ``(loss, stats)``.
    """
    m = _float_mask(step_mask, step_logits)
    s, y = zero_masked_inputs(m, step_logits, step_labels.astype(step_logits.dtype))
    count = paddle.clip(paddle.sum(m), min=1.0)
    loss = paddle.sum((F.softplus(s) - y * s) * m) / count
    with paddle.no_grad():
        correct = ((s > 0) == (y > 0.5)).astype(step_logits.dtype)
        stats = {
            "prm/loss": loss.detach(),
            "prm/step_accuracy": paddle.sum(correct * m) / count,
            "prm/positive_frac": paddle.sum(y * m) / count,
        }
    return loss, stats


def _last_step(step_mask):
    """Index of each row's last valid step (0 for a row without one): ``[B, S]`` -> ``[B]``."""
    S = step_mask.shape[-1]
    positions = paddle.arange(S, dtype="int64").reshape([1, S]).expand(step_mask.shape)
    return paddle.max(paddle.where(step_mask != 0, positions, paddle.zeros_like(positions)), axis=-1)


def add_to_last_step(step_scores, step_mask, delta):
    """``step_scores`` with ``delta [B]`` added to each row's last valid step (a penalty on the
    whole response, such as ``missing_eos_penalty``, carried by its last step).

    Formula: ``s'[b, k] = s[b, k] + delta[b] * [k == k_b]``, ``k_b`` the last valid step of row b;
    masked steps are 0 in the result. Shapes: ``[B, S]``, ``[B]`` -> ``[B, S]``.
    """
    m = _float_mask(step_mask, step_scores)
    onehot = F.one_hot(_last_step(m), step_scores.shape[-1]).astype(step_scores.dtype) * m
    return _zero_outside(step_scores, m) + delta.astype(step_scores.dtype).unsqueeze(-1) * onehot


def reduce_step_scores(step_scores, step_mask, how):
    """One score per response from its step scores: ``last`` or ``min``.

    Formula: ``last``: ``s_{i, k_i}`` with ``k_i`` the last valid step of row i; ``min``:
    ``min_{k valid} s_ik``. Every row must hold at least one valid step (a PRM scorer gives an
    empty response one, empty, step), else ``last`` reads its step 0 and ``min`` gives +inf.
    Shapes: ``[B, S]`` -> ``[B]``.
    """
    m = _float_mask(step_mask, step_scores)
    if how == "last":
        last = _last_step(m)
        return paddle.take_along_axis(_zero_outside(step_scores, m), last.unsqueeze(-1), axis=-1).squeeze(-1)
    if how == "min":
        inf = paddle.full_like(step_scores, float("inf"))
        return paddle.min(paddle.where(m != 0, step_scores, inf), axis=-1)
    raise ValueError(f"how must be 'last' or 'min' ('step' gives token rewards: step_token_rewards), got {how!r}")


def step_token_rewards(step_scores, step_mask, step_end, num_tokens):
    """Token rewards with each step's score at its last token (``prm_reduction: step``).

    Formula: ``r[b, t] = sum_{k valid, step_end[b, k] == t} s_bk`` (0 elsewhere). Added to the
    per-token KL rewards instead of the score at the response's last token, an estimator's
    returns (GAE, REINFORCE++) then give each token the rewards of its own and later steps.
    Shapes: ``[B, S]`` -> ``[B, num_tokens]``.
    """
    m = _float_mask(step_mask, step_scores)
    index = paddle.where(m != 0, step_end.astype("int64"), paddle.zeros_like(step_end, dtype="int64"))
    onehot = F.one_hot(index, num_tokens).astype(step_scores.dtype)  # [B, S, T]
    weighted = _zero_outside(step_scores, m).unsqueeze(-1) * onehot
    return paddle.sum(weighted, axis=1)


def process_group_advantages(step_scores, step_mask, step_end, response_mask, group_size, eps=1e-6):
    """GRPO with process supervision (Shao et al. 2024, DeepSeekMath, section 4.1.3).

    Formula, per group g of ``group_size`` consecutive rows and its valid steps ``R_g``:
    ``r~ = (r - mean(R_g)) / (std(R_g) + eps)`` (unbiased std; a group whose step scores are
    all equal, or that has one step, gets r~ = 0), then each token's advantage is the sum of
    the normalised scores of the steps that end at or after it:
    ``A[b, t] = sum_{k valid, step_end[b, k] >= t} r~_bk`` on response tokens (0 elsewhere).
    Shapes: ``step_*`` ``[B, S]``, ``response_mask`` ``[B, T]`` -> ``[B, T]``.
    """
    m = _float_mask(step_mask, step_scores)
    s = _zero_outside(step_scores, m)
    S = s.shape[-1]
    gs, gm = group_view(s.reshape([-1]), group_size * S), group_view(m.reshape([-1]), group_size * S)
    count = paddle.sum(gm, axis=1, keepdim=True)
    mean = paddle.sum(gs * gm, axis=1, keepdim=True) / paddle.clip(count, min=1.0)
    centred = (gs - mean) * gm
    std = paddle.sqrt(paddle.sum(centred**2, axis=1, keepdim=True) / paddle.clip(count - 1.0, min=1.0))
    big = paddle.full_like(gs, float("inf"))
    spread = paddle.max(paddle.where(gm != 0, gs, -big), axis=1, keepdim=True) - paddle.min(
        paddle.where(gm != 0, gs, big), axis=1, keepdim=True)
    normalised = paddle.where((spread > 0) & (count > 1), centred / (std + eps), paddle.zeros_like(gs))
    token = step_token_rewards(normalised.reshape(s.shape), step_mask, step_end, response_mask.shape[-1])
    suffix = paddle.flip(paddle.cumsum(paddle.flip(token, [1]), axis=1), [1])
    return _zero_outside(suffix, _float_mask(response_mask, suffix))
