"""Per-token KL estimators and KL-shaped rewards.

With ``log_ratio = logprobs - ref_logprobs`` for tokens sampled from the policy
(Schulman, "Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html):

* ``k1 = log_ratio``                          unbiased for KL(pi || ref), high variance;
* ``k2 = 0.5 * log_ratio^2``                   biased, low variance, accurate when close;
* ``k3 = exp(-log_ratio) + log_ratio - 1``      unbiased and always >= 0.

Names follow verl ``core_algos.kl_penalty`` (``kl`` = k1, ``mse`` = k2,
``low_var_kl`` = k3).
"""
import paddle

from .masked import _float_mask, _zero_outside, last_nonzero_index

__all__ = [
    "AdaptiveKLController", "K3_NAMES", "KL_ESTIMATORS", "KL_ESTIMATOR_NAMES", "kl_penalty", "kl_shaped_rewards",
    "last_token_mask",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
_KL_ALIASES = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
KL_ESTIMATOR_NAMES = tuple(_KL_ALIASES)
"""Every name `kl_penalty` accepts: ours (k1, k2, k3) and verl's (kl, mse, low_var_kl)."""
K3_NAMES = tuple(name for name, kind in _KL_ALIASES.items() if kind == "k3")
"""The names of the k3 estimator, the only one a `clamp` applies to."""


def _canonical_kl(kind):
    if kind not in _KL_ALIASES:
        raise ValueError(
            f"Unknown KL estimator {kind!r}; valid names: {sorted(_KL_ALIASES)} "
            "(kl = k1, mse = k2, low_var_kl = k3)."
        )
    return _KL_ALIASES[kind]


def kl_penalty(logprobs, ref_logprobs, kind="k1", clamp=None):
    """Per-token KL estimate between the policy and the reference.

    Formula (``d = logprobs - ref_logprobs``): ``k1 = d``; ``k2 = 0.5 * d^2``;
    ``k3 = exp(-d) - (-d) - 1 = exp(ref - logp) - (ref - logp) - 1``.
    ``clamp`` (k3 only): ``None`` (default) leaves k3 unclamped; a number ``c`` clamps
    ``ref - logp`` to ``[-20, 20]`` before the exponential and the result to
    ``[-c, c]``, as verl's ``low_var_kl`` does with ``c = 10`` (for example
    ``d = -3`` gives ``e^3 - 3 - 1 = 16.09`` unclamped and 10 with ``clamp=10``).
    A clamp with k1/k2 raises ``ValueError`` (verl clamps only k3).
    Aliases: ``kl`` -> k1, ``mse`` -> k2, ``low_var_kl`` -> k3; anything else raises
    ``ValueError`` listing the valid names.
    Shapes: ``logprobs``, ``ref_logprobs`` ``[B, T]`` -> ``[B, T]`` (no masking here).
    Source: Schulman 2020 "Approximating KL Divergence"; verl ``core_algos.kl_penalty``.
    """
    kind = _canonical_kl(kind)
    if clamp is not None and kind != "k3":
        raise ValueError(f"clamp applies to the k3 (low_var_kl) estimator only, got kind {kind!r}")
    if clamp is not None and not clamp > 0:
        raise ValueError(f"clamp must be positive, got {clamp!r}")
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio * log_ratio
    neg = -log_ratio  # ref - logp
    if clamp is None:
        return paddle.exp(neg) - neg - 1.0
    neg = paddle.clip(neg, min=-20.0, max=20.0)
    return paddle.clip(paddle.exp(neg) - neg - 1.0, min=-float(clamp), max=float(clamp))


def last_token_mask(mask):
    """Boolean ``[B, T]`` that is True only at each row's last position with ``mask != 0``
    (``last_nonzero_index``). Rows whose mask is empty are all False. Works for any layout
    (left offsets, right padding).
    """
    m = mask if isinstance(mask, paddle.Tensor) else paddle.to_tensor(mask)
    m = m.astype("bool")
    pos = paddle.arange(m.shape[-1], dtype="int64").expand(m.shape)
    last = last_nonzero_index(m).unsqueeze(-1)  # -1 for empty rows
    return paddle.logical_and(pos == last, m)


def kl_shaped_rewards(scores, logprobs, ref_logprobs, mask, kl_coeff, clip_range_score, kind="k1", clamp=None):
    """Token-level rewards for PPO: KL penalty on every response token, score at the last.

    Formula: ``kl_t = kl_penalty(logp_t, ref_t, kind, clamp) * mask_t``;
    ``r_t = -kl_coeff * kl_t + [t == last_b] * clip(score_b, -c, c)`` where
    ``last_b`` is the last index with ``mask == 1`` in row ``b`` and
    ``c = clip_range_score`` (``None`` disables the clip). Rows with an empty mask
    get no score. Both outputs are 0 outside the mask.
    Shapes: ``scores`` ``[B]``; ``logprobs``, ``ref_logprobs``, ``mask`` ``[B, T]``;
    returns ``(rewards [B, T], kl_per_token [B, T])``.
    Source: PaddleNLP ``PPOTrainer.add_kl_divergence_regularization``, safe-rlhf
    ``PPOTrainer.add_kl_divergence_regularization``, TRL ``PPOTrainer`` (score at EOS).
    """
    m = _float_mask(mask, logprobs)
    kl = _zero_outside(kl_penalty(logprobs, ref_logprobs, kind, clamp=clamp), m)
    rewards = -kl_coeff * kl
    s = scores.astype(logprobs.dtype).reshape([-1, 1])
    if clip_range_score is not None:
        s = paddle.clip(s, min=-clip_range_score, max=clip_range_score)
    last = last_token_mask(m)
    rewards = rewards + paddle.where(last, s.expand(last.shape), paddle.zeros_like(rewards))
    return rewards, kl


class FixedKLController:
    """A KL coefficient that stays at its initial value (no ``target_kl``): the same interface
    as :class:`AdaptiveKLController`, with nothing to update or carry through checkpoints
    (``state_dict`` is None: the coefficient is the run's argument)."""

    adapts = False

    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current_kl, n_steps):
        return self.value

    def state_dict(self):
        return None

    def set_state_dict(self, state):
        pass


class AdaptiveKLController:
    """KL coefficient that tracks a target KL (Ziegler et al. 2019, sec. 2.2).

    Update after each step with the observed KL ``kl`` and ``n_steps`` samples:
    ``e = clip(kl / target - 1, -0.2, 0.2)``; ``coef <- coef * (1 + e * n_steps / horizon)``.
    Example: coef 0.1, target 6, horizon 10000, kl 9, n_steps 100:
    ``e = min(0.5, 0.2) = 0.2``, ``coef = 0.1 * 1.002 = 0.1002``.
    Plain python floats (the caller converts its metric); ``state_dict`` /
    ``set_state_dict`` carry the coefficient through checkpoints.
    Source: Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences");
    TRL ``AdaptiveKLController``; verl ``core_algos.AdaptiveKLController``.
    """

    def __init__(self, init_kl_coef, target_kl, horizon):
        if not target_kl > 0:
            raise ValueError(f"target_kl must be positive, got {target_kl}")
        if not horizon > 0:
            raise ValueError(f"kl_horizon must be positive, got {horizon}")
        self.adapts = True
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl, n_steps):
        """Move the coefficient toward the target; returns the new value."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * float(n_steps) / self.horizon
        return self.value

    def state_dict(self):
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def set_state_dict(self, state):
        self.value = float(state["value"])
