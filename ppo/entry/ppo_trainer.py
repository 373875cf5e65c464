"""The PPO / GRPO / RLOO / REINFORCE++ run, built from its parts (`build_ppo_trainer`).

One step, top to bottom (`ppo.trainer.loop.OnlineLoop.train_step`):
  1. rollout: `per_device_prompt_batch_size` prompts x `rollout_n` samples;
  2. score: every scored objective (the reward: reward model, reward server or rule scorers,
     minus `missing_eos_penalty`; a cost under PPO-Lagrangian);
  3. log-probs of actor (old) and reference, each objective's critic values;
  4. token rewards (KL per token, score at the last token), advantages, the combined one;
  5. update: `update_iters` epochs of shuffled mini-batches for the actor and the critics;
  6. reduce metrics across ranks (in one place).
GRPO and the other critic-free estimators are an `adv_estimator` choice; a cost model
(`cost_model_name_or_path`) adds the cost objective and the Lagrangian combiner (Safe RLHF).

The parts (`ppo/trainer/`): `Rollout`, `Scoring`, `AdvantageStage` inside the
`ExperienceMaker`; the `PPOUpdater`; the `RunState`; the `OnlineLoop` that only orchestrates.
Each is built here from its slice of the arguments (`ppo.trainer.settings`); the parallel
strategy (`ppo.strategy`) wraps the models and builds the passes every model pass goes through.
"""
import functools
import json
import logging
import os

import paddle

from ..algos import AdaptiveKLController, FixedKLController
from ..agents.arguments import AgentSettings
from ..algos.normalizer import RunningMeanStd
from ..common.console_report import run_label
from ..common.divergence import DivergenceDetector
from .policy_loss_arguments import policy_loss_startup_line
from ..checkpoints.resume_check import ppo_run_facts
from ..optimization.offload import OffloadPlan, parse_offload_level
from ..optimization.optim import build_optimizer, build_scheduler
from .ppo_argument_checks import estimator_settings
from ..scoring.process_reward import ProcessRewardScorer
from ..data.prompt_sampler import PromptSampler
from ..evaluation import LONG_ANSWER_LEN
from ..rollout import RolloutEngine, SamplingParams
from ..rollout.tp_weights import hold_slices
from ..strategy import PassSettings, PlainStrategy, Ranks, build_strategy
from ..strategy.rollout_link import run_link, whole_parameters
from ..trainer.advantages import AdvantageStage
from ..trainer.agent_eval import AgentEvaluator
from ..trainer.agent_rollout import ToolFailureWatch, TrajectoryRollout
from ..trainer.best_policy import BestPolicy, EvalEarlyStop, eval_metric_name
from ..trainer.env_reward import EnvironmentScorer
from ..trainer.evaluator import Evaluator
from ..trainer.experience_maker import ExperienceMaker
from ..trainer.loop import OnlineLoop
from ..trainer.objectives import COST_VALUE_STATS, LagrangianCombiner, PlainCombiner, ScoredObjective, TrainedModel
from ..trainer.report import ResponseSamples, RunReport
from ..trainer.remote_rollout import RemoteRollout
from ..trainer.rollout import Rollout
from ..trainer.rollout_worker import GenerationInPlace, RolloutWorker, RolloutWorkerState
from ..trainer.run_state import RunState
from ..trainer.scoring import ProcessRewardModelScorer, RewardServerScorer, RuleScorer, ScoreModel, ScorePenalties, Scoring
from ..trainer.settings import (
    AdvantageSettings,
    CheckpointSettings,
    EvalSettings,
    LoopSettings,
    PenaltySettings,
    RolloutSettings,
    UpdateSettings,
    slice_of,
)
from ..trainer.updater import NonFiniteError, OptimizerSteps, PPOUpdater, PtxBatches
from ..trainer.watch import DivergenceWatch
from ..strategy import first_non_finite

logger = logging.getLogger("ppo")

__all__ = ["NonFiniteError", "build_ppo_trainer", "build_rollout_worker", "first_non_finite", "trained_model"]

CRITIC_NAMES = {"reward": ("critic", "value"), "cost": ("cost_critic", "cost_value")}
"""Each objective's critic: its name in metrics and offloading, its checkpoint folder."""


def trained_model(name, checkpoint, model, strategy, args, total_steps, critic=False):
    """A `TrainedModel` of `model` (None without one): its AdamW and learning-rate schedule (the
    actor's settings, or the `critic_*` ones, as safe-rlhf's cost critic), wrapped by the strategy."""
    if model is None:
        return None
    if critic:
        schedule = (args.critic_lr_scheduler_type, args.critic_learning_rate, args.critic_min_learning_rate,
                    args.critic_warmup_ratio, 0)
        decay, clip = args.critic_weight_decay, args.critic_max_grad_norm
    else:
        schedule = (args.lr_scheduler_type, args.learning_rate, args.min_learning_rate, args.warmup_ratio, args.warmup_steps)
        decay, clip = args.weight_decay, args.max_grad_norm
    scheduler = build_scheduler(*schedule, total_steps)
    optimizer = build_optimizer(model, scheduler, decay, clip, args.adam_beta1, args.adam_beta2, args.adam_epsilon,
                                fused=args.use_fused_adamw)
    wrapped, optimizer = strategy.wrap(model, optimizer)
    return TrainedModel(name, checkpoint, wrapped, model, optimizer, scheduler)


def reward_scorer(tokenizer, passes, offload, reward_client=None, rule_scorer=None, prm=None):
    """The reward's scorer: the rule scorers, the reward server, the process reward model (`prm`:
    `(ProcessRewardScorer, prm_reduction)`), the reward model, or, without any (`env_name` alone),
    the environment's rewards (ppo/trainer/env_reward.py)."""
    if rule_scorer is not None:
        return RuleScorer(tokenizer, rule_scorer)
    if reward_client is not None:
        return RewardServerScorer(tokenizer, reward_client)
    if prm is not None:
        return ProcessRewardModelScorer(prm[0], prm[1], offload, eos_token_id=tokenizer.eos_token_id)
    if passes.models.reward is None:  # env_name alone (checked at start-up): the environment's rewards
        return EnvironmentScorer()
    return ScoreModel(passes, "reward", offload)


def process_reward_model(args, models, tokenizer, reward_retokenizer=None):
    """`(ProcessRewardScorer, prm_reduction)` when the reward model is a process reward model
    (its config says `process_reward`), else None."""
    if models.reward is None or not getattr(getattr(models.reward, "config", None), "process_reward", False):
        return None
    prm_tokenizer = reward_retokenizer.reward_tokenizer if reward_retokenizer is not None else tokenizer
    scorer = ProcessRewardScorer(models.reward, prm_tokenizer, step_separator=args.prm_step_separator,
                                 policy_tokenizer=tokenizer, batch_size=max(args.pass_rows("reward"), 1),
                                 step_tokens=args.prm_step_tokens, end_step=args.prm_end_step)
    return scorer, args.prm_reduction


def ppo_objectives(args, models, critics, reward, passes, offload):
    """The run's scored objectives: the reward, and with a cost model the cost (PPO-Lagrangian)."""
    objectives = [ScoredObjective("reward", reward, critics.get("reward"),
                                  normalizer=RunningMeanStd() if args.normalize_reward else None,
                                  penalties=ScorePenalties(slice_of(PenaltySettings, args)))]
    if models.cost is not None:
        objectives.append(ScoredObjective("cost", ScoreModel(passes, "cost", offload), critics.get("cost"), kl_weight=-1.0,
                                          metric="objective/cost", value_stats=COST_VALUE_STATS, sample_key="cost"))
    return objectives


def samplers(args, ranks, train_dataset, ptx_dataset):
    """This data rank's prompt sampler (DAPO's generation batch with `global_gen_batch_size`) and
    the ptx data's (None without it)."""
    draw = args.global_gen_batch_size // ranks.data_world if args.global_gen_batch_size > 0 else args.per_device_prompt_batch_size
    sampler = PromptSampler(len(train_dataset), draw, ranks.data_rank, ranks.data_world, args.seed, shuffle=args.dataloader_shuffle)
    ptx_sampler = None
    if ptx_dataset is not None and args.ptx_coeff > 0:
        ptx_sampler = PromptSampler(len(ptx_dataset), args.per_device_train_batch_size, ranks.data_rank, ranks.data_world,
                                    args.seed + 1)
    if args.balance_batch and ranks.data_world == 1:  # PaddleNLP's YAML files set it on one process too
        logger.info("balance_batch: one data-parallel rank, nothing to balance (it reorders rollout groups over ranks)")
    return sampler, ptx_sampler


def rollout_engine(args, model, tokenizer, tensor_parallel_group, keep_tensor_parallel):
    """The run's `RolloutEngine` over `model` (the passes' generation model, or a rollout rank's
    actor); `keep_tensor_parallel` (the run's `eval_mode` for the passes' model) True with a whole
    model and a group generates from this rank's slices (a split run's replica of several ranks)."""
    return RolloutEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         use_rollout_engine=args.use_fusemt, kernels=args.rollout_kernels,
                         keep_tensor_parallel=keep_tensor_parallel, max_num_seqs=args.rollout_max_num_seqs,
                         tensor_parallel_group=tensor_parallel_group,
                         record_routing=getattr(args, "moe_routing_replay", "none") == "rollout")


def sampling_params(args):
    """The rollout's `SamplingParams`."""
    return SamplingParams(max_new_tokens=args.max_dec_len, min_new_tokens=args.min_dec_len, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty, do_sample=True)


def make_rollout(args, engine, sampling, sampler, dataset, tokenizer, passes, offload, state, ranks, settings, remote=None):
    """The rollout part: `TrajectoryRollout` with an environment (`env_name`: multi-turn, tools;
    its prompts formatted as the prompt data's), a `RemoteRollout` with `rollout_placement split`
    (`remote`: `(actor parameters callable, max_steps, the actor)`), else `Rollout`; the tool-failure count of
    a multi-turn run goes into the checkpoints."""
    if args.split_rollout:
        params, max_steps, actor = remote
        link = run_link()
        link.plan_slices(actor)  # what each rank of a tensor-parallel replica receives of the weights
        return RemoteRollout(link, params, sampler, state, staleness=args.async_staleness, max_steps=max_steps,
                             partial=args.partial_rollout)
    if not args.env_name:
        return Rollout(engine, sampling, sampler, dataset, tokenizer, passes, offload=offload, state=state, ranks=ranks,
                       settings=settings)
    agent = AgentSettings.of(args)
    watch = ToolFailureWatch(agent.max_tool_failure_frac, agent.tool_failure_steps)
    state.parts["tool_failures"] = watch
    return TrajectoryRollout(engine, sampling, sampler, dataset, tokenizer, passes, offload=offload, state=state, ranks=ranks,
                             settings=settings, agent=agent,
                             prompt_format=(dataset.use_chat_template, dataset.prompt_template), watch=watch)


def build_ppo_trainer(args, models, tokenizer, train_dataset, eval_dataset=None, ptx_dataset=None, reward_client=None,
                      eval_long_answer_len=LONG_ANSWER_LEN, rule_scorer=None, reward_retokenizer=None, strategy=None):
    """The `OnlineLoop` of a PPO-family run. `models`: `PPOModels`; `reward_client`: a reward-server
    client, or `rule_scorer`: a `ppo.scorers.WeightedScorer`, in place of the reward model;
    `ptx_dataset`: supervised data for the ptx loss (with `ptx_coeff > 0`); `reward_retokenizer`:
    the reward model's own tokenizer (`ppo.models.reward_tokens`); `strategy`: the parallel
    strategy (default: `build_strategy(args)`)."""
    strategy = strategy or build_strategy(args)
    ranks = strategy.ranks
    max_steps = args.total_steps(len(train_dataset), ranks.data_world)
    actor = trained_model("actor", "policy", models.actor, strategy, args, max_steps)
    critics = {name: trained_model(*CRITIC_NAMES[name], model, strategy, args, max_steps, critic=True)
               for name, model in models.critic_models().items()}
    passes = strategy.build_passes(models, actor.model, {n: c.model for n, c in critics.items()},
                                   {"actor": actor.optimizer, **{n: c.optimizer for n, c in critics.items()}}, PassSettings(
        temperature=args.temperature, logprob_chunk_size=args.logprob_chunk_size, pad_token_id=tokenizer.pad_token_id,
        chunk_rows={which: args.pass_rows(which) for which in ("logprob", "value", "reward")},
        micro_batches=args.update_accumulation_steps, micro_rows=args.update_micro_rows, remove_padding=args.use_remove_padding,
        keep_tensor_parallel=args.keep_tensor_parallel, logprob_dtype=args.logprob_dtype,
        retokenizers={"reward": reward_retokenizer} if reward_retokenizer is not None else {}))
    engine = rollout_engine(args, passes.generation_model, tokenizer, strategy.generation_group(),
                            args.keep_tensor_parallel)
    sampling = sampling_params(args)
    trained = [actor, *critics.values()]
    offload = OffloadPlan(parse_offload_level(args.offload_level),
                          models={"actor": models.actor, "reference": models.reference, "reward": models.reward,
                                  "critic": models.critic, "cost": models.cost, "cost_critic": models.cost_critic},
                          optimizers={f"{t.name}_optimizer": t.optimizer for t in trained})
    prm = process_reward_model(args, models, tokenizer, reward_retokenizer)
    objectives = ppo_objectives(args, models, critics, reward_scorer(tokenizer, passes, offload, reward_client, rule_scorer, prm),
                                passes, offload)
    loop = assemble_ppo_loop(args, models, tokenizer, strategy, passes, engine, sampling, offload, actor, objectives,
                             max_steps, (train_dataset, eval_dataset, ptx_dataset), eval_long_answer_len)
    offload.offload_all()
    return loop


def assemble_ppo_loop(args, models, tokenizer, strategy, passes, engine, sampling, offload, actor, objectives, max_steps,
                      datasets, eval_long_answer_len):
    """The PPO-family parts around the passes and objectives, and the loop that runs them."""
    ranks, (train_dataset, eval_dataset, ptx_dataset) = strategy.ranks, datasets
    sampler, ptx_sampler = samplers(args, ranks, train_dataset, ptx_dataset)
    combiner = LagrangianCombiner.from_args(args, ranks) if models.cost is not None else PlainCombiner()
    kl_control = AdaptiveKLController(args.kl_coeff, args.target_kl, args.kl_horizon) if args.target_kl else FixedKLController(args.kl_coeff)
    watch = DivergenceWatch(DivergenceDetector(args.divergence_factor, args.divergence_window), ranks)
    early_stop = EvalEarlyStop(eval_metric_name(args.metric_for_best_model or "loss"), args.greater_is_better is not False,
                               args.early_stopping_patience, args.early_stopping_threshold) if args.early_stopping else None
    best = None
    if args.load_best_model_at_end:  # PaddleNLP's names; checked in ppo.entry.ppo_argument_checks
        best = BestPolicy(eval_metric_name(args.metric_for_best_model), args.greater_is_better is not False)
    trained = [actor] + [o.critic for o in objectives if o.critic is not None]
    state = RunState(
        slice_of(CheckpointSettings, args), strategy, tokenizer,
        models={"policy": models.actor, "value": models.critic, **({"cost_value": models.cost_critic} if models.cost_critic else {})},
        optimizers={t.checkpoint: t.optimizer for t in trained}, schedulers={t.checkpoint: t.scheduler for t in trained},
        parts={"sampler": sampler, "ptx_sampler": ptx_sampler, "reward_normalizer": objectives[0].normalizer,
               "kl_controller": kl_control, "divergence": watch, "lagrange": combiner,
               **({"early_stopping": early_stop} if early_stop is not None else {}),
               **({"best_policy": best} if best is not None else {})},
        run_facts={**ppo_run_facts(args), "cost_model": models.cost is not None},
    )
    scoring = Scoring(objectives)
    reference_scope = ("reference",) if models.reference is not None else ("reference", "actor")
    completion = AdvantageStage(passes, objectives, combiner, args.estimator, kl_control=kl_control, offload=offload,
                                reference_scope=reference_scope, ranks=ranks, state=state,
                                settings=slice_of(AdvantageSettings, args), estimator_settings=estimator_settings(args))
    rollout_settings = slice_of(RolloutSettings, args)
    rollout = make_rollout(args, engine, sampling, sampler, train_dataset, tokenizer, passes, offload, state, ranks,
                           rollout_settings, remote=(functools.partial(whole_parameters, models.actor), max_steps, models.actor))
    maker = ExperienceMaker(rollout, scoring, completion, actor.model, state, ranks, settings=rollout_settings,
                            pad_token_id=tokenizer.pad_token_id)
    ptx = PtxBatches(ptx_dataset, ptx_sampler) if ptx_sampler is not None else None
    steps = OptimizerSteps(strategy, state, args.max_nan_skips, args.release_gradients)
    learner = PPOUpdater(actor, objectives, passes, steps, ptx=ptx, divergence=watch, offload=offload, state=state, ranks=ranks,
                         settings=slice_of(UpdateSettings, args),
                         samples=ResponseSamples(tokenizer, objectives, args.rollout_n, token_details=args.sample_token_details))
    if ranks.is_main:
        logger.info(policy_loss_startup_line(args))
    evaluator_class, agent_parts = ((AgentEvaluator, dict(agent=rollout.agent, turn_format=rollout.turn_format))
                                    if args.env_name else (Evaluator, {}))  # env_name: trajectories (ppo/trainer/agent_eval.py)
    evaluator = evaluator_class(eval_dataset, engine, sampling, tokenizer, passes, actor.model, scoring=scoring, offload=offload,
                                state=state, ranks=ranks, settings=slice_of(EvalSettings, args),
                                long_answer_len=eval_long_answer_len, **agent_parts)
    report = RunReport(slice_of(LoopSettings, args), ranks.is_main, run_label(args.adv_estimator, combiner.constrained))
    return OnlineLoop(maker, learner, state, report, evaluator, watch, strategy=strategy, settings=slice_of(LoopSettings, args),
                      max_steps=max_steps, actor=models.actor, passes=passes, offload=offload, best_policy=best,
                      early_stop=early_stop)


def build_rollout_worker(args, actor, tokenizer, train_dataset, models=None):
    """A split run's rollout rank (`rollout_placement split`): the `RolloutWorker` generating with
    `actor` (loaded alone, `ppo.models.ppo_models.load_actor`) the batches the colocated run's
    `Rollout` of each trainer rank it serves would, from the same prompts and seeded draws.
    `models`: `PPOModels` with the actor and its reference when the run has a KL to the reference
    (the rollout rank then computes the reference log-probs with the trainer's own pass), else None."""
    reference_pass = None
    if models is not None:
        passes = PlainStrategy(Ranks()).build_passes(models, actor, {}, {}, PassSettings(  # split: plain layouts only
            temperature=args.temperature, logprob_chunk_size=args.logprob_chunk_size, pad_token_id=tokenizer.pad_token_id,
            chunk_rows={which: args.pass_rows(which) for which in ("logprob", "value", "reward")},
            remove_padding=args.use_remove_padding, logprob_dtype=args.logprob_dtype))
        reference_pass = functools.partial(no_grad_call, passes.logprobs, "reference")
    link = run_link()
    layout, group = link.layout, link.replica_group  # a replica of several ranks: its group
    if group is not None:
        hold_replica_slices(args, actor, link, group)
    engine = rollout_engine(args, actor, tokenizer, group, group is not None)
    offload = OffloadPlan(parse_offload_level(args.offload_level), models={"actor": actor}, optimizers={})
    rollouts = {}
    for d in layout.served_data_ranks(link.rank):  # each draws as colocated data rank d would
        ranks = Ranks(data_rank=d, data_world=layout.data_ranks)
        sampler, _ = samplers(args, ranks, train_dataset, None)
        rollouts[d] = Rollout(engine, sampling_params(args), sampler, train_dataset, tokenizer, GenerationInPlace(),
                              offload=offload, state=RolloutWorkerState(), ranks=ranks, settings=slice_of(RolloutSettings, args))
    return RolloutWorker(link, rollouts, list(actor.parameters()), args.async_staleness, reference_pass,
                         partial_tokens=args.partial_rollout_tokens if args.partial_rollout else 0)


def hold_replica_slices(args, actor, link, group):
    """Cut the actor of rank `group.rank` of a replica of `group.nranks` ranks to its slices
    (`ppo.rollout.tp_weights.hold_slices`; a LoRA actor stays whole) before the engine is built,
    and write what it holds to `output_dir/rollout_rank_<rank>.json`."""
    if link.layout.weight_shard(link.rank) != group.rank:  # the replica's group numbers its ranks in order
        raise RuntimeError(f"rollout rank {link.rank} is rank {group.rank} of its replica's group, not "
                           f"{link.layout.weight_shard(link.rank)}")
    kinds, sizes = hold_slices(actor, group.rank, group.nranks)
    sliced = any(kind != "replicated" for kind in kinds)
    logger.info(f"rollout replica of ranks {link.layout.replica_members(link.rank)}: generating from this rank's "
                f"tensor-parallel slice ({group.rank + 1} of {group.nranks}), "
                + (f"holding {sizes['parameter_bytes']} of the whole model's {sizes['whole_parameter_bytes']} parameter "
                   "bytes; it receives only its slice" if sliced else "holding the whole weights (a LoRA actor)"))
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, f"rollout_rank_{link.rank}.json"), "w") as f:
        json.dump({"rank": link.rank, "replica_rank": group.rank, "replica_degree": group.nranks, "sliced": sliced,
                   **sizes}, f)


def no_grad_call(fn, *args):
    """`fn(*args)` without gradients."""
    with paddle.no_grad():
        return fn(*args)
