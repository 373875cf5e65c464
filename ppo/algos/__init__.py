"""Pure math of the toolkit: masked reductions, KL, advantages, losses (policy-loss registry,
rollout-mismatch correction), normalisers.

Plain functions on paddle tensors; no models, I/O or distributed calls, no
``.item()``, inputs never written into (tests/test_algos_purity.py checks this).
"""
from .advantage import (
    AdvEstimator,
    broadcast_sequence_advantages,
    gae_advantages_and_returns,
    group_zero_std_fraction,
    grpo_advantages,
    reinforce_pp_advantages_and_returns,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from .advantage_registry import ADV_ESTIMATORS, get_adv_estimator
from .kl import K3_NAMES, KL_ESTIMATOR_NAMES, KL_ESTIMATORS, AdaptiveKLController, FixedKLController, kl_penalty, kl_shaped_rewards, last_token_mask
from .losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_AGG_MODES,
    aggregate_loss,
    ppo_clip_token_losses,
    ratio_stats,
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
from .pass_at_k import pass_at_k_advantages
from .process_reward import (
    PRM_REDUCTIONS,
    add_to_last_step,
    process_group_advantages,
    process_reward_loss,
    reduce_step_scores,
    step_token_rewards,
)
from .vapo import (
    in_value_pretraining,
    length_adaptive_lambda,
    positive_example_nll,
    vapo_advantages_and_returns,
    value_pretraining_targets,
)
from .token_selection import count_from_fraction, high_entropy_mask, top_k_mask
from .policy_losses import cispo_token_losses, gmpo_token_losses
from .covariance_losses import clip_cov_token_losses, kl_cov_token_losses, token_covariance
from .setting import Setting
from .policy_registry import POLICY_LOSSES, TOP_ENTROPY_NORMS, PolicyLoss, get_policy_loss, policy_loss_table
from .rollout_correction import ROLLOUT_IS_LEVELS, rollout_correction, rollout_is_weights, rollout_mismatch_metrics
from .lagrangian import LagrangeMultiplier, combined_advantages, lagrange_multiplier_step
from .lm_head import token_logprobs_from_hidden
from .distill import (
    bucket_divergence,
    full_terms,
    generalized_jsd,
    generalized_jsd_grad,
    generalized_jsd_top_k,
    teacher_top_k,
    top_k_buckets,
    top_k_grad,
    top_k_terms,
)
from .judge_scores import expected_score, order_averaged_preference, verdict_probability
from .distill_hidden import TeacherHead, TeacherTopK, gjsd_from_hidden, teacher_top_k_from_hidden
from .vocab_parallel import vocab_parallel_logprobs_from_hidden, vocab_parallel_token_logprobs
from .masked import (
    last_nonzero_index,
    masked_centered_square_sum,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    whiten_with_statistics,
    zero_masked_inputs,
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
    PREFERENCE_SETTINGS,
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
    "zero_masked_inputs",
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
    "pass_at_k_advantages",
    # VAPO (value pretraining, decoupled and length-adaptive GAE, positive-example LM loss)
    "in_value_pretraining",
    "length_adaptive_lambda",
    "positive_example_nll",
    "vapo_advantages_and_returns",
    "value_pretraining_targets",
    # process reward models
    "PRM_REDUCTIONS",
    "process_group_advantages",
    "process_reward_loss",
    "add_to_last_step",
    "reduce_step_scores",
    "step_token_rewards",
    # losses
    "LOSS_AGG_MODES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "entropy_bonus_from_token_entropy",
    "entropy_bonus_loss",
    "aggregate_loss",
    "ppo_policy_loss",
    "ppo_clip_token_losses",
    "ratio_stats",
    "value_loss",
    "kl_loss",
    "entropy_from_logits",
    "token_logprobs",
    "sequence_logprobs",
    "sft_loss",
    # policy-loss registry and its losses, token selection
    "POLICY_LOSSES",
    "TOP_ENTROPY_NORMS",
    "PolicyLoss",
    "get_policy_loss",
    "Setting",
    "policy_loss_table",
    "cispo_token_losses",
    "gmpo_token_losses",
    "clip_cov_token_losses",
    "kl_cov_token_losses",
    "token_covariance",
    "top_k_mask",
    "count_from_fraction",
    "high_entropy_mask",
    # rollout correction (training/rollout mismatch)
    "ROLLOUT_IS_LEVELS",
    "rollout_correction",
    "rollout_is_weights",
    "rollout_mismatch_metrics",
    # lagrangian (PPO-Lagrangian, Safe RLHF)
    "LagrangeMultiplier",
    "combined_advantages",
    "lagrange_multiplier_step",
    # lm_head
    "token_logprobs_from_hidden",
    # distill (GKD's generalised JSD)
    "bucket_divergence",
    "full_terms",
    "generalized_jsd",
    "generalized_jsd_grad",
    "generalized_jsd_top_k",
    "teacher_top_k",
    "top_k_buckets",
    "top_k_grad",
    "top_k_terms",
    "TeacherHead",
    "TeacherTopK",
    "gjsd_from_hidden",
    "teacher_top_k_from_hidden",
    # judge_scores (a generative judge's verdict)
    "verdict_probability",
    "expected_score",
    "order_averaged_preference",
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
    "PREFERENCE_SETTINGS",
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
