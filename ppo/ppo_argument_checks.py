"""Checks of the PPO/GRPO arguments (`ppo/ppo_arguments.py`), each returning a list of problems.

The per-group checks run in the dataclasses' `__post_init__`; `validate_arguments` holds
the checks that need several groups or the file system, and runs before any model loads.
"""
from .algos import ADV_ESTIMATORS, IMPORTANCE_SAMPLING_LEVELS, LOSS_AGG_MODES, get_adv_estimator
from .algos.kl import K3_NAMES, KL_ESTIMATOR_NAMES
from .common import paddlenlp_keys as pk
from .common import validation
from .common.report_writers import LOOP_PACKAGES, missing_report_packages
from .trainer.best_policy import EVAL_METRICS, eval_metric_name


def score_source_problems(model_args):
    """One source of scores: a reward model, a reward server or rule scorers (with valid lists)."""
    if not model_args.use_rule_reward:
        if model_args.rule_reward_scorers or model_args.rule_reward_weights:
            return ["rule_reward_scorers / rule_reward_weights are only used with use_rule_reward true"]
        return []
    problems = []
    if model_args.use_rm_server:
        problems.append("use_rule_reward and use_rm_server both set: choose one source of scores")
    if model_args.reward_model_name_or_path:
        problems.append(f"use_rule_reward is set but reward_model_name_or_path={model_args.reward_model_name_or_path!r} "
                        "too: choose one source of scores")
    from .scorers import parse_scorer_list

    try:
        parse_scorer_list(model_args.rule_reward_scorers, model_args.rule_reward_weights)
    except ValueError as err:
        problems.append(f"rule_reward_scorers / rule_reward_weights: {err}")
    return problems


def estimator_problems(args):
    """`adv_estimator` is registered, has the group it needs, and dynamic sampling has groups."""
    if args.adv_estimator not in ADV_ESTIMATORS:
        return [f"adv_estimator must be one of {sorted(ADV_ESTIMATORS)}, got {args.adv_estimator!r}"]
    estimator = get_adv_estimator(args.adv_estimator)
    problems = []
    if estimator.per_group and isinstance(args.rollout_n, int) and 0 < args.rollout_n < estimator.min_group_size:
        problems.append(f"adv_estimator {args.adv_estimator} needs rollout_n >= {estimator.min_group_size} (a group), "
                        f"got {args.rollout_n}")
    if args.dynamic_sampling and not estimator.per_group:
        problems.append(f"dynamic_sampling drops zero-variance groups; adv_estimator {args.adv_estimator} has no groups")
    return problems


def kl_problems(args):
    """KL estimator names (`ppo.algos.kl.KL_ESTIMATOR_NAMES`), the k3 clamp and the adaptive controller."""
    problems = [f"{name} must be one of {KL_ESTIMATOR_NAMES}, got {getattr(args, name)!r}"
                for name in ("kl_estimator", "kl_loss_type") if getattr(args, name) not in KL_ESTIMATOR_NAMES]
    if args.kl_clamp is not None:
        if not args.kl_clamp > 0:
            problems.append(f"kl_clamp must be positive, got {args.kl_clamp}")
        if not any(getattr(args, n) in K3_NAMES for n in ("kl_estimator", "kl_loss_type")):
            problems.append("kl_clamp clamps the k3 (low_var_kl) estimator; neither kl_estimator nor kl_loss_type is k3")
    if args.target_kl is not None:
        if not args.target_kl > 0 or not args.kl_horizon > 0:
            problems.append(f"target_kl and kl_horizon must be positive, got {args.target_kl}, {args.kl_horizon}")
        if not args.kl_coeff > 0:
            problems.append("target_kl adapts kl_coeff (the reward KL penalty), which must start positive")
    return problems


def loss_problems(args):
    """Loss aggregation, its scale, the importance-sampling level, offloading and the DAPO buffer."""
    problems = []
    if args.loss_agg_mode not in LOSS_AGG_MODES:
        problems.append(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {args.loss_agg_mode!r}")
    if args.loss_scale_factor is not None and not args.loss_scale_factor > 0:
        problems.append(f"loss_scale_factor must be positive, got {args.loss_scale_factor}")
    if args.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        problems.append(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                        f"got {args.importance_sampling_level!r}")
    from .offload import parse_offload_level

    try:
        parse_offload_level(args.offload_level)
    except ValueError as err:
        problems.append(str(err))
    if args.enable_overlong_reward_buffer and not 0 < args.overlong_reward_buffer <= args.max_dec_len:
        problems.append(f"overlong_reward_buffer must be in (0, max_dec_len={args.max_dec_len}], got {args.overlong_reward_buffer}")
    return problems


def batch_problems(args):
    """The rollout batch splits into whole optimiser steps, and the run has a step to train
    (sizes below their minimum are reported by `validation.size_problems`)."""
    problems = []
    rollout = args.per_device_prompt_batch_size * args.rollout_n
    micro = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if rollout > 0 and micro > 0 and rollout % micro:
        problems.append(f"per_device_prompt_batch_size*rollout_n ({rollout}) must be a multiple of "
                        f"per_device_train_batch_size*gradient_accumulation_steps ({micro})")
    if args.max_steps == 0:
        problems.append("max_steps 0 would train no step; give a positive max_steps, or -1 with num_train_epochs")
    if args.max_steps < 0 and args.num_train_epochs <= 0:
        problems.append(f"max_steps -1 trains num_train_epochs epochs, which must be > 0, got {args.num_train_epochs}")
    return problems


def paddlenlp_setting_problems(args):
    """PaddleNLP TrainingArguments values the PPO loop does not run (`report_to all` resolves to
    the installed integrations only here)."""
    problems = pk.ppo_value_problems(args) + best_policy_problems(args)
    unknown = [name for name in args.report_to if name not in LOOP_PACKAGES and name != "none"]
    if unknown:
        problems.append(f"report_to {unknown}: the PPO/GRPO loop reports to {sorted(LOOP_PACKAGES)} (and metrics.jsonl)")
    problems += missing_report_packages(args.report_to, LOOP_PACKAGES)
    if args.bf16 or args.fp16:
        if str(args.fp16_opt_level).upper() != "O2":
            problems.append(
                f"fp16_opt_level {args.fp16_opt_level!r} with bf16/fp16: PaddleNLP's O1 autocasts float32 models; the PPO "
                "loop loads the models in bf16/fp16 with float32 master weights in the optimizer, which is O2: set O2"
            )
        if args.amp_master_grad:
            problems.append("amp_master_grad (PaddleNLP: float32 gradients for the master weights) is not supported by the PPO loop")
    return problems


def best_policy_problems(args):
    """`load_best_model_at_end` needs evaluations during training and a metric they report."""
    if not args.load_best_model_at_end:
        return []
    problems = []
    if not args.evaluates:
        problems.append("load_best_model_at_end picks the best evaluated policy: set do_eval true, evaluation_strategy "
                        "steps and eval_steps > 0")
    if eval_metric_name(args.metric_for_best_model or "loss") not in EVAL_METRICS:
        problems.append(f"metric_for_best_model {args.metric_for_best_model!r}: the PPO/GRPO evaluation reports "
                        f"{', '.join(EVAL_METRICS)} (eval/accuracy* with reference answers)")
    return problems


def model_path_problems(model_args, training_args):
    """The model paths a run needs: the actor, a reward model unless scores come from a server
    or rules, and a critic initialisation for estimators with a critic."""
    problems = validation.required_problems(model_args, ["actor_model_name_or_path"])
    if not model_args.external_scores:
        problems += validation.required_problems(
            model_args, ["reward_model_name_or_path"], " unless use_rm_server or use_rule_reward is set")
    uses_critic = training_args.adv_estimator in ADV_ESTIMATORS and training_args.use_critic
    if uses_critic and not (model_args.reward_critic_model_name_or_path or model_args.reward_model_name_or_path):
        problems.append(f"adv_estimator {training_args.adv_estimator} needs a critic: set reward_critic_model_name_or_path "
                        "or reward_model_name_or_path")
    return problems


def validate_arguments(model_args, data_args, training_args):
    """Every cross-group and file-system problem of a PPO/GRPO run, before any model loads."""
    model_dirs = [(f"{n}_model_name_or_path", getattr(model_args, f"{n}_model_name_or_path"))
                  for n in ("actor", "reference", "reward_critic")]
    score_dirs = [] if model_args.external_scores else [("reward_model_name_or_path", model_args.reward_model_name_or_path)]
    problems = validation.size_problems(model_args, data_args, training_args)
    problems += model_path_problems(model_args, training_args)
    problems += validation.model_dir_problems(model_dirs, score_dirs)
    problems += validation.output_dir_problems(training_args.output_dir, model_dirs + score_dirs)
    problems += validation.dtype_device_problems(training_args)
    problems += validation.pipeline_problems(training_args, model_args.use_lora)
    if training_args.load_best_model_at_end and not data_args.eval_datasets:
        problems.append("load_best_model_at_end picks the best evaluated policy: give eval_datasets")
    return problems
