"""Checks of the PPO/GRPO arguments (`ppo/entry/ppo_arguments.py`), each returning a list of problems.

The per-group checks run in the dataclasses' `__post_init__`; `validate_arguments` holds
the checks that need several groups or the file system, and runs before any model loads.
"""
import json

from ..strategy import expert_layout_problems, expert_model_problems, tensor_model_problems
from ..algos import ADV_ESTIMATORS, LOSS_AGG_MODES, AdvEstimator, get_adv_estimator
from ..agents.arguments import agent_problems
from ..algos.kl import K3_NAMES, KL_ESTIMATOR_NAMES
from ..common import paddlenlp_keys as pk
from ..common import validation
from ..common.plugins import find_entry
from ..common.registry_settings import typed_value_problem
from ..common.report_writers import LOOP_PACKAGES, missing_report_packages
from .argument_groups import split_specs
from .routing_replay_arguments import routing_replay_problems
from ..models.hf_import import hf_config_problems
from .paddlenlp_rl_arguments import process_reward_model_problems
from ..trainer.best_policy import EVAL_METRICS, eval_metric_name
from ..trainer.env_reward import env_reward_problems

PPO_FIELD_CHOICES = {
    "adv_estimator": ("ppo.algos.advantage_registry:ADV_ESTIMATORS", "module.path:NAME of an AdvEstimator"),
    "kl_estimator": "ppo.algos.kl:KL_ESTIMATOR_NAMES", "kl_loss_type": "ppo.algos.kl:KL_ESTIMATOR_NAMES",
    "loss_agg_mode": "ppo.algos.losses:LOSS_AGG_MODES",
    "eval_mode": "ppo.entry.ppo_argument_checks:EVAL_MODES",
    "critic_recompute_granularity": "ppo.entry.argument_groups:RECOMPUTE_GRANULARITIES",
}
"""`PPOTrainingArguments.field_choices`: the fields whose names `ppo/common/early_values.py` checks
before Paddle loads, each with the `module:NAME` of the names its check below reads."""
EVAL_MODES = ("", "single", "tensor_parallel")
"""Generation layouts of a tensor-parallel model (PaddleNLP's `eval_mode`): '' and single gather
the whole weights on every rank, tensor_parallel keeps each rank's slices."""


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
    from ..scorers import get_scorer, parse_scorer_list

    try:
        names, _ = parse_scorer_list(model_args.rule_reward_scorers, model_args.rule_reward_weights)
        for name in names:
            get_scorer(name)  # an unknown name, or a module of one's own that cannot be imported
    except ValueError as err:
        problems.append(f"rule_reward_scorers / rule_reward_weights: {err}")
    return problems


def find_adv_estimator(name):
    """The `ppo.algos.AdvEstimator` of `adv_estimator`: a registered name, or `module.path:NAME`
    naming an entry in a module of one's own (imported here). ValueError when neither."""
    module_name, _, attr = str(name).partition(":")
    if name in ADV_ESTIMATORS or not (module_name and attr):
        return get_adv_estimator(name)
    return find_entry(name, ADV_ESTIMATORS, AdvEstimator, "adv_estimator")


def estimator_settings(args):
    """The chosen estimator's own settings (`AdvEstimator.settings`, name -> default): each from
    the argument of that name when there is one, then from `adv_estimator_settings` (a JSON
    object), else its default."""
    entry = find_adv_estimator(args.adv_estimator)
    given = json.loads(args.adv_estimator_settings) if args.adv_estimator_settings else {}
    return {name: given.get(name, getattr(args, name, default)) for name, default in entry.settings.items()}


def estimator_settings_problems(args, entry):
    """`adv_estimator_settings` is a JSON object naming only the chosen estimator's settings."""
    if not args.adv_estimator_settings:
        return []
    try:
        given = json.loads(args.adv_estimator_settings)
    except ValueError as err:
        return [f"adv_estimator_settings must be a JSON object, got {args.adv_estimator_settings!r} ({err})"]
    if not isinstance(given, dict):
        return [f"adv_estimator_settings must be a JSON object of name -> value, got {args.adv_estimator_settings!r}"]
    unknown = sorted(set(given) - set(entry.settings))
    if unknown:
        return [f"adv_estimator_settings: adv_estimator {args.adv_estimator} takes no {unknown} "
                f"(its settings: {sorted(entry.settings) or 'none'})"]
    declared = [(s, given[s.name]) for s in entry.declared if s.name in given]  # the declaration checks this route too
    return [f"adv_estimator_settings: {p}" for s, value in declared for p in [typed_value_problem(s, value)] if p]


def estimator_problems(args):
    """`adv_estimator` is registered (or a `module.path:NAME` entry), has the group it needs,
    dynamic sampling has groups, and `adv_estimator_settings` names its own settings."""
    try:
        estimator = find_adv_estimator(args.adv_estimator)
    except ValueError as err:
        return [f"adv_estimator must be one of {sorted(ADV_ESTIMATORS)} or module.path:NAME of an AdvEstimator, "
                f"got {args.adv_estimator!r} ({err})"]
    problems = estimator_settings_problems(args, estimator)
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


def generation_problems(args):
    """The rollout engine's settings: `eval_mode` is a layout it has (the engine itself takes
    the resulting `keep_tensor_parallel` flag and checks nothing at run time)."""
    if args.eval_mode not in EVAL_MODES:
        return [f"eval_mode must be one of {EVAL_MODES}, got {args.eval_mode!r}"]
    return []


def loss_problems(args):
    """Loss aggregation, its scale, offloading and the DAPO buffer."""
    problems = []
    if args.loss_agg_mode is not None and args.loss_agg_mode not in LOSS_AGG_MODES:
        problems.append(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {args.loss_agg_mode!r}")
    if args.loss_scale_factor is not None and not args.loss_scale_factor > 0:
        problems.append(f"loss_scale_factor must be positive, got {args.loss_scale_factor}")
    from ..optimization.offload import parse_offload_level

    try:
        parse_offload_level(args.offload_level)
    except ValueError as err:
        problems.append(str(err))
    if args.enable_overlong_reward_buffer and not 0 < args.overlong_reward_buffer <= args.max_dec_len:
        problems.append(f"overlong_reward_buffer must be in (0, max_dec_len={args.max_dec_len}], got {args.overlong_reward_buffer}")
    return problems


def prompt_batch_problems(args):
    """PaddleNLP's `global_batch_size` splits evenly over the data-parallel ranks and agrees
    with `per_device_prompt_batch_size` when both are given (before the latter is filled in)."""
    gbs, ranks, per_rank = args.global_batch_size, args.dataset_world_size, args.per_device_prompt_batch_size
    if gbs == -1:
        return []
    if gbs <= 0:
        return [f"global_batch_size must be positive (or -1: per_device_prompt_batch_size per rank), got {gbs}"]
    if gbs % ranks:
        return [f"global_batch_size {gbs} does not split over {ranks} data-parallel ranks"]
    if per_rank is not None and per_rank * ranks != gbs:
        return [f"global_batch_size {gbs} over {ranks} data-parallel rank(s) gives {gbs // ranks} prompts per rank, but "
                f"per_device_prompt_batch_size is {per_rank}: give one of them"]
    return []


def mini_batch_problems(args):
    """PaddleNLP's `global_mini_batch_size` / `global_gen_batch_size` and the micro-batch sizes
    of the no-gradient passes and the rollout engine."""
    problems = [f"{name} must be positive or -1, got {getattr(args, name)}"
                for name in ("global_mini_batch_size", "global_gen_batch_size", "per_device_logprob_batch_size",
                             "per_device_reward_batch_size", "per_device_value_batch_size", "rollout_max_num_seqs")
                if getattr(args, name) == 0 or getattr(args, name) < -1]
    ranks, mini = args.dataset_world_size, args.mini_batch_prompts
    global_prompts = args.per_device_prompt_batch_size * ranks
    if prompt_batch_problems(args):
        return problems  # the global batch itself is wrong (reported by prompt_batch_problems)
    if mini is not None and mini > 0:
        if mini % ranks or global_prompts % mini:
            problems.append(f"global_mini_batch_size {mini} must split over {ranks} data-parallel rank(s) and divide the "
                            f"global batch of {global_prompts} prompts")
        elif (mini // ranks * args.rollout_n) % args.update_micro_rows:
            problems.append(f"global_mini_batch_size {mini} x rollout_n {args.rollout_n} gives {mini // ranks * args.rollout_n} "
                            f"rows per rank per optimiser step, not a multiple of per_device_train_batch_size "
                            f"{args.per_device_train_batch_size}")
        elif args.gradient_accumulation_steps not in (1, args.update_accumulation_steps):
            problems.append(f"gradient_accumulation_steps {args.gradient_accumulation_steps} disagrees with the "
                            f"{args.update_accumulation_steps} micro-batches of {args.update_micro_rows} rows that "
                            f"global_mini_batch_size {mini} x rollout_n {args.rollout_n} gives per rank: leave it out")
    gen = args.global_gen_batch_size
    if gen > 0 and not args.dynamic_sampling:
        problems.append(f"global_gen_batch_size {gen} is DAPO's generation batch: it acts with dynamic_sampling only")
    elif gen > 0 and (gen % ranks or gen < global_prompts):
        problems.append(f"global_gen_batch_size {gen} must split over {ranks} data-parallel rank(s) and be at least the "
                        f"global batch of {global_prompts} prompts")
    return problems


def batch_problems(args):
    """The rollout batch splits into whole optimiser steps, and the run has a step to train
    (sizes below their minimum are reported by `validation.size_problems`)."""
    problems = mini_batch_problems(args)
    rollout = args.per_device_prompt_batch_size * args.rollout_n
    micro = args.update_micro_rows * args.update_accumulation_steps
    if not problems and rollout > 0 and micro > 0 and rollout % micro:
        problems.append(f"per_device_prompt_batch_size*rollout_n ({rollout}) must be a multiple of the rows of one "
                        f"optimiser step, per_device_train_batch_size*gradient_accumulation_steps ({micro})")
    if args.max_steps == 0:
        problems.append("max_steps 0 would train no step; give a positive max_steps, or -1 with num_train_epochs")
    if args.max_steps < 0 and args.num_train_epochs <= 0:
        problems.append(f"max_steps -1 trains num_train_epochs epochs, which must be > 0, got {args.num_train_epochs}")
    return problems


LAGRANGE_FIELDS = ("lambda_init", "lambda_lr", "lambda_max", "lambda_update_delay_steps", "episode_cost_window_size", "threshold")


def lagrange_value_problems(args):
    """The PPO-Lagrangian multiplier's settings (`ppo.algos.LagrangeMultiplier`)."""
    problems = []
    if not args.lambda_init > 0:
        problems.append(f"lambda_init must be > 0 (the multiplier is learned as log lambda), got {args.lambda_init}")
    if not args.lambda_lr >= 0:
        problems.append(f"lambda_lr must be >= 0, got {args.lambda_lr}")
    if args.lambda_max is not None and not args.lambda_max >= args.lambda_init:
        problems.append(f"lambda_max ({args.lambda_max}) must be >= lambda_init ({args.lambda_init}); None: no cap")
    if args.lambda_update_delay_steps < 0:
        problems.append(f"lambda_update_delay_steps must be >= 0, got {args.lambda_update_delay_steps}")
    if args.episode_cost_window_size < 1:
        problems.append(f"episode_cost_window_size must be >= 1, got {args.episode_cost_window_size}")
    return problems


def lagrangian_problems(model_args, training_args):
    """A cost model (PPO-Lagrangian) needs the GAE critic; the multiplier's settings and a cost
    critic do nothing without one."""
    if not model_args.cost_model_name_or_path:
        defaults = type(training_args).__dataclass_fields__
        problems = [f"{name}={getattr(training_args, name)!r} is a PPO-Lagrangian setting; set cost_model_name_or_path"
                    for name in LAGRANGE_FIELDS if getattr(training_args, name) != defaults[name].default]
        if model_args.cost_critic_model_name_or_path:
            problems.append("cost_critic_model_name_or_path is set without cost_model_name_or_path (PPO-Lagrangian)")
        return problems
    problems = []
    if not estimator_problems(training_args) and not training_args.use_critic:
        problems.append(f"cost_model_name_or_path (PPO-Lagrangian) needs cost and reward critics; adv_estimator "
                        f"{training_args.adv_estimator} has none: use gae")
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
    if not model_args.external_scores and not getattr(training_args, "env_name", ""):  # env_name alone: its rewards are the reward
        problems += validation.required_problems(
            model_args, ["reward_model_name_or_path"], " unless use_rm_server, use_rule_reward or env_name is set")
    problems += env_reward_problems(model_args, training_args)
    uses_critic = training_args.adv_estimator in ADV_ESTIMATORS and training_args.use_critic
    if uses_critic and not (model_args.reward_critic_model_name_or_path or model_args.reward_model_name_or_path):
        problems.append(f"adv_estimator {training_args.adv_estimator} needs a critic: set reward_critic_model_name_or_path "
                        "or reward_model_name_or_path")
    return problems


def validate_arguments(model_args, data_args, training_args):
    """Every cross-group and file-system problem of a PPO/GRPO run, before any model loads."""
    model_dirs = [(f"{n}_model_name_or_path", getattr(model_args, f"{n}_model_name_or_path"))
                  for n in ("actor", "reference", "reward_critic", "cost_critic")]
    score_dirs = [] if model_args.external_scores else [("reward_model_name_or_path", model_args.reward_model_name_or_path)]
    score_dirs += [("cost_model_name_or_path", model_args.cost_model_name_or_path)] if model_args.cost_model_name_or_path else []
    problems = validation.size_problems(model_args, data_args, training_args)
    problems += model_path_problems(model_args, training_args)
    problems += validation.model_dir_problems(model_dirs, score_dirs)
    problems += hf_config_problems(model_dirs + score_dirs)
    problems += validation.output_dir_problems(training_args.output_dir, model_dirs + score_dirs)
    problems += validation.dtype_device_problems(training_args)
    problems += validation.split_logits_problems(model_args, training_args)
    problems += validation.pipeline_problems(training_args, model_args.use_lora)
    problems += expert_layout_problems(training_args, True, model_args.use_lora)
    problems += expert_model_problems(training_args, model_dirs[:1])
    problems += tensor_model_problems(training_args, model_dirs + score_dirs)
    problems += remove_padding_problems(training_args) + pass_size_problems(training_args)
    problems += lagrangian_problems(model_args, training_args)
    problems += agent_problems(training_args) + agent_run_problems(data_args, training_args)
    problems += process_reward_model_problems(model_args, training_args) + routing_replay_problems(model_args, training_args)
    if training_args.load_best_model_at_end and not data_args.eval_datasets:
        problems.append("load_best_model_at_end picks the best evaluated policy: give eval_datasets")
    if training_args.early_stopping and not split_specs(data_args.eval_datasets):
        problems.append("early_stopping watches the evaluation metric: give eval_datasets")
    return problems


def agent_run_problems(data_args, args):
    """What a multi-turn run (`env_name`) cannot do here, each refused by name."""
    if not args.env_name:
        return []
    problems = []
    if not args.use_fusemt:
        problems.append("env_name with use_fusemt false: PaddleNLP's generate cannot feed a tool's answer onto a row's "
                        "KV cache mid-generation; multi-turn rollouts need the rollout engine (use_fusemt true)")
    if getattr(args, "pipeline_parallel_degree", 1) > 1 and getattr(args, "tensor_parallel_degree", 1) > 1:
        problems.append(f"env_name with tensor_parallel_degree {args.tensor_parallel_degree} and pipeline_parallel_degree "
                        f"{args.pipeline_parallel_degree}: a multi-turn rollout runs its environments on one rank of the "
                        "tensor- or the pipeline-parallel group, not of both; use one of them with data parallel")
    if split_specs(data_args.eval_datasets) and getattr(args, "eval_num_samples", 0):
        problems.append("env_name with eval_num_samples: the evaluation of trajectories runs one greedy trajectory per "
                        "prompt (eval/agent/*); sampled pass@k over trajectories is not implemented; set eval_num_samples 0")
    return problems


def remove_padding_problems(args):
    """`use_remove_padding` packs rows with a 4-D attention mask, which pipeline stages do not take."""
    if args.use_remove_padding and args.pipeline_parallel_degree > 1:
        return [f"use_remove_padding with pipeline_parallel_degree {args.pipeline_parallel_degree}: packed rows carry a "
                "4-D attention mask, which the pipeline stages do not take; set use_remove_padding false or "
                "pipeline_parallel_degree 1"]
    return []


PASS_SIZE_FIELDS = tuple(f"per_device_{which}_batch_size" for which in ("logprob", "reward", "value"))


def pass_size_problems(args):
    """The no-gradient passes' row chunks act on the plain passes only: under pipeline parallel
    the rollout batch runs through the pipeline schedule, so a size given there is refused."""
    if args.pipeline_parallel_degree <= 1:
        return []
    return [f"{name} {getattr(args, name)} with pipeline_parallel_degree {args.pipeline_parallel_degree}: the "
            "no-gradient passes run the rollout batch through the pipeline schedule, not in chunks of rows; "
            f"leave {name} at -1" for name in PASS_SIZE_FIELDS if getattr(args, name) > 0]
