"""Online (iterative) DPO as the online loop of the PPO family with its own learner.

The experience maker draws `rollout_n` answers per prompt from the current policy (the rollout
engine, `ppo.trainer.rollout`) and scores them with the scorer `run_ppo.py` would use (reward
model, reward server or rule scorers: `ppo.trainer.scoring`; or a generative judge's pointwise
verdict: `dpo.pair_choice.JudgeScorer`); the learner (`dpo.online_learner.OnlineDPOLearner`) makes
the pairs (by the scores, or by the judge's pairwise verdicts: `dpo.pair_choice`) and trains on them; the run state,
checkpoints (with fall-back to an older one), evaluation, divergence and signal stops are the
loop's (`ppo.trainer`). Online DPO runs on one process."""
import dataclasses

from ppo.common.divergence import DivergenceDetector
from ppo.optimization.offload import OffloadPlan
from ppo.entry.ppo_trainer import reward_scorer, trained_model
from ppo.data.prompt_sampler import PromptSampler
from ppo.evaluation import LONG_ANSWER_LEN
from ppo.rollout import RolloutEngine, SamplingParams
from ppo.strategy import PassSettings, build_strategy
from ppo.trainer.evaluator import Evaluator
from ppo.trainer.experience_maker import ExperienceMaker
from ppo.trainer.loop import OnlineLoop
from ppo.trainer.objectives import ScoredObjective
from ppo.trainer.report import RunReport
from ppo.trainer.rollout import Rollout
from ppo.trainer.run_state import RunState
from ppo.trainer.scoring import ScorePenalties, Scoring
from ppo.trainer.settings import CheckpointSettings, EvalSettings, LoopSettings, PenaltySettings, RolloutSettings, slice_of
from ppo.trainer.updater import OptimizerSteps
from ppo.trainer.watch import DivergenceWatch

from .online_learner import OnlineDPOLearner
from .pair_choice import JudgedPairs, JudgeScorer, ScoredPairs

STEP_LINE_METRICS = ("objective/scores", "online_dpo/num_pairs", "online_dpo/score_gap", "loss/total", "loss/dpo",
                     "loss/sft", "rewards/accuracies", "rewards/margins", "lr", "response_length/mean", "timing_s/step")
"""The metrics of a round's console line (`console_report.step_line`)."""


def build_online_dpo_trainer(args, models, tokenizer, train_dataset, eval_dataset=None, reward_client=None, rule_scorer=None,
                             eval_long_answer_len=LONG_ANSWER_LEN, strategy=None, judge=None):
    """The `OnlineLoop` of an online DPO run. `models`: a `PPOModels` (actor = policy; reference
    None for a LoRA policy, whose adapter is switched off instead; reward None when a server,
    rules or the judge score); `reward_client` / `rule_scorer` as `run_ppo.py`'s; `judge`: a
    `GenerativeJudge` that chooses the pairs (`dpo.pair_choice.build_judge`; None: the scores do),
    and scores the answers too when nothing else does (no reward model, client or rule scorer)."""
    strategy = strategy or build_strategy(args)
    if strategy.ranks.world_size > 1:
        raise ValueError("online DPO runs on one process; launch it without paddle.distributed.launch")
    if args.ref_update_rounds and models.reference is None:
        raise ValueError("ref_update_rounds: a LoRA policy's reference is the base model with the adapter off and "
                         "cannot be refreshed; train without LoRA or set ref_update_rounds 0")
    policy = trained_model("actor", "policy", models.actor, strategy, args, args.max_steps)
    rows = max(args.per_device_eval_batch_size, args.per_device_train_batch_size)
    passes = strategy.build_passes(models, policy.model, {}, {"actor": policy.optimizer}, PassSettings(
        temperature=1.0, logprob_chunk_size=args.logprob_chunk_size, pad_token_id=tokenizer.pad_token_id,
        chunk_rows=dict.fromkeys(("logprob", "value", "reward"), rows)))  # DPO's log-probs: the policy's own distribution
    engine = RolloutEngine(policy.model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                           use_rollout_engine=args.use_fusemt, kernels=args.rollout_kernels)
    sampling = SamplingParams(max_new_tokens=args.max_dec_len, min_new_tokens=args.min_dec_len, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty, do_sample=True)
    sampler = PromptSampler(len(train_dataset), args.per_device_prompt_batch_size, seed=args.seed, shuffle=args.dataloader_shuffle)
    offload = OffloadPlan((), models={}, optimizers={})
    ranks, watch = strategy.ranks, DivergenceWatch(DivergenceDetector(args.divergence_factor, args.divergence_window), strategy.ranks)
    state = RunState(slice_of(CheckpointSettings, args), strategy, tokenizer,
                     models={"policy": models.actor, "reference": models.reference if args.ref_update_rounds else None},
                     optimizers={"policy": policy.optimizer}, schedulers={"policy": policy.scheduler},
                     parts={"sampler": sampler, "divergence": watch}, run_facts={"loss_type": args.loss_type})
    judge_scores = judge is not None and models.reward is None and reward_client is None and rule_scorer is None
    scorer = JudgeScorer(judge, tokenizer) if judge_scores else reward_scorer(tokenizer, passes, offload, reward_client,
                                                                              rule_scorer)
    scoring = Scoring([ScoredObjective("reward", scorer, penalties=ScorePenalties(slice_of(PenaltySettings, args)))])
    settings = slice_of(RolloutSettings, args)
    rollout = Rollout(engine, sampling, sampler, train_dataset, tokenizer, passes, offload=offload, state=state, ranks=ranks,
                      settings=settings)
    maker = ExperienceMaker(rollout, scoring, None, policy.model, state, ranks, settings=settings,
                            pad_token_id=tokenizer.pad_token_id)
    steps = OptimizerSteps(strategy, state, args.max_nan_skips, args.release_gradients)
    choose_pairs = ScoredPairs(args) if judge is None else JudgedPairs(judge, tokenizer, args)
    learner = OnlineDPOLearner(policy, models, passes, steps, divergence=watch, tokenizer=tokenizer, state=state, args=args,
                               choose_pairs=choose_pairs)
    evaluator = Evaluator(eval_dataset, engine, sampling, tokenizer, passes, policy.model, scoring=scoring, offload=offload,
                          state=state, ranks=ranks, settings=slice_of(EvalSettings, args), long_answer_len=eval_long_answer_len)
    loop_settings = slice_of(LoopSettings, args)
    report = RunReport(loop_settings, ranks.is_main, "online DPO", STEP_LINE_METRICS)
    return OnlineLoop(maker, learner, state, report, evaluator, watch, strategy=strategy, settings=loop_settings,
                      max_steps=args.max_steps, actor=models.actor, passes=passes, offload=offload)


def without_unused_reference(models, args):
    """`models` without the reference copy when the loss uses none (SimPO, ORPO)."""
    if not args.uses_reference and models.reference is not None:
        return dataclasses.replace(models, reference=None)
    return models
