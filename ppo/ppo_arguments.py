"""Arguments of `run_ppo.py` (PPO, GRPO, RLOO, REINFORCE++), PaddleNLP's names kept.

Defaults live here only; every field has a help; nothing is rewritten after
`__post_init__` validates it.
"""
from dataclasses import dataclass, field
from typing import List, Optional

from paddlenlp.trainer import TrainingArguments

from .algos import ADV_ESTIMATORS, LOSS_AGG_MODES
from .common.args_common import DatasetArguments, LogprobArguments, ModelCommonArguments

KL_ESTIMATOR_NAMES = ("k1", "k2", "k3", "kl", "mse", "low_var_kl")
EVAL_MODES = ("", "single", "tensor_parallel")


@dataclass
class ModelArgument(ModelCommonArguments):
    actor_model_name_or_path: str = field(default=None, metadata={"help": "SFT model (or LoRA adapter) the actor starts from."})
    reference_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Frozen reference model; defaults to the actor's starting point."}
    )
    reward_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Trained score model; empty when rewards come from a reward server."}
    )
    reward_critic_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Critic initialisation; defaults to the reward model (GAE only)."}
    )
    use_rm_server: bool = field(default=False, metadata={"help": "Score responses with an HTTP reward server."})
    reward_server: str = field(default="http://127.0.0.1:8731", metadata={"help": "URL of the reward server."})
    reward_server_timeout: float = field(default=60.0, metadata={"help": "Seconds before one reward request times out."})
    reward_server_retries: int = field(default=3, metadata={"help": "Retries (exponential backoff) before the run stops."})


@dataclass
class DataArgument(DatasetArguments):
    ptx_datasets: List[str] = field(default_factory=list, metadata={"help": "Supervised datasets for the ptx loss."})
    max_prompt_len: int = field(default=256, metadata={"help": "Prompts longer than this many tokens are dropped."})
    prompt_key: str = field(default="src", metadata={"help": "Jsonfile key of the prompt (PaddleNLP name; src)."})
    response_key: str = field(default="tgt", metadata={"help": "Jsonfile key of the reference answer (PaddleNLP name; tgt)."})


@dataclass
class PPOTrainingArguments(LogprobArguments, TrainingArguments):
    # rollout
    per_device_prompt_batch_size: int = field(default=16, metadata={"help": "Prompts per rank per step."})
    rollout_n: int = field(default=1, metadata={"help": "Samples per prompt (the group size of GRPO/RLOO)."})
    max_dec_len: int = field(default=64, metadata={"help": "Most new tokens per response."})
    min_dec_len: int = field(default=1, metadata={"help": "EOS is suppressed until this many tokens were generated."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (log-probs use it too)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling; 0 disables it."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty (1.0 = none)."})
    use_fusemt: bool = field(default=True, metadata={"help": "Use the fast rollout engine (False: PaddleNLP generate)."})
    use_rollout_logprobs: bool = field(
        default=True, metadata={"help": "Reuse the engine's sampling log-probs as old log-probs when they equal a forward pass."}
    )
    # reward shaping
    adv_estimator: str = field(default="gae", metadata={"help": f"Advantage estimator: {' | '.join(ADV_ESTIMATORS)}."})
    kl_coeff: float = field(default=0.02, metadata={"help": "KL penalty coefficient in the per-token reward."})
    kl_estimator: str = field(default="k1", metadata={"help": f"KL estimator in the reward: {' | '.join(KL_ESTIMATOR_NAMES)}."})
    kl_loss_coeff: float = field(default=0.0, metadata={"help": "Weight of the k3 KL term in the policy loss (GRPO)."})
    clip_range_score: float = field(default=10.0, metadata={"help": "Scores are clipped to +-this before shaping."})
    missing_eos_penalty: float = field(
        default=0.0, metadata={"help": "Subtracted from the score of responses that end without EOS."}
    )
    normalize_reward: bool = field(default=False, metadata={"help": "Normalise scores with running statistics."})
    normalize_advantage: bool = field(default=True, metadata={"help": "Whiten advantages over response tokens."})
    gamma: float = field(default=1.0, metadata={"help": "Discount factor."})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda."})
    scale_reward_std: bool = field(default=True, metadata={"help": "GRPO: divide group advantages by the group std (False: Dr.GRPO)."})
    dynamic_sampling: bool = field(default=False, metadata={"help": "GRPO: drop zero-variance groups and refill the batch."})
    max_gen_batches: int = field(default=4, metadata={"help": "Most rollout batches dynamic sampling draws per step."})
    # update
    update_iters: int = field(default=1, metadata={"help": "PPO epochs over each rollout batch."})
    clip_range_ratio: float = field(default=0.2, metadata={"help": "PPO ratio clip."})
    clip_range_ratio_low: Optional[float] = field(default=None, metadata={"help": "Lower ratio clip (default clip_range_ratio)."})
    clip_range_ratio_high: Optional[float] = field(default=None, metadata={"help": "Upper ratio clip (default clip_range_ratio)."})
    dual_clip: Optional[float] = field(default=None, metadata={"help": "Dual-clip constant (>1) for negative advantages."})
    clip_range_value: float = field(default=5.0, metadata={"help": "Value clip around the old values."})
    loss_agg_mode: str = field(default="token-mean", metadata={"help": f"Loss aggregation: {' | '.join(LOSS_AGG_MODES)}."})
    ptx_coeff: float = field(default=0.0, metadata={"help": "Weight of the supervised (ptx) loss."})
    critic_learning_rate: float = field(default=5e-6, metadata={"help": "Critic learning rate."})
    critic_weight_decay: float = field(default=0.0, metadata={"help": "Critic weight decay."})
    critic_lr_scheduler_type: str = field(default="constant", metadata={"help": "Critic scheduler: constant | linear | cosine."})
    critic_warmup_ratio: float = field(default=0.0, metadata={"help": "Critic warm-up ratio."})
    critic_max_grad_norm: float = field(default=1.0, metadata={"help": "Critic gradient clipping norm."})
    min_learning_rate: float = field(default=0.0, metadata={"help": "Actor learning rate floor for cosine/linear decay."})
    critic_min_learning_rate: float = field(default=0.0, metadata={"help": "Critic learning rate floor."})
    max_nan_skips: int = field(default=3, metadata={"help": "Consecutive non-finite steps tolerated before the run stops."})
    # traces and evaluation
    num_sample_generations: int = field(default=10, metadata={"help": "Every this many steps, log a table of samples (0: never)."})
    eval_max_new_tokens: int = field(default=0, metadata={"help": "Generation length in evaluation (0: max_dec_len)."})
    eval_mode: str = field(default="", metadata={"help": "Evaluation model layout: '' (as training) | single | tensor_parallel."})
    offload_level: str = field(default="", metadata={"help": "Space-separated: freeze_model optimizer train_model (GPU memory)."})

    def __post_init__(self):
        super().__post_init__()
        if self.adv_estimator not in ADV_ESTIMATORS:
            raise ValueError(f"adv_estimator must be one of {sorted(ADV_ESTIMATORS)}, got {self.adv_estimator!r}")
        if self.kl_estimator not in KL_ESTIMATOR_NAMES:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATOR_NAMES}, got {self.kl_estimator!r}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}")
        if self.eval_mode not in EVAL_MODES:
            raise ValueError(f"eval_mode must be one of {EVAL_MODES}, got {self.eval_mode!r}")
        if self.adv_estimator in ("grpo", "rloo") and self.rollout_n < 2:
            raise ValueError(f"adv_estimator {self.adv_estimator} needs rollout_n >= 2 (a group), got {self.rollout_n}")
        rollout = self.per_device_prompt_batch_size * self.rollout_n
        micro = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if rollout % micro:
            raise ValueError(
                f"per_device_prompt_batch_size*rollout_n ({rollout}) must be a multiple of "
                f"per_device_train_batch_size*gradient_accumulation_steps ({micro})"
            )
        if self.pipeline_parallel_degree > 1:
            raise ValueError("pipeline_parallel_degree > 1 is not supported by the PPO trainer yet; use sharding or tensor parallel")

    @property
    def use_critic(self):
        return self.adv_estimator == "gae"
