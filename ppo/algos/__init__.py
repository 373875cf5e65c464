"""Pure math of the toolkit: masked reductions, KL, advantages, losses, normalisers.

Plain functions on paddle tensors; no models, I/O or distributed calls, no
``.item()``, inputs never written into (tests/test_algos_purity.py checks this).
"""
from .advantage import (
    ADV_ESTIMATORS,
    AdvEstimator,
    broadcast_sequence_advantages,
    gae_advantages_and_returns,
    get_adv_estimator,
    group_zero_std_fraction,
    grpo_advantages,
    reinforce_pp_advantages_and_returns,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from .kl import K3_NAMES, KL_ESTIMATOR_NAMES, KL_ESTIMATORS, AdaptiveKLController, FixedKLController, kl_penalty, kl_shaped_rewards, last_token_mask
from .losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_AGG_MODES,
    aggregate_loss,
    entropy_bonus_from_token_entropy,
    entropy_bonus_loss,
    entropy_from_logits,
    kl_loss,
    ppo_policy_loss,
    sequence_logprobs,
    sft_loss,
    token_logprobs,
    value_loss,
)
from .lagrangian import LagrangeMultiplier, combined_advantages, lagrange_multiplier_step, lagrangian_shaped_rewards
from .lm_head import token_logprobs_from_hidden
from .vocab_parallel import vocab_parallel_logprobs_from_hidden, vocab_parallel_token_logprobs
from .masked import (
    last_nonzero_index,
    masked_centered_square_sum,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    whiten_with_statistics,
)
from .normalizer import (
    NORMALIZERS,
    ExponentialMovingAverage,
    IdentityNormalizer,
    RunningMeanStd,
    batch_moments,
    build_normalizer,
)
from .shaping import overlong_penalty, truncated_completion_mask
from .cost import cost_metrics, pairwise_cost_loss, tokenwise_pairwise_cost_loss
from .preference import (
    kto_kl_reference_point,
    kto_loss,
    log1mexp,
    pair_divergence_span,
    pairwise_reward_loss,
    scores_at,
    tokenwise_pairwise_reward_loss,
)
from .preference_registry import (
    DATA_KINDS,
    PREFERENCE_HYPERPARAMETERS,
    PREFERENCE_LOSSES,
    PreferenceInputs,
    PreferenceLoss,
    get_preference_loss,
    preference_loss_table,
)

__all__ = [
    # masked
    "last_nonzero_index",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "masked_centered_square_sum",
    "whiten_with_statistics",
    # kl
    "KL_ESTIMATORS",
    "KL_ESTIMATOR_NAMES",
    "K3_NAMES",
    "kl_penalty",
    "kl_shaped_rewards",
    "last_token_mask",
    "AdaptiveKLController",
    "FixedKLController",
    # advantage
    "ADV_ESTIMATORS",
    "AdvEstimator",
    "reinforce_pp_baseline_advantages",
    "get_adv_estimator",
    "gae_advantages_and_returns",
    "grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages_and_returns",
    "broadcast_sequence_advantages",
    "group_zero_std_fraction",
    # losses
    "LOSS_AGG_MODES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "entropy_bonus_from_token_entropy",
    "entropy_bonus_loss",
    "aggregate_loss",
    "ppo_policy_loss",
    "value_loss",
    "kl_loss",
    "entropy_from_logits",
    "token_logprobs",
    "sequence_logprobs",
    "sft_loss",
    # lagrangian (PPO-Lagrangian, Safe RLHF)
    "LagrangeMultiplier",
    "combined_advantages",
    "lagrange_multiplier_step",
    "lagrangian_shaped_rewards",
    # lm_head
    "token_logprobs_from_hidden",
    # vocab_parallel
    "vocab_parallel_token_logprobs",
    "vocab_parallel_logprobs_from_hidden",
    # preference
    "pairwise_reward_loss",
    "tokenwise_pairwise_reward_loss",
    "pair_divergence_span",
    "scores_at",
    "kto_kl_reference_point",
    "kto_loss",
    "log1mexp",
    "DATA_KINDS",
    "PREFERENCE_HYPERPARAMETERS",
    "PREFERENCE_LOSSES",
    "PreferenceInputs",
    "PreferenceLoss",
    "get_preference_loss",
    "preference_loss_table",
    # cost (Safe RLHF)
    "pairwise_cost_loss",
    "tokenwise_pairwise_cost_loss",
    "cost_metrics",
    # shaping
    "overlong_penalty",
    "truncated_completion_mask",
    # normalizer
    "batch_moments",
    "RunningMeanStd",
    "ExponentialMovingAverage",
    "IdentityNormalizer",
    "NORMALIZERS",
    "build_normalizer",
]
