"""PPO / GRPO / RLOO / REINFORCE++ trainer.

One step, top to bottom (`train_step`):
  1. rollout: `per_device_prompt_batch_size` prompts x `rollout_n` samples;
  2. score: reward model or reward server, `missing_eos_penalty`;
  3. log-probs of actor (old) and reference, critic values;
  4. shape rewards (KL per token, score at the last token), advantages;
  5. update: `update_iters` epochs of shuffled mini-batches for actor and critic;
  6. reduce metrics across ranks (in one place).
GRPO and the other critic-free estimators are an `adv_estimator` choice; a cost model
(`cost_model_name_or_path`) makes it PPO-Lagrangian (Safe RLHF, `trainer/lagrange_step.py`).

The parts live in `ppo/trainer/`: steps 1-4 in `experience_maker.py`, step 5 in `update.py`,
the step and the loop around it in `loop.py`. Every pass through a model goes through
`self.passes` (`ppo.passes`), picked once here for the parallel strategy.
"""
import logging

import paddle.distributed as dist

from .algos import AdaptiveKLController
from .algos.normalizer import RunningMeanStd
from .common.divergence import DivergenceDetector
from .common.resume_check import ppo_run_facts
from .offload import OffloadPlan, parse_offload_level
from .optim import build_optimizer, build_scheduler
from .passes import build_model_passes, wrap_for_ranks
from .prompt_sampler import PromptSampler
from .rollout import RolloutEngine, SamplingParams
from .trainer.experience_maker import ExperienceMaking
from .trainer.lagrange_step import LagrangeStep, build_lagrange_multiplier
from .trainer.loop import TrainingLoop
from .trainer.update import NonFiniteError, PolicyUpdate, first_non_finite

logger = logging.getLogger("ppo")

__all__ = ["NonFiniteError", "PPOTrainer", "first_non_finite"]


class PPOTrainer(ExperienceMaking, LagrangeStep, PolicyUpdate, TrainingLoop):
    """`models`: `PPOModels`; `reward_client`: a reward-server client, or `rule_scorer`: a
    `ppo.scorers.WeightedScorer`, in place of the reward model; `ptx_dataset`: supervised data
    for the ptx loss (with `ptx_coeff > 0`)."""

    def __init__(
        self, args, models, tokenizer, train_dataset, eval_dataset=None, ptx_dataset=None, reward_client=None, eval_long_answer_len=5,
        rule_scorer=None, reward_retokenizer=None,
    ):
        self.args, self.models, self.tokenizer = args, models, tokenizer
        self.train_dataset, self.eval_dataset, self.ptx_dataset = train_dataset, eval_dataset, ptx_dataset
        self.reward_client = reward_client
        self.rule_scorer = rule_scorer  # ppo.scorers.WeightedScorer when use_rule_reward
        self.init_step_state()
        self.eval_long_answer_len = eval_long_answer_len
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.step = 0
        self.episodes = 0
        self.nan_streak = 0
        self.gen_batches = 0  # rollout batches drawn so far (unique group ids)

        self.max_steps = args.total_steps(len(train_dataset), self.data_world)
        self.build_optimizers(self.max_steps)
        self.actor, self.actor_optimizer = wrap_for_ranks(args, models.actor, self.actor_optimizer)
        self.critic, self.critic_optimizer = wrap_for_ranks(args, models.critic, self.critic_optimizer)
        self.cost_critic, self.cost_critic_optimizer = wrap_for_ranks(args, models.cost_critic, self.cost_critic_optimizer)
        self.passes = build_model_passes(  # every model pass of a step, whatever the parallel strategy
            args, models, self.actor, self.critic, (self.actor_optimizer, self.critic_optimizer), tokenizer.pad_token_id,
            reward_retokenizer=reward_retokenizer,  # ppo.models.reward_tokens: the reward model's own tokenizer
            cost_critic=self.cost_critic,
        )
        self.engine = RolloutEngine(
            self.passes.generation_model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            use_rollout_engine=args.use_fusemt, kernels=args.rollout_kernels, keep_tensor_parallel=args.keep_tensor_parallel,
            max_num_seqs=args.rollout_max_num_seqs,
        )
        self.sampling = SamplingParams(
            max_new_tokens=args.max_dec_len, min_new_tokens=args.min_dec_len, temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty, do_sample=True,
        )
        self.reward_normalizer = RunningMeanStd() if args.normalize_reward else None
        self.build_samplers()
        self.tracker = None
        self.offload = OffloadPlan(
            parse_offload_level(args.offload_level),
            models={"actor": models.actor, "reference": models.reference, "reward": models.reward, "critic": models.critic,
                    "cost": models.cost, "cost_critic": models.cost_critic},
            optimizers={"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer,
                        "cost_critic_optimizer": self.cost_critic_optimizer},
        )
        self.offload.offload_all()

    # ------------------------------------------------------------------ set-up helpers
    def build_optimizers(self, total_steps):
        """The actor's (and critic's) learning-rate schedule over `total_steps` and AdamW."""
        args, models = self.args, self.models
        self.actor_scheduler = build_scheduler(
            args.lr_scheduler_type, args.learning_rate, args.min_learning_rate, args.warmup_ratio, args.warmup_steps, total_steps
        )
        self.actor_optimizer = build_optimizer(
            models.actor, self.actor_scheduler, args.weight_decay, args.max_grad_norm, args.adam_beta1, args.adam_beta2, args.adam_epsilon,
            fused=args.use_fused_adamw,
        )
        self.critic_scheduler, self.critic_optimizer = self.build_critic_optimizer(models.critic, total_steps)
        self.cost_critic_scheduler, self.cost_critic_optimizer = self.build_critic_optimizer(models.cost_critic, total_steps)

    def build_critic_optimizer(self, critic, total_steps):
        """`(scheduler, AdamW)` of a critic (the reward's or the cost's, with the `critic_*`
        settings, as safe-rlhf's cost critic); `(None, None)` without one."""
        args = self.args
        if critic is None:
            return None, None
        scheduler = build_scheduler(
            args.critic_lr_scheduler_type, args.critic_learning_rate, args.critic_min_learning_rate, args.critic_warmup_ratio, 0,
            total_steps,
        )
        optimizer = build_optimizer(
            critic, scheduler, args.critic_weight_decay, args.critic_max_grad_norm,
            args.adam_beta1, args.adam_beta2, args.adam_epsilon, fused=args.use_fused_adamw,
        )
        return scheduler, optimizer

    def build_samplers(self):
        """This data rank's prompt sampler (and the ptx data's, with `ptx_coeff > 0`)."""
        args = self.args
        draw = args.global_gen_batch_size // self.data_world if args.global_gen_batch_size > 0 else args.per_device_prompt_batch_size
        self.sampler = PromptSampler(  # DAPO's generation batch (global_gen_batch_size) when it has one
            len(self.train_dataset), draw, self.data_rank, self.data_world, args.seed, shuffle=args.dataloader_shuffle,
        )
        self.ptx_sampler = None
        if self.ptx_dataset is not None and args.ptx_coeff > 0:
            self.ptx_sampler = PromptSampler(
                len(self.ptx_dataset), args.per_device_train_batch_size, self.data_rank, self.data_world, args.seed + 1
            )
        self.collate_prompts = self.train_dataset.get_collator()
        if args.balance_batch and self.data_world == 1:  # PaddleNLP's YAML files set it on one process too
            logger.info("balance_batch: one data-parallel rank, nothing to balance (it reorders rollout groups over ranks)")

    def init_step_state(self):
        """The state one training step reads and updates besides models and optimisers:
        estimator, KL controller, score parts, divergence watch, gradient norms."""
        args = self.args
        self.estimator = args.estimator  # the registry entry: critic, groups, whitening
        self.kl_controller = AdaptiveKLController(args.kl_coeff, args.target_kl, args.kl_horizon) if args.target_kl else None
        self.score_stats = {}
        self.divergence = DivergenceDetector(args.divergence_factor, args.divergence_window)
        self.grad_norms = {}  # model name -> gradient norm of its last optimiser step (before clipping)
        self.diverged = {}  # metric name -> first divergence message of the current step
        self.lagrange = build_lagrange_multiplier(args) if self.models.cost is not None else None  # PPO-Lagrangian
        self.lagrange_stats = {}
        self.divergence_log = []  # every divergence message of the run (summary.json "diverged")

    @property
    def data_rank(self):
        """This rank's index among the ranks that read different data (PaddleNLP's dataset rank:
        tensor-parallel ranks of one group share it, and their prompts, seeds and groups)."""
        return self.args.dataset_rank

    @property
    def data_world(self):
        """How many ranks read different data (PaddleNLP's dataset world size)."""
        return self.args.dataset_world_size

    def generation_weights(self):
        """Context giving the model the rollout engine and the evaluation generate with, holding
        the actor's current weights (see `ModelPasses.generation_weights`)."""
        return self.passes.generation_weights()

    def _models_for_checkpoint(self):
        models = {"policy": self.models.actor, "value": self.models.critic}
        if self.models.cost_critic is not None:  # PPO-Lagrangian
            models["cost_value"] = self.models.cost_critic
        return models

    def _optimizers_for_checkpoint(self):
        return {"policy": self.actor_optimizer, "value": self.critic_optimizer, "cost_value": self.cost_critic_optimizer}

    def _schedulers_for_checkpoint(self):
        return {"policy": self.actor_scheduler, "value": self.critic_scheduler, "cost_value": self.cost_critic_scheduler}

    def run_facts(self):
        """What a checkpoint records about the run and a resume compares (`ppo.common.resume_check`)."""
        return {**ppo_run_facts(self.args), "cost_model": self.models.cost is not None}

