"""VAPO's value-based terms (Yue et al. 2025, "VAPO: Efficient and Reliable Reinforcement Learning
for Advanced Reasoning Tasks", which builds on VC-PPO, Yuan et al. 2025, "What's Behind PPO's
Collapse in Long-CoT? Value Optimization Holds the Secret").

- Decoupled GAE: the critic learns from GAE returns with its own lambda (1.0 in the paper: the
  Monte-Carlo return, which a value model initialised from a reward model is not biased by),
  while the actor's advantages use another lambda.
- Length-adaptive GAE: the actor's lambda of a response of length ``l`` is
  ``1 - 1 / (alpha * l)`` (alpha = 0.05 in the paper), so that the sum of the TD weights
  ``sum_t lambda^t = 1 / (1 - lambda) = alpha * l`` grows with the response instead of
  being a fixed horizon for short and long answers alike.
- Value pretraining: before any policy update the critic is trained for a number of steps on
  the lambda = 1 returns of the (frozen) policy's rollouts.
- Positive-example LM loss: the negative log-likelihood of the tokens of the correct samples
  (``mu = 0.1`` in the paper) is added to the PPO loss.

``VAPO_ESTIMATOR`` is its ``adv_estimator vapo`` entry (registered in
``ppo.algos.advantage_registry``), with its own settings ``vapo_alpha`` and ``critic_gae_lambda``.

Pure functions on paddle tensors; masked positions are never read (their values cannot change
a result) and inputs are never written into.
"""
import paddle

from .advantage import GAMMA, AdvEstimator, gae_advantages_and_returns
from .masked import _float_mask, zero_masked_inputs
from .setting import Setting

__all__ = [
    "VAPO_ALPHA",
    "VAPO_CRITIC_LAMBDA",
    "length_adaptive_lambda",
    "vapo_advantages_and_returns",
    "value_pretraining_targets",
    "in_value_pretraining",
    "positive_example_nll",
    "VAPO_ESTIMATOR",
]

VAPO_ALPHA = 0.05
"""The paper's alpha of the length-adaptive lambda."""
VAPO_CRITIC_LAMBDA = 1.0
"""The paper's (and VC-PPO's) lambda of the critic's GAE targets."""


def length_adaptive_lambda(lengths, alpha=VAPO_ALPHA):
    """Per-response actor lambda of length-adaptive GAE.

    Formula: ``lambda_i = clip(1 - 1 / (alpha * l_i), 0, 1)`` with ``l_i`` the response's token
    count (at least 1). The paper states the formula for the long responses it trains on; below
    ``l = 1 / alpha`` (20 tokens at alpha 0.05) it would be negative, and is clipped to 0
    (one-step TD), the smallest lambda GAE has.
    Hand values at alpha 0.05: l = 100 -> 0.8, l = 200 -> 0.9, l = 20 -> 0, l = 10 -> 0.
    Shapes: ``lengths`` ``[B]`` -> ``[B]`` in the dtype of float ``lengths`` (float32 for integer ones).
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    if not paddle.is_floating_point(lengths):
        lengths = lengths.astype("float32")
    lengths = paddle.clip(lengths, min=1.0)
    return paddle.clip(1.0 - 1.0 / (alpha * lengths), min=0.0, max=1.0)


def vapo_advantages_and_returns(values, rewards, mask, gamma=GAMMA, alpha=VAPO_ALPHA, critic_lambda=VAPO_CRITIC_LAMBDA):
    """Decoupled, length-adaptive GAE: the actor's advantages and the critic's targets.

    Formula, per row with ``l`` masked tokens: ``advantages = GAE(gamma, lambda_actor(l))``
    with ``lambda_actor = length_adaptive_lambda(l, alpha)``; ``returns = GAE(gamma,
    critic_lambda) + V`` (:func:`ppo.algos.gae_advantages_and_returns` for both, so masked
    positions are skipped and are 0 in both outputs). With ``critic_lambda = 1`` the returns
    are the discounted reward-to-go, whatever the values.
    Shapes: ``values``, ``rewards``, ``mask`` ``[B, T]`` -> ``(advantages, returns)`` ``[B, T]``.
    """
    m = _float_mask(mask, values)
    lam_actor = length_adaptive_lambda(paddle.sum(m, axis=-1), alpha)
    advantages, _ = gae_advantages_and_returns(values, rewards, mask, gamma=gamma, gae_lambda=lam_actor)
    _, returns = gae_advantages_and_returns(values, rewards, mask, gamma=gamma, gae_lambda=critic_lambda)
    return advantages, returns


def _vapo(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std, vapo_alpha, critic_gae_lambda):
    """The registry's signature: ``gae_lambda`` is not read (the actor's lambda is length-adaptive,
    the critic's is ``critic_gae_lambda``)."""
    return vapo_advantages_and_returns(values, rewards, mask, gamma=gamma, alpha=vapo_alpha, critic_lambda=critic_gae_lambda)


VAPO_ESTIMATOR = AdvEstimator("vapo", _vapo, needs_critic=True, per_group=False, whitens=True,
                              settings=(
                                  Setting("vapo_alpha", float, VAPO_ALPHA,
                                          "adv_estimator vapo: the actor's GAE lambda of a response of length l is "
                                          "1 - 1/(vapo_alpha * l) (length-adaptive GAE; the paper's 0.05).",
                                          bounds=(0.0, False, None, False)),
                                  Setting("critic_gae_lambda", float, VAPO_CRITIC_LAMBDA,
                                          "adv_estimator vapo: the GAE lambda of the critic's targets (decoupled GAE; "
                                          "1.0: Monte-Carlo returns).", bounds=(0.0, True, 1.0, True)),
                              ))
"""``adv_estimator vapo``: GAE with a critic, the actor's lambda length-adaptive, the critic's
targets from their own lambda (PaddleNLP's ``rl_algorithm: vapo``)."""


def value_pretraining_targets(rewards, mask, gamma=GAMMA):
    """The critic's targets while it is pretrained: Monte-Carlo returns (GAE with lambda 1).

    Formula, walking the masked tokens backwards: ``G_t = r_t + gamma * G_{t'}`` (0 after the
    last response token); ``t'`` the next masked token. Equal to the returns of
    :func:`vapo_advantages_and_returns` with ``critic_lambda = 1``, computed without values.
    Shapes: ``rewards``, ``mask`` ``[B, T]`` -> ``[B, T]`` (0 outside the mask).
    """
    zeros = paddle.zeros_like(rewards.detach())
    _, returns = gae_advantages_and_returns(zeros, rewards, mask, gamma=gamma, gae_lambda=1.0)
    return returns


def in_value_pretraining(step, pretrain_critic_steps):
    """Whether training step ``step`` (0-based, counted before it runs) only trains the critic:
    the first ``pretrain_critic_steps`` steps do (PaddleNLP's ``pretrain_critic_steps``)."""
    return step < pretrain_critic_steps


def positive_example_nll(logprobs, mask, positive, num_tokens=None):
    """VAPO's positive-example LM loss: the mean negative log-likelihood of the tokens of the
    correct samples.

    Formula (the paper's ``L_NLL``, section 5): ``L = -sum_{i: positive_i} sum_t m_it * logp_it / N``
    with ``N = sum_{i: positive_i} sum_t m_it`` (token mean over the positive samples; 0 when the
    batch has none), or ``N = num_tokens`` when given (python number: the positive-token count of
    the whole optimisation step, so that the micro-batches' terms sum to the step's token mean).
    The caller adds ``mu * L`` to the policy loss (mu = 0.1 in the paper).
    Example: ``logp = [[-1, -2], [-4, -8]]``, mask all 1, ``positive = [True, False]`` ->
    ``(1 + 2) / 2 = 1.5``; with ``num_tokens = 6`` -> ``3 / 6 = 0.5``.
    Shapes: ``logprobs``, ``mask`` ``[B, T]``, ``positive`` ``[B]`` (bool or 0/1) -> scalar.
    """
    m = _float_mask(mask, logprobs)
    weights = m * positive.astype(logprobs.dtype).reshape([-1, 1])
    (logprobs,) = zero_masked_inputs(weights, logprobs)
    total = paddle.sum(logprobs)
    count = paddle.sum(weights) if num_tokens is None else float(num_tokens)
    return -total / paddle.clip(paddle.to_tensor(count, dtype=logprobs.dtype), min=1.0)
