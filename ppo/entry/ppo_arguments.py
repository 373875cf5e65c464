"""Arguments of `run_ppo.py` (PPO, GRPO, RLOO, REINFORCE++), PaddleNLP's names kept.

Defaults live here only; every field has a help; nothing is rewritten after the one
`__post_init__` pass (`resolve_arguments`: each group's `resolve_group`) checks it
(`ppo_argument_checks.py`: the checks; `validate_arguments` those that need several groups or
the file system, run by `parse_arguments` before any model loads).
"""
import math
from dataclasses import dataclass, field
from typing import ClassVar, List, Optional

from ..agents.arguments import AgentArguments
from ..algos import ADV_ESTIMATORS
from ..algos.advantage import GAE_LAMBDA, GAMMA
from ..algos.kl import KL_ESTIMATOR_NAMES
from ..common import paddlenlp_keys as pk
from ..common.field_bounds import ranged_field
from .argument_groups import (
    RECOMPUTE_GRANULARITIES,
    DatasetArguments,
    ModelCommonArguments,
    OnlineRolloutArguments,
    PaddleNLPTrainingArguments,
    PromptFieldArguments,
    RolloutArguments,
    default_override,
)
from .policy_loss_arguments import LOSS_AGG_MODE_HELP, PolicyLossArguments, policy_loss_problems
from .rollout_placement_arguments import RolloutPlacementArguments
from .routing_replay_arguments import RoutingReplayArguments
from .paddlenlp_rl_arguments import PaddleNLPRLArguments
from .ppo_argument_checks import (  # noqa: F401  (validate_arguments: the entry point's start-up pass)
    PPO_FIELD_CHOICES, batch_problems, estimator_problems, find_adv_estimator, generation_problems, kl_problems,
    lagrange_value_problems, loss_problems, paddlenlp_setting_problems, prompt_batch_problems, score_source_problems,
    validate_arguments,
)

DEFAULT_RULE_SCORER = "math"


@dataclass
class ModelArgument(ModelCommonArguments):
    actor_model_name_or_path: str = field(default=None, metadata={"help": "SFT model (or LoRA adapter) the actor starts from."})
    reference_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Frozen reference model; defaults to the actor's starting point."}
    )
    reward_model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "Trained score model or score-model LoRA adapter (rm/run_reward.py); empty when rewards come "
                  "from a reward server."},
    )
    reward_critic_model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "Critic initialisation; defaults to the reward model (GAE only). Full weights train whole "
                  "(weights + gradients + 2 AdamW moments, ~4x the weights); a score-model LoRA adapter is merged and "
                  "the critic trains its own adapter and score head (one frozen copy of the weights)."},
    )
    cost_model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "PPO-Lagrangian (Safe RLHF): a trained cost model (a score model, rm/run_reward.py with the cost "
                  "objective); its end score is each response's cost, kept under `threshold` by a learned multiplier. "
                  "Empty: plain PPO."},
    )
    cost_critic_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Cost critic initialisation (PPO-Lagrangian); defaults to the cost model."}
    )
    use_rm_server: bool = field(default=False, metadata={"help": "Score responses with an HTTP reward server."})
    reward_server: str = field(default="http://127.0.0.1:8731", metadata={"help": "URL of the reward server."})
    reward_server_timeout: float = ranged_field(60.0, above=0.0, help="Seconds before one reward request times out.")
    reward_server_retries: int = ranged_field(3, minimum=0, help="Retries (exponential backoff) before the run stops.")
    reward_server_token: Optional[str] = field(
        default=None,
        metadata={
            "help": "Bearer token sent to the reward server (default: $PPO_REWARD_SERVER_TOKEN); "
            "never written to resolved_arguments.json."
        },
    )
    use_rule_reward: bool = field(
        default=False, metadata={"help": "Score with rule scorers (ppo/scorers/) in the trainer process, no server or reward model."}
    )
    rule_reward_scorers: str = field(
        default="",
        metadata={"help": "use_rule_reward: comma-separated scorer names or module:function, e.g. kk,math, or a JSON object "
                  "name -> weight or {\"weight\": w, option: value} (docs/verifiers.md); empty: math (the last number)."},
    )
    rule_reward_weights: str = field(
        default="", metadata={"help": "use_rule_reward: comma-separated weight per scorer (default 1 each); score = weighted sum."}
    )

    def resolve_group(self):
        if self.use_rule_reward and not self.rule_reward_scorers:
            self.rule_reward_scorers = DEFAULT_RULE_SCORER  # PaddleNLP's use_rule_reward scores GSM8K answers
        return score_source_problems(self)

    @property
    def external_scores(self):
        """Scores come from a reward server or rule scorers, not a reward model."""
        return self.use_rm_server or self.use_rule_reward


@dataclass
class DataArgument(PromptFieldArguments, DatasetArguments):
    ptx_datasets: List[str] = field(default_factory=list, metadata={"help": "Supervised datasets for the ptx loss."})
    max_prompt_len: int = ranged_field(
        256, minimum=1,
        help="Prompts longer than this many tokens are dropped, not truncated (verl's filter_overlong_prompts; "
             "SFT and the DPO family truncate with truncate_prompt_len instead).")


@dataclass
class PPOTrainingArguments(RoutingReplayArguments, RolloutPlacementArguments, AgentArguments, PolicyLossArguments,
                           PaddleNLPRLArguments, OnlineRolloutArguments, PaddleNLPTrainingArguments):
    """The rollout, its generation and log-probs, the divergence stop and the loop's optimiser
    (`OnlineRolloutArguments`) are shared with online DPO; the policy loss and the settings its registry entries declare (the PPO clip settings
    among them) are `PolicyLossArguments`; `AgentArguments` (env_name,
    env_kwargs, max_turns, ...) make the rollout multi-turn (ppo/agents); PaddleNLP's RL-entry extras
    (VAPO, PRM, early stopping, placement) are `PaddleNLPRLArguments`; the fields below are PPO/GRPO's own."""

    paddlenlp_fixed_fields: ClassVar[tuple] = tuple(pk.PPO_FIXED_VALUE)  # checked by ppo.common.argument_parsing
    field_choices: ClassVar[dict] = PPO_FIELD_CHOICES  # checked before Paddle loads (ppo/common/early_values.py)
    # rollout
    # None: filled from global_batch_size in __post_init__ (PaddleNLP), else 16
    per_device_prompt_batch_size: Optional[int] = default_override(RolloutArguments, "per_device_prompt_batch_size", None)
    global_batch_size: int = field(
        default=-1,
        metadata={"help": "PaddleNLP: prompts per step over all data-parallel ranks (sets per_device_prompt_batch_size to "
                  "this / data-parallel ranks); -1: per_device_prompt_batch_size on every rank."},
    )
    global_mini_batch_size: int = field(
        default=-1,
        metadata={"help": "PaddleNLP: prompts per optimiser step over all data-parallel ranks, so each rollout batch gives "
                  "global_batch_size / this optimiser steps per update_iters epoch (gradient_accumulation_steps derived); "
                  "-1: the whole global batch when global_batch_size is set, else steps of per_device_train_batch_size "
                  "x gradient_accumulation_steps rows."},
    )
    global_gen_batch_size: int = field(
        default=-1,
        metadata={"help": "DAPO dynamic_sampling: prompts generated per draw over all data-parallel ranks (at least the "
                  "global batch; the groups whose scores vary fill the global batch); -1: the global batch."},
    )
    per_device_logprob_batch_size: int = field(
        default=-1,
        metadata={"help": "Rows per no-gradient log-prob forward (old policy, reference); -1: "
                  "max(per_device_train_batch_size, per_device_eval_batch_size)."},
    )
    per_device_reward_batch_size: int = field(
        default=-1,
        metadata={"help": "Rows per reward-model forward; -1: max(per_device_train_batch_size, per_device_eval_batch_size)."},
    )
    per_device_value_batch_size: int = field(
        default=-1,
        metadata={"help": "Rows per no-gradient critic forward (old values); -1: "
                  "max(per_device_train_batch_size, per_device_eval_batch_size)."},
    )
    rollout_max_num_seqs: int = field(
        default=-1,
        metadata={"help": "Most sequences the rollout engine decodes at once: a larger rollout batch is decoded in chunks "
                  "of this many rows, with the same tokens (each row's draws follow its global row index); -1: all."},
    )
    balance_batch: bool = field(
        default=False,
        metadata={"help": "Reorder each step's rollout groups over the data-parallel ranks so that every rank gets a "
                  "similar token count (greedy longest-first, equal group counts) before the log-prob passes."},
    )
    use_rollout_logprobs: bool = field(
        default=True, metadata={"help": "Reuse the engine's sampling log-probs as old log-probs when they equal a forward pass."}
    )
    use_remove_padding: bool = field(
        default=False,
        metadata={"help": "PaddleNLP's name: the actor, reference and critic passes (old/reference log-probs, values and "
                  "the update) run on the rollouts' real tokens packed into rows with a block-diagonal causal mask "
                  "instead of padded rows (same results, no work on pad tokens); the reward model's pass stays padded. "
                  "Not with pipeline_parallel_degree > 1."},
    )
    # reward shaping
    adv_estimator: str = field(default="gae", metadata={"help": f"Advantage estimator: {' | '.join(ADV_ESTIMATORS)} "
                                                                "| module.path:NAME of a ppo.algos.AdvEstimator of your own."})
    adv_estimator_settings: str = field(default="", metadata={"help": "The estimator's own settings (AdvEstimator.settings) "
                                                                      "as a JSON object name -> value; empty: their defaults."})
    kl_coeff: float = ranged_field(
        0.02, range=(0.0, True, None, False),
        help="KL penalty coefficient in the per-token reward (PPO-Lagrangian: also added to the per-token cost, "
             "as safe-rlhf).")
    kl_estimator: str = field(default="k1", metadata={"help": f"KL estimator in the reward: {' | '.join(KL_ESTIMATOR_NAMES)}."})
    kl_loss_coeff: float = ranged_field(
        0.0, range=(0.0, True, None, False), help="Weight of the KL term in the policy loss (GRPO).")
    kl_loss_type: str = field(
        default="k3", metadata={"help": f"KL estimator of the loss term (verl name): {' | '.join(KL_ESTIMATOR_NAMES)}."}
    )
    kl_clamp: Optional[float] = field(
        default=None, metadata={"help": "Clamp k3 (low_var_kl) to +-this, in the reward and the loss (verl: 10); None: unclamped."}
    )
    target_kl: Optional[float] = field(
        default=None, metadata={"help": "Adaptive KL controller target (per-sequence KL); None keeps kl_coeff fixed."}
    )
    kl_horizon: float = field(default=10000, metadata={"help": "Adaptive KL controller horizon, in samples."})
    clip_range_score: float = ranged_field(
        10.0, range=(0.0, False, None, False), help="Scores are clipped to +-this before shaping.")
    enable_overlong_reward_buffer: bool = field(
        default=False, metadata={"help": "DAPO soft overlong punishment: penalise responses in the last overlong_reward_buffer tokens."}
    )
    overlong_reward_buffer: int = field(default=16, metadata={"help": "DAPO: length of the punishment zone before max_dec_len."})
    overlong_penalty_factor: float = ranged_field(
        1.0, range=(0.0, True, None, False), help="DAPO: penalty at max_dec_len (linear from 0).")
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Leave responses without EOS out of every loss (TRL)."}
    )
    normalize_reward: bool = field(default=False, metadata={"help": "Normalise scores with running statistics."})
    normalize_advantage: Optional[bool] = field(
        default=None,
        metadata={"help": "Whiten advantages over the batch's response tokens after the estimator (as PaddleNLP, for every "
                  "estimator); None: true for gae, false for the others."},
    )
    gamma: float = ranged_field(GAMMA, range=(0.0, True, 1.0, True), help="Discount factor.")
    gae_lambda: float = ranged_field(GAE_LAMBDA, range=(0.0, True, 1.0, True), help="GAE lambda.")
    scale_reward_std: bool = field(default=True, metadata={"help": "GRPO: divide group advantages by the group std (False: Dr.GRPO)."})
    dynamic_sampling: bool = field(default=False, metadata={"help": "GRPO: drop zero-variance groups and refill the batch."})
    max_gen_batches: int = ranged_field(4, minimum=1, help="Most rollout batches dynamic sampling draws per step.")
    # PPO-Lagrangian (Safe RLHF; safe-rlhf's names and defaults), with cost_model_name_or_path
    lambda_init: float = field(default=1.0, metadata={"help": "PPO-Lagrangian: initial Lagrange multiplier (> 0; learned as log lambda)."})
    lambda_lr: float = field(default=0.1, metadata={"help": "PPO-Lagrangian: SGD learning rate of log lambda."})
    lambda_max: Optional[float] = field(default=None, metadata={"help": "PPO-Lagrangian: cap on lambda; None: no cap."})
    lambda_update_delay_steps: int = field(
        default=0, metadata={"help": "PPO-Lagrangian: training steps before the multiplier starts to move."}
    )
    episode_cost_window_size: int = field(
        default=128,
        metadata={"help": "PPO-Lagrangian: the multiplier follows the mean cost of this many latest episodes of all data ranks "
                  "together (safe-rlhf: this many per rank; set N times it on N data ranks to match)."},
    )
    threshold: float = field(default=0.0, metadata={"help": "PPO-Lagrangian: the cost budget d in E[cost] <= d."})
    # update
    clip_range_value: float = ranged_field(
        5.0, range=(0.0, False, None, False), help="Value clip around the old values.")
    loss_agg_mode: Optional[str] = field(default=None, metadata={"help": LOSS_AGG_MODE_HELP})
    loss_scale_factor: Optional[float] = field(
        default=None, metadata={"help": "seq-mean-token-sum-norm (Dr.GRPO): the constant divisor; None: max_dec_len."}
    )
    pg_loss_coeff: float = ranged_field(1.0, range=(0.0, True, None, False), help="Weight of the policy-gradient loss.")
    entropy_coeff: float = ranged_field(
        0.0, range=(0.0, True, None, False), help="Entropy bonus: entropy_coeff * entropy is subtracted from the loss.")
    ptx_coeff: float = ranged_field(0.0, range=(0.0, True, None, False), help="Weight of the supervised (ptx) loss.")
    critic_learning_rate: float = ranged_field(5e-6, range=(0.0, True, None, False), help="Critic learning rate.")
    critic_weight_decay: float = ranged_field(0.0, range=(0.0, True, None, False), help="Critic weight decay.")
    critic_lr_scheduler_type: str = field(default="constant", metadata={"help": "Critic scheduler: constant | linear | cosine."})
    critic_warmup_ratio: float = ranged_field(0.0, range=(0.0, True, 1.0, True), help="Critic warm-up ratio.")
    critic_max_grad_norm: float = field(default=1.0, metadata={"help": "Critic gradient clipping norm."})
    critic_min_learning_rate: float = ranged_field(
        0.0, range=(0.0, True, None, False), help="Critic learning rate floor.")
    reuse_first_update_forward: bool = field(
        default=True,
        metadata={"help": "When the first optimiser step of an update takes every rollout row in one micro-batch "
                  "(rows <= per_device_train_batch_size) and nothing is offloaded, its actor and critic forward (with "
                  "gradients) also gives the old log-probs and values, instead of a separate no-grad pass first "
                  "(the weights are the same then; TRL and verl skip that pass in the same case)."},
    )
    # traces and evaluation
    eval_mode: str = field(
        default="",
        metadata={"help": "Generation layout under tensor parallel: single (whole weights gathered from the tensor-parallel "
                  "ranks for each rollout, then released; '' does the same); tensor_parallel (each rank generates from its "
                  "own slices: all-reduce after attention, MLP and embedding, logits gathered before sampling). Nothing to "
                  "reshard at tensor_parallel_degree 1. Under pipeline parallel every stage is gathered on each rank "
                  "for the rollout first (its tensor-parallel slices merged, or kept with tensor_parallel)."},
    )
    eval_num_samples: int = field(
        default=0,
        metadata={"help": "Sampled responses per eval prompt (rollout sampling) for eval/pass@k (k = 1, 2, 4, ..., n), "
                  "eval/maj@n, eval/mean@n; correct by the rule scorers' verdict, else exact match. 0: greedy only."},
    )
    offload_level: str = field(
        default="",
        metadata={"help": "Space-separated freeze_model optimizer train_model: kept in pinned host memory outside the step "
                  "phases that use them (CUDA only; a no-op that says so on a CPU build)."},
    )
    # PaddleNLP switches
    critic_recompute: bool = field(default=False, metadata={"help": "Activation recompute in the critic (recompute: the actor)."})
    critic_recompute_granularity: str = field(
        default="full", metadata={"help": f"What critic_recompute recomputes: {' | '.join(RECOMPUTE_GRANULARITIES)}."}
    )

    def resolve_group(self):
        """PPO/GRPO's own checks, and what it fills in: `per_device_prompt_batch_size` from
        PaddleNLP's `global_batch_size`, `normalize_advantage` from the estimator."""
        # PaddleNLP sets the parallel layout (dataset_world_size) late in its __post_init__: after
        # a refusal the batch checks that split over data-parallel ranks cannot run
        ranks = None if self.paddlenlp_refused else self.dataset_world_size
        problems = prompt_batch_problems(self) if ranks else []
        if self.per_device_prompt_batch_size is None:  # PaddleNLP's global_batch_size, else our default
            gbs = self.global_batch_size
            self.per_device_prompt_batch_size = gbs // ranks if ranks and gbs > 0 and gbs % ranks == 0 else 16
        problems += estimator_problems(self) + kl_problems(self) + loss_problems(self)
        problems += batch_problems(self) if ranks else []
        problems += generation_problems(self)
        problems += lagrange_value_problems(self)
        if self.eval_num_samples < 0:
            problems.append(f"eval_num_samples must be >= 0 (0: greedy evaluation only), got {self.eval_num_samples}")
        if self.critic_recompute_granularity not in RECOMPUTE_GRANULARITIES:
            problems.append(f"critic_recompute_granularity must be one of {RECOMPUTE_GRANULARITIES}, "
                            f"got {self.critic_recompute_granularity!r}")
        if not self.paddlenlp_refused:
            problems += paddlenlp_setting_problems(self)
        estimator_ok = not estimator_problems(self)
        problems += policy_loss_problems(self, self.estimator if estimator_ok else None)
        if self.normalize_advantage is None and estimator_ok:
            self.normalize_advantage = self.estimator.whitens
        return problems

    @property
    def evaluates(self):
        """Whether the loop evaluates every `eval_steps` (PaddleNLP: `evaluation_strategy` steps,
        which `do_eval` true implies)."""
        strategy = str(getattr(self.evaluation_strategy, "value", self.evaluation_strategy))
        return bool(self.do_eval) and strategy == "steps" and bool(self.eval_steps)

    @property
    def saves_checkpoints(self):
        """Whether the loop writes `checkpoint-<step>` (`save_strategy` steps); with `no` only the
        final models are saved."""
        return str(getattr(self.save_strategy, "value", self.save_strategy)) == "steps"

    @property
    def keep_tensor_parallel(self):
        """`eval_mode tensor_parallel`: generate from each rank's tensor-parallel slices instead of
        the gathered weights (`RolloutEngine(keep_tensor_parallel=...)`)."""
        return self.eval_mode == "tensor_parallel"

    @property
    def estimator(self):
        """The registry entry (`ppo.algos.AdvEstimator`) of `adv_estimator`."""
        return find_adv_estimator(self.adv_estimator)

    @property
    def use_critic(self):
        """Whether the estimator trains a critic (False for one `estimator_problems` refused)."""
        try:
            return self.estimator.needs_critic
        except ValueError:
            return False

    @property
    def mini_batch_prompts(self):
        """Prompts per optimiser step over all data-parallel ranks (`global_mini_batch_size`, or
        the global batch when only `global_batch_size` is set); None: no mini-batch size given."""
        if self.global_mini_batch_size > 0:
            return self.global_mini_batch_size
        return self.global_batch_size if self.global_batch_size > 0 else None

    @property
    def update_micro_rows(self):
        """Rows per update micro-batch: `per_device_train_batch_size`, at most one optimiser step's rows."""
        mini = self.mini_batch_prompts
        if mini is None:
            return self.per_device_train_batch_size
        return max(1, min(self.per_device_train_batch_size, mini * self.rollout_n // self.dataset_world_size))

    @property
    def update_accumulation_steps(self):
        """Micro-batches per optimiser step: derived from the mini-batch size when one is given
        (PaddleNLP), else `gradient_accumulation_steps`."""
        mini = self.mini_batch_prompts
        if mini is None:
            return self.gradient_accumulation_steps
        return max(1, mini * self.rollout_n // self.dataset_world_size // self.update_micro_rows)

    def pass_rows(self, which):
        """Rows per no-gradient forward of `which` (logprob | reward | value): its
        `per_device_<which>_batch_size`, or (-1) max(per_device_train_batch_size, per_device_eval_batch_size)."""
        rows = getattr(self, f"per_device_{which}_batch_size")
        return rows if rows > 0 else max(self.per_device_eval_batch_size, self.per_device_train_batch_size)

    @property
    def loss_scale(self):
        """The constant of `seq-mean-token-sum-norm`: `loss_scale_factor`, else `max_dec_len`."""
        return self.loss_scale_factor or self.max_dec_len

    def total_steps(self, num_prompts, world_size):
        """Training steps of the run: `max_steps` when > 0, else (PaddleNLP's -1) `num_train_epochs`
        epochs of `ceil(num_prompts / global prompt batch)` steps (floor with `dataloader_drop_last`),
        where the global prompt batch is `per_device_prompt_batch_size * world_size`.
        Raises ValueError when that is zero steps."""
        if self.max_steps > 0:
            return self.max_steps
        global_batch = self.per_device_prompt_batch_size * world_size
        per_epoch = num_prompts // global_batch if self.dataloader_drop_last else -(-num_prompts // global_batch)
        total = math.ceil(per_epoch * self.num_train_epochs)
        if total <= 0:
            raise ValueError(
                f"max_steps -1 with num_train_epochs {self.num_train_epochs} over {num_prompts} prompts in global batches of "
                f"{global_batch} trains no step"
            )
        return total

