"""PPO/GRPO arguments that PaddleNLP's RL entry point (`llm/alignment/rl/run_rl.py`, its
`paddlenlp/rl/utils/config_utils.py`) has beyond the loop's own: VAPO (`rl_algorithm: vapo`,
`pretrain_critic_steps`, the positive-example LM loss), process reward models in the rollout,
early stopping on the evaluation metric, the rollout's tensor-parallel degree, the compute dtype
and the optimizer offload.

A mixin of `PPOTrainingArguments` (`ppo/entry/ppo_arguments.py`). Each field acts; a combination the
loop cannot run is refused saying why; nothing is accepted and then ignored.
"""
import json
import os
from dataclasses import dataclass, field, fields
from typing import ClassVar

from ..algos.process_reward import PRM_REDUCTIONS
from ..algos.vapo import VAPO_ESTIMATOR
from ..optimization.offload import parse_offload_level

DEFAULT_GAE_LAMBDA = 0.95  # PPOTrainingArguments.gae_lambda's default (PaddleNLP's hard-coded lambda)

@dataclass
class PaddleNLPRLArguments:
    # the valid names, checked before Paddle loads (ppo/common/early_values.py)
    field_choices: ClassVar[dict] = {"prm_reduction": "ppo.algos.process_reward:PRM_REDUCTIONS"}
    # VAPO (Yue et al. 2025); rl_algorithm vapo selects adv_estimator vapo
    pretrain_critic_steps: int = field(
        default=0,
        metadata={"help": "VAPO value pretraining (PaddleNLP's name): the first N training steps train only the critic, "
                  "on the Monte-Carlo (GAE lambda 1) returns of the unchanged policy's rollouts; the actor's weights, "
                  "optimizer state and learning-rate schedule wait until step N+1. 0: none. Needs an estimator with a "
                  "critic (ppo, vapo)."},
    )
    # vapo_alpha, critic_gae_lambda: the vapo entry's settings (ppo.algos.vapo.VAPO_ESTIMATOR), generated fields
    positive_example_lm_coeff: float = field(
        default=0.0,
        metadata={"help": "VAPO's positive-example LM loss weight mu (the paper's 0.1): mu x the NLL of the tokens of the "
                  "responses scored >= positive_example_min_score, added to the actor's loss (the token mean over "
                  "those responses' tokens in each optimizer step). 0: off."},
    )
    positive_example_min_score: float = field(
        default=1.0,
        metadata={"help": "positive_example_lm_coeff: responses whose score is at least this are positive examples "
                  "(a rule reward's 1 for a correct answer)."},
    )
    # process reward models as the reward model
    prm_reduction: str = field(
        default="last",
        metadata={"help": f"A process reward model's step scores as rewards: {' | '.join(PRM_REDUCTIONS)} (the last step's "
                  "score, the lowest step score, or each step's score at its last token)."},
    )
    prm_step_separator: str = field(
        default="\n",
        metadata={"help": "Where a process reward model cuts a response into steps (Math-Shepherd: a newline)."},
    )
    prm_step_tokens: int = field(
        default=0,
        metadata={"help": "A process reward model's steps of this many response tokens instead of cuts at prm_step_separator "
                  "(answers written without a separator, as the tiny demo's two-character steps). 0: cut at the separator."},
    )
    prm_end_step: bool = field(
        default=False,
        metadata={"help": "A process reward model also scores where a response stops: a response that ended with EOS "
                  "gets an empty last step at its EOS token (the PRM must be trained with that step, as "
                  "ppo.tiny.prm_data writes it). false: the EOS is not scored, and an answer cut short scores like a "
                  "whole one."},
    )
    # PaddleNLP's early stopping (its EarlyStoppingCallback, on metric_for_best_model)
    early_stopping: bool = field(
        default=False,
        metadata={"help": "Stop when metric_for_best_model has not improved by more than early_stopping_threshold for "
                  "early_stopping_patience evaluations (PaddleNLP's EarlyStoppingCallback); the run then ends as at "
                  "max_steps (final checkpoint, summary.json's early_stopped). Needs load_best_model_at_end, "
                  "metric_for_best_model and evaluation steps."},
    )
    early_stopping_patience: int = field(
        default=4, metadata={"help": "Evaluations without improvement before early_stopping stops the run."}
    )
    early_stopping_threshold: float = field(
        default=0.0, metadata={"help": "How much the metric must beat its best for early_stopping to count an improvement."}
    )
    # placement and precision
    rollout_tensor_parallel_degree: int = field(
        default=-1,
        metadata={"help": "Tensor-parallel degree of the rollout (PaddleNLP's name): 1 generates from the whole weights "
                  "gathered on each rank (eval_mode single), tensor_parallel_degree from each rank's slices (eval_mode "
                  "tensor_parallel); -1: eval_mode decides. Other degrees are refused colocated; with rollout_placement "
                  "split it is each rollout replica's degree (rollout_ranks / it replicas, each rank holding, receiving "
                  "and generating from only its slice of the weights the trainer sends)."},
    )
    use_fp32_compute: bool = field(
        default=True,
        metadata={"help": "PaddleNLP's name: compute the actor's and reference's log-probs from float32 logits (true); "
                  "false computes their softmax in the bf16/fp16 training dtype, as PaddleNLP, and the loss takes them "
                  "in that dtype (float32 training: the same either way)."},
    )

    @property
    def logprob_dtype(self):
        """The dtype of the log-prob passes: float32, or the training dtype with `use_fp32_compute` false."""
        if self.use_fp32_compute:
            return "float32"
        return "bfloat16" if self.bf16 else "float16" if self.fp16 else "float32"

    def resolve_group(self):
        problems = paddlenlp_rl_problems(self)
        self.eval_mode = rollout_eval_mode(self)
        self.offload_level = offload_level_with_optim(self)
        return problems


def _default(name):
    """The declared default of field `name` of `PaddleNLPRLArguments`."""
    return PaddleNLPRLArguments.__dataclass_fields__[name].default


def rollout_eval_mode(args):
    """`eval_mode` with `rollout_tensor_parallel_degree` applied: a degree above 1 (equal to
    `tensor_parallel_degree`, else refused) generates from each rank's own slices."""
    if args.rollout_tensor_parallel_degree > 1 and args.eval_mode == "" and getattr(args, "rollout_placement", "") != "split":
        return "tensor_parallel"  # (with split the degree is the rollout replicas' own)
    return args.eval_mode


def offload_level_with_optim(args):
    """`offload_level` with `optimizer` added when PaddleNLP's `offload_optim` is true (the
    optimizer states live in pinned host memory between steps, as `offload_level optimizer`)."""
    try:
        words = parse_offload_level(args.offload_level)
    except ValueError:
        return args.offload_level  # reported by loss_problems
    if args.offload_optim and "optimizer" not in words:
        return f"{args.offload_level} optimizer".strip()
    return args.offload_level


def paddlenlp_rl_problems(args):
    """Every problem of the fields above, the combinations they refuse included."""
    return vapo_problems(args) + prm_rollout_problems(args) + early_stopping_problems(args) + placement_problems(args)


def vapo_problems(args):
    problems = []
    if args.pretrain_critic_steps < 0:
        problems.append(f"pretrain_critic_steps must be >= 0, got {args.pretrain_critic_steps}")
    elif args.pretrain_critic_steps > 0:
        problems += value_pretraining_problems(args)
    changed = [n for n, d in VAPO_ESTIMATOR.settings.items() if getattr(args, n) != d]
    if changed and args.adv_estimator != "vapo":  # the vapo entry's settings (ppo.algos.vapo.VAPO_ESTIMATOR)
        problems.append(f"{', '.join(changed)} set, but only adv_estimator vapo (rl_algorithm vapo) reads them")
    if args.adv_estimator == "vapo" and args.gae_lambda != DEFAULT_GAE_LAMBDA:
        problems.append(f"gae_lambda {args.gae_lambda} with adv_estimator vapo: vapo's actor lambda is 1 - 1/(vapo_alpha x "
                        "length) and the critic's is critic_gae_lambda, so gae_lambda is not used; leave it out")
    if args.positive_example_lm_coeff < 0:
        problems.append(f"positive_example_lm_coeff must be >= 0, got {args.positive_example_lm_coeff}")
    elif args.positive_example_lm_coeff == 0 and args.positive_example_min_score != _default("positive_example_min_score"):
        problems.append(f"positive_example_min_score {args.positive_example_min_score} set, but only "
                        "positive_example_lm_coeff > 0 reads it")
    return problems


def value_pretraining_problems(args):
    """`pretrain_critic_steps > 0`: a critic to pretrain, and the plain passes (the pipeline
    schedule always runs the actor's)."""
    problems = []
    estimator = estimator_or_none(args)
    if estimator is not None and not estimator.needs_critic:
        problems.append(f"pretrain_critic_steps {args.pretrain_critic_steps} pretrains the critic, but adv_estimator "
                        f"{args.adv_estimator} has none: use rl_algorithm vapo or ppo, or leave it at 0")
    if args.pipeline_parallel_degree > 1:
        problems.append(f"pretrain_critic_steps {args.pretrain_critic_steps} with pipeline_parallel_degree "
                        f"{args.pipeline_parallel_degree}: critic-only steps are not implemented under the pipeline "
                        "schedule; use data, sharding or tensor parallelism for value pretraining")
    return problems


def prm_rollout_problems(args):
    problems = []
    if args.prm_reduction not in PRM_REDUCTIONS:
        problems.append(f"prm_reduction must be one of {PRM_REDUCTIONS}, got {args.prm_reduction!r}")
    if not args.prm_step_separator:
        problems.append("prm_step_separator must not be empty (it cuts responses into steps)")
    if args.prm_step_tokens < 0:
        problems.append(f"prm_step_tokens must be >= 0, got {args.prm_step_tokens}")
    return problems


PRM_DEFAULTS = {f.name: f.default for f in fields(PaddleNLPRLArguments) if f.name.startswith("prm_")}
"""The `prm_*` fields' defaults, as declared above: a run without a process reward model refuses others."""


def is_process_reward_model(path):
    """Whether the model directory `path` holds a process reward model (its `config.json` says
    `process_reward`, as `rm/run_reward.py --process_reward true` saves it); False when unreadable."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            return bool(json.load(f).get("process_reward", False))
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def process_reward_model_problems(model_args, args):
    """A process reward model as the PPO/GRPO reward (read from its config before it loads): the
    settings it cannot run with; without one, `prm_*` settings that nothing would read."""
    uses_model = not (model_args.use_rm_server or model_args.use_rule_reward or model_args.external_scores)
    if not (uses_model and model_args.reward_model_name_or_path and is_process_reward_model(model_args.reward_model_name_or_path)):
        changed = [n for n, d in PRM_DEFAULTS.items() if getattr(args, n) != d]
        return [f"{', '.join(changed)} set, but the reward is no process reward model (reward_model_name_or_path whose "
                "config says process_reward)"] if changed else []
    problems = []
    if args.tensor_parallel_degree > 1 or args.pipeline_parallel_degree > 1:
        problems.append("a process reward model as the reward runs whole in each process (ppo.scoring.process_reward): "
                        "tensor/pipeline parallel degrees above 1 are not implemented for it")
    if args.prm_reduction == "step" and args.normalize_reward:
        problems.append("prm_reduction step rewards each step with its P(good) as it is; normalize_reward (one running "
                        "normaliser of one score per response) is not implemented with it: set normalize_reward false")
    per_group = getattr(estimator_or_none(args), "per_group", False)
    if args.prm_reduction == "step" and per_group and args.kl_coeff != 0:
        problems.append(f"prm_reduction step with adv_estimator {args.adv_estimator}: DeepSeekMath's process-supervision "
                        "advantages carry no KL reward; set kl_coeff 0 (kl_loss_coeff puts the KL in the loss)")
    return problems


def estimator_or_none(args):
    """The run's `AdvEstimator` entry, or None (an unknown name is reported by the estimator checks)."""
    try:
        return args.estimator
    except (ValueError, KeyError, ImportError, AttributeError):
        return None


def early_stopping_problems(args):
    """PaddleNLP's EarlyStoppingCallback needs an evaluation metric to watch (it asserts
    load_best_model_at_end, metric_for_best_model and an evaluation strategy)."""
    problems = []
    if args.early_stopping_patience < 1:
        problems.append(f"early_stopping_patience must be >= 1, got {args.early_stopping_patience}")
    if args.early_stopping_threshold < 0:
        problems.append(f"early_stopping_threshold must be >= 0, got {args.early_stopping_threshold}")
    if not args.early_stopping:
        return problems
    needs = [name for name, ok in (("load_best_model_at_end true", args.load_best_model_at_end),
                                   ("metric_for_best_model", args.metric_for_best_model),
                                   ("evaluation_strategy steps with eval_steps", args.evaluates)) if not ok]
    if needs:
        problems.append(f"early_stopping watches the evaluation metric and needs {', '.join(needs)} (as PaddleNLP's "
                        "EarlyStoppingCallback)")
    return problems


def placement_problems(args):
    """`rollout_tensor_parallel_degree` where the rollout engine's layouts allow it, and
    `use_fp32_compute: false` where the passes can compute in the training dtype (not pipeline stages)."""
    problems = []
    degree, tp = args.rollout_tensor_parallel_degree, max(args.tensor_parallel_degree, 1)
    if degree == 0 or degree < -1:
        problems.append(f"rollout_tensor_parallel_degree must be positive or -1, got {degree}")
    elif getattr(args, "rollout_placement", "") == "split":
        pass  # the rollout replicas' own degree: ppo.entry.rollout_placement_arguments checks it
    elif degree == 1 and args.eval_mode == "tensor_parallel" and tp > 1:
        problems.append("rollout_tensor_parallel_degree 1 generates from the gathered weights, eval_mode tensor_parallel "
                        "from each rank's slices: choose one")
    elif degree > 1 and degree != tp:
        own = f"or {tp} (each rank's own slices)" if tp > 1 else "or -1"
        problems.append(f"rollout_tensor_parallel_degree {degree} with tensor_parallel_degree {tp}: a rollout resharded to "
                        "another tensor-parallel degree (PaddleNLP's ReshardController) is not implemented here; use 1 "
                        f"(whole weights gathered on each rank) {own}")
    elif degree > 1 and args.eval_mode == "single":
        problems.append(f"rollout_tensor_parallel_degree {degree} generates from each rank's slices, eval_mode single from "
                        "the gathered weights: choose one")
    if not args.use_fp32_compute and (args.bf16 or args.fp16) and args.pipeline_parallel_degree > 1:
        problems.append("use_fp32_compute false with bf16/fp16 at pipeline_parallel_degree > 1: the pipeline stages "
                        "compute their log-probs from float32 logits only; set use_fp32_compute true")
    return problems
