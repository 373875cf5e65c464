"""Advantage estimators: GAE (PPO), GRPO / Dr.GRPO, RLOO, REINFORCE++ (+ baseline), pass@k.

Token-level estimators take ``[B, T]`` tensors and a response ``mask``; the
response may start at any column (prompts left-padded before it) and may be
followed by right padding. Masked-out positions are *skipped*: they neither
carry the recursion nor receive a value (outputs are 0 there), so garbage at
those positions cannot change any result. Advantages are targets: inputs are
detached and outputs carry no gradient.

Sequence-level estimators take scores ``[B]`` with ``B = num_groups * group_size``
where consecutive rows form one group (the ``rollout_n`` samples of a prompt).
A group whose scores are all equal (``max == min``) gets advantage exactly 0 from
every group estimator: in float32 the group mean of equal numbers is not always
bit-equal to them (six copies of -1.3 have a mean 1 ulp away), and dividing that
rounding residue by a tiny std would turn it into a large advantage.

:class:`AdvEstimator` is one registry entry; all share the call signature of its ``.fn``,
followed by the entry's own ``settings`` as keywords. :data:`BUILT_IN_ESTIMATORS` are this
module's; ``ppo.algos.advantage_registry.ADV_ESTIMATORS`` holds every one by name.
"""
import paddle

from .groups import group_view as _group_view
from .groups import zero_equal_groups as _zero_equal_groups
from .masked import _float_mask, _zero_outside, masked_whiten
from .pass_at_k import pass_at_k_advantages
from .setting import Setting, declared_settings

__all__ = [
    "gae_advantages_and_returns",
    "grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages_and_returns",
    "broadcast_sequence_advantages",
    "group_zero_std_fraction",
    "reinforce_pp_baseline_advantages",
    "AdvEstimator",
    "BUILT_IN_ESTIMATORS",
    "GAMMA",
    "GAE_LAMBDA",
]

GAMMA, GAE_LAMBDA = 1.0, 0.95
"""The default discount and GAE lambda (the PPO arguments' `gamma` and `gae_lambda`, and the functions' below)."""


def gae_advantages_and_returns(values, rewards, mask, gamma=GAMMA, gae_lambda=GAE_LAMBDA):
    """Generalised Advantage Estimation over response tokens.

    Formula, walking the masked tokens of each row backwards (t' = next masked token):
    ``delta_t = r_t + gamma * V_{t'} - V_t``, ``A_t = delta_t + gamma * lambda * A_{t'}``,
    with ``V`` and ``A`` after the last response token taken as 0; ``R_t = A_t + V_t``.
    Masked-out positions are skipped (neither read nor written), outputs are 0 there.
    ``gae_lambda`` is a number or a ``[B]`` tensor of one lambda per row (VAPO's length-adaptive
    GAE, ``ppo.algos.vapo``).
    Shapes: ``values``, ``rewards``, ``mask`` ``[B, T]`` -> ``(advantages, returns)`` ``[B, T]``.
    Implementation: reverse loop over ``T``, vectorised across ``B``; no gradient.
    Source: Schulman et al. 2016 (GAE); verl ``core_algos.compute_gae_advantage_return``
    (same skip-masked-token recursion); PaddleNLP ``PPOTrainer.get_advantages_and_returns``.
    """
    values = values.detach()
    rewards = rewards.detach().astype(values.dtype)
    m = _float_mask(mask, values).detach()
    keep = m != 0
    T = values.shape[-1]
    zeros = paddle.zeros_like(values[:, 0])
    next_value = zeros
    last_gae = zeros
    advs = [None] * T
    for t in reversed(range(T)):
        k = keep[:, t]
        v_t = values[:, t]
        delta = rewards[:, t] + gamma * next_value - v_t
        gae = delta + gamma * gae_lambda * last_gae
        advs[t] = paddle.where(k, gae, zeros)
        last_gae = paddle.where(k, gae, last_gae)
        next_value = paddle.where(k, v_t, next_value)
    advantages = paddle.stack(advs, axis=1)
    returns = _zero_outside(advantages + values, m)
    return advantages, returns


def grpo_advantages(scores, group_size, scale_by_std=True, eps=1e-6):
    """Group-relative advantages (GRPO), one per sequence.

    Formula, per group g of ``group_size`` consecutive rows:
    ``A_i = (s_i - mean_g) / (std_g + eps)`` with the unbiased std (``torch.std``
    default); with ``scale_by_std=False`` (Dr.GRPO) ``A_i = s_i - mean_g``.
    For ``group_size == 1`` the mean is taken as 0 and the std as 1 (as verl does).
    A group with all scores equal gets exactly 0 (see the module docstring), so the
    advantages agree with :func:`group_zero_std_fraction`.
    Shapes: ``scores`` ``[B]``, ``B = num_groups * group_size`` -> ``[B]``.
    Source: Shao et al. 2024 (DeepSeekMath, GRPO); Liu et al. 2025 (Dr.GRPO);
    verl ``core_algos.compute_grpo_outcome_advantage``; TRL ``GRPOTrainer``.
    """
    s = scores.detach()
    g = _group_view(s, group_size)
    if group_size == 1:
        adv = g
        if scale_by_std:
            adv = adv / (1.0 + eps)
        return adv.reshape([-1])
    mean = paddle.mean(g, axis=1, keepdim=True)
    adv = g - mean
    if scale_by_std:
        adv = adv / (_unbiased_std(g, adv) + eps)
    return _zero_equal_groups(adv, g).reshape([-1])


def _unbiased_std(g, centred):
    """``paddle.std(g, axis=1, unbiased=True, keepdim=True)`` from ``centred = g - mean``, the same
    sum of squares over ``n - 1`` (equal to the last bit), without ``paddle.var``'s integer
    division of its element counts, which makes Paddle log a type-promotion warning."""
    return paddle.sqrt(paddle.sum(centred**2, axis=1, keepdim=True) / (g.shape[1] - 1))


def group_zero_std_fraction(scores, group_size):
    """Fraction of groups whose scores are all equal (``grpo/frac_reward_zero_std``).

    Formula: ``mean_g [max_g(s) == min_g(s)]``. Shapes: ``scores`` ``[B]`` -> scalar.
    Source: TRL ``GRPOTrainer`` metric ``frac_reward_zero_std``.
    """
    g = _group_view(scores.detach(), group_size)
    same = paddle.max(g, axis=1) == paddle.min(g, axis=1)
    return paddle.mean(same.astype(scores.dtype))


def rloo_advantages(scores, group_size):
    """REINFORCE Leave-One-Out advantages, one per sequence.

    Formula: ``A_i = s_i - (sum_g - s_i) / (n - 1) = n / (n - 1) * (s_i - mean_g)``
    with ``n = group_size >= 2``; a group of equal scores gets exactly 0.
    Shapes: ``scores`` ``[B]`` -> ``[B]``.
    Source: Ahmadian et al. 2024 ("Back to Basics", RLOO); verl
    ``core_algos.compute_rloo_outcome_advantage``; TRL ``RLOOTrainer``.
    """
    if group_size < 2:
        raise ValueError(f"RLOO needs group_size >= 2, got {group_size}")
    g = _group_view(scores.detach(), group_size)
    baseline = (paddle.sum(g, axis=1, keepdim=True) - g) / (group_size - 1)
    return _zero_equal_groups(g - baseline, g).reshape([-1])


def reinforce_pp_baseline_advantages(scores, mask, group_size):
    """REINFORCE++-baseline: group-mean baseline, then whitening over the batch's tokens.

    Formula: ``a_i = s_i - mean_g`` (exactly 0 for a group of equal scores), copied
    onto the response tokens, then ``A = masked_whiten(a, mask)`` over all masked
    tokens of the batch (mean and unbiased variance over tokens, so long responses
    weigh more, as in verl).
    Shapes: ``scores`` ``[B]``, ``mask`` ``[B, T]`` -> ``[B, T]`` (0 outside the mask).
    Source: Hu 2025 (REINFORCE++); verl
    ``core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage``
    (``scores - mean_g``, then ``masked_whiten``).
    """
    g = _group_view(scores.detach(), group_size)
    centered = g - paddle.mean(g, axis=1, keepdim=True)
    seq = _zero_equal_groups(centered, g).reshape([-1])
    return masked_whiten(broadcast_sequence_advantages(seq, mask), mask)


def reinforce_pp_advantages_and_returns(rewards, mask, gamma=GAMMA):
    """REINFORCE++ advantages: whitened discounted returns of the token rewards.

    Formula, walking the masked tokens backwards (t' = next masked token):
    ``G_t = r_t + gamma * G_{t'}`` (0 after the last response token);
    ``A = masked_whiten(G, mask)`` (batch-level statistics over masked tokens).
    Masked-out positions are skipped; both outputs are 0 there.
    Interior holes (mask 0 between response tokens, e.g. tool output in a multi-turn
    response) are skipped like padding: the return CARRIES across them, so tokens
    before a hole still see the outcome reward after it (the same skip convention as
    :func:`gae_advantages_and_returns`). verl resets the running return at every
    masked token (``running_return * response_mask``), which gives the turns before a
    hole zero return when the only reward is at the end; we deliberately do not.
    Shapes: ``rewards``, ``mask`` ``[B, T]`` -> ``(advantages, returns)`` ``[B, T]``.
    Source: Hu 2025 (REINFORCE++); verl
    ``core_algos.compute_reinforce_plus_plus_outcome_advantage``; OpenRLHF
    ``get_cumulative_returns``.
    """
    rewards = rewards.detach()
    m = _float_mask(mask, rewards).detach()
    keep = m != 0
    T = rewards.shape[-1]
    zeros = paddle.zeros_like(rewards[:, 0])
    running = zeros
    rets = [None] * T
    for t in reversed(range(T)):
        k = keep[:, t]
        g = rewards[:, t] + gamma * running
        rets[t] = paddle.where(k, g, zeros)
        running = paddle.where(k, g, running)
    returns = paddle.stack(rets, axis=1)
    advantages = masked_whiten(returns, m)
    return advantages, returns


def broadcast_sequence_advantages(adv, mask):
    """Copy one advantage per sequence onto its response tokens.

    Formula: ``out[b, t] = adv[b] * [mask[b, t] != 0]``.
    Shapes: ``adv`` ``[B]``, ``mask`` ``[B, T]`` -> ``[B, T]`` (0 outside the mask).
    Source: verl ``compute_grpo_outcome_advantage`` (``scores.unsqueeze(-1) * response_mask``).
    """
    m = _float_mask(mask, adv)
    full = adv.reshape([-1, 1]).expand(m.shape)
    return _zero_outside(full, m)


def _sequence_scores(rewards, mask):
    """One score per row: the sum of its masked token rewards ``[B, T]`` -> ``[B]``."""
    m = _float_mask(mask, rewards)
    return paddle.sum(_zero_outside(rewards, m), axis=-1)


def _gae(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std):
    return gae_advantages_and_returns(values, rewards, mask, gamma=gamma, gae_lambda=gae_lambda)


def _grpo(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std):
    adv = grpo_advantages(_sequence_scores(rewards, mask), group_size, scale_by_std=scale_by_std)
    return broadcast_sequence_advantages(adv, mask), None


def _rloo(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std):
    adv = rloo_advantages(_sequence_scores(rewards, mask), group_size)
    return broadcast_sequence_advantages(adv, mask), None


def _reinforce_pp(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std):
    return reinforce_pp_advantages_and_returns(rewards, mask, gamma=gamma)


def _reinforce_pp_baseline(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std):
    return reinforce_pp_baseline_advantages(_sequence_scores(rewards, mask), mask, group_size), None


def _pass_at_k(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std, pass_k, pass_k_threshold):
    adv = pass_at_k_advantages(_sequence_scores(rewards, mask), group_size, pass_k, pass_k_threshold,
                               scale_by_std=scale_by_std)
    return broadcast_sequence_advantages(adv, mask), None


class AdvEstimator:
    """One advantage estimator and the facts the trainer and argument checks need.

    ``fn(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std)`` ->
    ``(advantages [B, T], returns [B, T] or None)``: ``rewards`` are the token rewards
    ``[B, T]`` (KL part plus the score at the last token); group estimators score a
    row by the sum of its masked rewards. ``values`` ``[B, T]`` is None unless
    ``needs_critic``.
    ``needs_critic``: a value model is trained (returns are its targets).
    ``per_group``: advantages are relative to the ``group_size`` consecutive samples
    of a prompt, so ``rollout_n >= min_group_size`` and group metrics apply.
    ``whitens``: the default of ``normalize_advantage`` (the trainer then whitens the
    advantages over the batch's response tokens): true for GAE; the others are used as
    computed unless asked (group estimators are already relative to their group, as
    verl and TRL use GRPO/RLOO; REINFORCE++ whitens inside). An explicit
    ``normalize_advantage: true`` whitens any estimator's advantages, as PaddleNLP does.
    ``settings``: the estimator's own arguments beyond the shared ones, each a
    :class:`~ppo.algos.setting.Setting` (``pass_at_k``: ``pass_k``, ``pass_k_threshold``; the
    argument of that name is generated from it) or a dict name -> default;
    ``self.settings`` is name -> default, ``self.declared`` the declarations. The caller
    passes exactly these as keywords (unknown ones are an error), ``fn`` receives every one.
    """

    __slots__ = ("name", "fn", "needs_critic", "per_group", "whitens", "min_group_size", "settings", "declared")

    def __init__(self, name, fn, needs_critic, per_group, whitens, min_group_size=1, settings=None):
        self.name, self.fn = name, fn
        self.needs_critic, self.per_group, self.whitens = bool(needs_critic), bool(per_group), bool(whitens)
        self.min_group_size = int(min_group_size)
        self.settings, self.declared = declared_settings(settings or {})

    def __repr__(self):
        return (f"AdvEstimator({self.name!r}, needs_critic={self.needs_critic}, per_group={self.per_group}, "
                f"whitens={self.whitens}, min_group_size={self.min_group_size}, settings={self.settings})")

    def settings_from(self, args):
        """``{name: getattr(args, name)}`` for this entry's settings (e.g. the trainer's arguments)."""
        return {name: getattr(args, name) for name in self.settings}

    def __call__(self, rewards, mask, values=None, group_size=1, gamma=GAMMA, gae_lambda=GAE_LAMBDA, scale_by_std=True,
                 **settings):
        if self.needs_critic and values is None:
            raise ValueError(f"adv_estimator {self.name!r} needs critic values")
        if group_size < self.min_group_size:
            raise ValueError(f"adv_estimator {self.name!r} needs group_size >= {self.min_group_size}, got {group_size}")
        unknown = sorted(set(settings) - set(self.settings))
        if unknown:
            raise ValueError(f"adv_estimator {self.name!r} takes no {unknown}; its settings: {sorted(self.settings)}")
        return self.fn(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std, **{**self.settings, **settings})


BUILT_IN_ESTIMATORS = (
    AdvEstimator("gae", _gae, needs_critic=True, per_group=False, whitens=True),
    AdvEstimator("grpo", _grpo, needs_critic=False, per_group=True, whitens=False, min_group_size=2),
    AdvEstimator("rloo", _rloo, needs_critic=False, per_group=True, whitens=False, min_group_size=2),
    AdvEstimator("reinforce_pp", _reinforce_pp, needs_critic=False, per_group=False, whitens=False),
    AdvEstimator("reinforce_pp_baseline", _reinforce_pp_baseline, needs_critic=False, per_group=True, whitens=False,
                 min_group_size=2),
    AdvEstimator("pass_at_k", _pass_at_k, needs_critic=False, per_group=True, whitens=False, min_group_size=2,
                 settings=(Setting("pass_k", int, 4, "adv_estimator pass_at_k: the k of pass@k (1 <= k <= rollout_n).",
                                   bounds=(1, True, None, False)),
                           Setting("pass_k_threshold", float, 0.5,
                                   "adv_estimator pass_at_k: a response scoring above this counts as correct."))),
)
"""The estimators of this module; ``ppo.algos.advantage_registry.ADV_ESTIMATORS`` registers them
with the ones other modules define (VAPO's, ``ppo.algos.vapo``)."""
