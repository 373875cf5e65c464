"""Each part of the online loop is built from its slice of the arguments: a frozen dataclass
naming the fields it reads (`slice_of` fills one from the parsed arguments), so that a reader
sees what a part depends on, and a part cannot read what it was not given. A field the entry
point's arguments do not have keeps its default here (online DPO has no critic settings)."""
from dataclasses import dataclass, fields
from typing import Optional

from ..algos import POLICY_LOSSES
from ..common.registry_settings import collect_settings, settings_dataclass


def slice_of(cls, args, **given):
    """`cls` (a dataclass of this module) with each field read from `args` by name (properties
    included), `given` overriding; fields `args` lacks keep their defaults."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if f.name not in given and hasattr(args, f.name)}
    return cls(**values, **given)


@dataclass(frozen=True)
class RolloutSettings:
    """The rollout: samples per prompt, the sampling seed, whether the engine's log-probs serve
    as old log-probs (or are kept for the rollout correction `rollout_is`), and DAPO's dynamic
    sampling and the data-rank balance."""

    rollout_n: int
    seed: int
    per_device_prompt_batch_size: int
    use_rollout_logprobs: bool = False
    rollout_is: str = "none"
    dynamic_sampling: bool = False
    max_gen_batches: int = 1
    balance_batch: bool = False


@dataclass(frozen=True)
class PenaltySettings:
    """What is taken off or added to the reward's scores: `missing_eos_penalty`, DAPO's overlong buffer."""

    missing_eos_penalty: float = 0.0
    enable_overlong_reward_buffer: bool = False
    max_dec_len: int = 0
    overlong_reward_buffer: int = 0
    overlong_penalty_factor: float = 1.0


@dataclass(frozen=True)
class AdvantageSettings:
    """Token rewards and advantages: the KL in the rewards, the score clip, the estimator's
    settings, whitening, masking of truncated responses, and the rollout correction's weights."""

    kl_coeff: float
    kl_loss_coeff: float
    kl_estimator: str
    kl_clamp: Optional[float]
    clip_range_score: float
    rollout_n: int
    gamma: float
    gae_lambda: float
    scale_reward_std: bool
    normalize_advantage: bool
    mask_truncated_completions: bool
    reuse_first_update_forward: bool
    update_micro_rows: int
    rollout_is: str
    rollout_is_threshold: Optional[float]
    rollout_is_lower: Optional[float]
    rollout_is_upper: Optional[float]
    pretrain_critic_steps: int = 0


@dataclass(frozen=True)
class UpdateOptions:
    """The PPO-family update: epochs and their optimiser steps, the loss terms and their
    aggregation, VAPO's value pretraining (its returns' `gamma`) and positive-example NLL. The
    policy loss is `policy_loss` (a name of `ppo.algos.POLICY_LOSSES` or `module.path:NAME`) with
    `policy_settings`, its own settings (name -> value); `UpdateSettings` adds a field per setting
    the registered losses declare."""

    update_iters: int
    update_micro_rows: int
    update_accumulation_steps: int
    seed: int
    loss_agg_mode: Optional[str]
    loss_scale: float
    policy_loss: str
    top_entropy_frac: float
    top_entropy_norm: str
    pg_loss_coeff: float
    entropy_coeff: float
    kl_loss_coeff: float
    kl_loss_type: str
    kl_clamp: Optional[float]
    clip_range_value: float
    ptx_coeff: float
    gamma: float = 1.0
    pretrain_critic_steps: int = 0
    positive_example_lm_coeff: float = 0.0
    positive_example_min_score: float = 1.0
    policy_settings: Optional[dict] = None


UpdateSettings = settings_dataclass(
    "UpdateSettings", collect_settings(POLICY_LOSSES).values(), (UpdateOptions,), __name__,
    "`UpdateOptions` and a field per setting the registered policy losses declare (`ppo.algos.Setting`); "
    "`policy_settings` (filled from the arguments' property of that name) holds the chosen loss's, "
    "an outside entry's included.", frozen=True)


@dataclass(frozen=True)
class LoopSettings:
    """The loop around steps: when it logs, samples, evaluates, saves and stops."""

    output_dir: str
    logging_dir: str
    report_to: object
    run_name: Optional[str]
    logging_steps: int
    logging_first_step: bool
    num_sample_generations: int
    evaluates: bool
    eval_steps: int
    saves_checkpoints: bool
    save_steps: int
    disable_tqdm: bool
    stop_on_divergence: bool = False


@dataclass(frozen=True)
class CheckpointSettings:
    """Where checkpoints go and how a run resumes."""

    output_dir: str
    overwrite_output_dir: bool
    resume_from_checkpoint: Optional[str]
    save_total_limit: Optional[int]
    ignore_save_lr_and_optim: bool


@dataclass(frozen=True)
class EvalSettings:
    """The evaluation: greedy answers (and `eval_num_samples` sampled ones) to the eval prompts."""

    per_device_eval_batch_size: int
    eval_max_new_tokens: int
    max_dec_len: int
    seed: int
    eval_num_samples: int = 0
