"""PPO-Lagrangian (Safe RLHF): the Lagrange multiplier of the cost constraint and the advantage
the actor is trained on (the reward and cost token rewards are `kl.kl_shaped_rewards`, once per
objective, the cost's at `-kl_coeff`).

The constrained problem ``max_theta J_R(theta)  s.t.  J_C(theta) <= d`` becomes the min-max
problem ``min_{lambda >= 0} max_theta J_R - lambda * (J_C - d)``. The policy ascends
``(A_R - lambda * A_C) / (1 + lambda)`` per token (the division keeps the advantage's scale as
lambda grows); the multiplier descends the Lagrangian in ``log lambda`` (so lambda stays
positive), with ``J_C`` estimated by the mean cost of the last ``window_size`` episodes.

Plain Python floats for the multiplier (the caller converts its metrics); paddle tensors for
the token-level functions, whose inputs are never written into.
Source: Dai et al. 2023 ("Safe RLHF", eq. 12-13); safe-rlhf
``safe_rlhf/algorithms/ppo_lag/trainer.py`` (``PPOLagTrainer``: ``log_lambda``,
``log_lambda_optimizer`` = SGD, ``episode_costs`` deque, ``add_kl_divergence_regularization``,
``actor_loss_fn``); Stooke et al. 2020 (PPO-Lagrangian).
"""
import math

__all__ = ["LagrangeMultiplier", "combined_advantages", "lagrange_multiplier_step"]


def lagrange_multiplier_step(log_lambda, episode_cost, threshold, lambda_lr, lambda_max=None):
    """One SGD step on ``log lambda`` for the loss ``-(J_C - d) * exp(log lambda)``, then the clamp.

    Formula: the gradient of the loss with respect to ``log lambda`` is ``-(J_C - d) * lambda``,
    so ``log lambda' = log lambda + lambda_lr * (J_C - d) * exp(log lambda)``; with
    ``lambda_max`` (None or 0: no cap, as safe-rlhf's ``if lambda_max``),
    ``log lambda' = min(log lambda', log lambda_max)``. A cost above the threshold raises
    lambda, one below lowers it (never to 0: it lives in log space).
    Example: ``log lambda 0`` (lambda 1), ``J_C 0.5``, ``d 0``, lr 0.1 -> ``0.05`` (lambda 1.0513).
    Floats in, float out.
    """
    stepped = float(log_lambda) + float(lambda_lr) * (float(episode_cost) - float(threshold)) * math.exp(float(log_lambda))
    if lambda_max:
        stepped = min(stepped, math.log(float(lambda_max)))
    return stepped


def combined_advantages(reward_advantages, cost_advantages, multiplier):
    """The actor's advantage of PPO-Lagrangian: ``(A_R - lambda * A_C) / (1 + lambda)``.

    Example: ``A_R 1, A_C 2, lambda 1`` -> ``(1 - 2) / 2 = -0.5``; ``lambda 0`` gives ``A_R``,
    ``lambda -> inf`` gives ``-A_C``. Elementwise, so 0 wherever both inputs are 0 (outside the
    response mask). Shapes: ``[B, T]`` and ``[B, T]`` -> ``[B, T]``; ``multiplier`` a float >= 0.
    """
    lam = float(multiplier)
    return (reward_advantages.detach() - lam * cost_advantages.detach()) / (1.0 + lam)


class LagrangeMultiplier:
    """The multiplier lambda = exp(log_lambda) and the window of episode costs it is updated from.

    ``record(costs)`` appends episode costs (the oldest fall out past ``window_size``);
    ``episode_cost()`` is the window's mean; ``update(step, episode_cost)`` takes one
    ``lagrange_multiplier_step`` when ``step >= update_delay_steps`` (``step``: the number of
    training steps completed before this one) and returns whether it did. ``state_dict`` /
    ``set_state_dict`` carry ``log_lambda`` and the window through checkpoints.
    Example: init 1, lr 0.1, threshold 0, delay 1; costs ``[1, 1]`` at step 0: no update
    (lambda 1); costs ``[1, 1]`` at step 1: ``J_C = 1``, ``log lambda = 0.1``, lambda 1.1052.
    """

    def __init__(self, lambda_init, lambda_lr, lambda_max=None, update_delay_steps=0, window_size=128, threshold=0.0):
        if not lambda_init > 0:
            raise ValueError(f"lambda_init must be positive (lambda lives in log space), got {lambda_init}")
        if not window_size >= 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self.log_lambda = math.log(float(lambda_init))
        self.lambda_lr, self.lambda_max, self.threshold = float(lambda_lr), lambda_max, float(threshold)
        self.update_delay_steps = int(update_delay_steps)
        self.window_size = int(window_size)
        self.window = []  # the last window_size episode costs, oldest first

    @property
    def value(self):
        """lambda = exp(log_lambda), a float > 0."""
        return math.exp(self.log_lambda)

    def record(self, costs):
        """Append the episode costs ``costs`` (an iterable of floats) to the window."""
        self.window = (self.window + [float(c) for c in costs])[-self.window_size:]

    def episode_cost(self):
        """Mean cost of the episodes in the window; raises when it is empty."""
        if not self.window:
            raise ValueError("no episode cost recorded yet")
        return sum(self.window) / len(self.window)

    def update(self, step, episode_cost):
        """One multiplier step from ``episode_cost`` unless ``step < update_delay_steps``."""
        if step < self.update_delay_steps:
            return False
        self.log_lambda = lagrange_multiplier_step(self.log_lambda, episode_cost, self.threshold, self.lambda_lr, self.lambda_max)
        return True

    def state_dict(self):
        return {"log_lambda": self.log_lambda, "window": list(self.window)}

    def set_state_dict(self, state):
        self.log_lambda = float(state["log_lambda"])
        self.window = [float(c) for c in state["window"]][-self.window_size:]
