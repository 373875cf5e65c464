"""PPO / GRPO / RLOO / REINFORCE++ trainer.

One step, top to bottom (`train_step`):
  1. rollout: `per_device_prompt_batch_size` prompts x `rollout_n` samples;
  2. score: reward model or reward server, `missing_eos_penalty`;
  3. log-probs of actor (old) and reference, critic values;
  4. shape rewards (KL per token, score at the last token), advantages;
  5. update: `update_iters` epochs of shuffled mini-batches for actor and critic;
  6. reduce metrics across ranks (in one place).
GRPO and the other critic-free estimators are an `adv_estimator` choice.
"""
import contextlib
import json
import logging
import math
import os
import time

import numpy as np
import paddle
import paddle.distributed as dist
from tqdm import tqdm

from .algos import (
    AdaptiveKLController,
    entropy_bonus_from_token_entropy,
    group_zero_std_fraction,
    kl_loss,
    kl_shaped_rewards,
    masked_mean,
    masked_whiten,
    overlong_penalty,
    ppo_policy_loss,
    truncated_completion_mask,
    value_loss,
)
from .algos.normalizer import RunningMeanStd
from .checkpoint import list_checkpoints, load_checkpoint, prepare_output_dir, save_checkpoint, save_final_models
from .common.divergence import DivergenceDetector, DivergenceError
from .common.metrics import MetricAccumulator, reduce_across_ranks
from .common.tracking import RunTracker, keep_rows_up_to
from .evaluation import decode_responses, evaluate_generation
from .experience import (
    experience_from_rollout,
    in_chunks,
    merge_rows,
    response_logprobs,
    response_values,
    reward_model_scores,
)
from .models.causal_lm import answer_nll
from .grad_sync import prepare_step, squared_grad_norm
from .models.pipeline import pipeline_group
from .models.tensor_parallel import model_parallel_group
from .offload import OffloadPlan, parse_offload_level
from .pipeline_passes import PipelinePasses
from .optim import build_optimizer, build_scheduler
from .prompt_sampler import PromptSampler
from .rollout import RolloutEngine, SamplingParams

logger = logging.getLogger("ppo")
K3_NAMES = ("k3", "low_var_kl")


class NonFiniteError(RuntimeError):
    """Too many consecutive updates with a NaN/Inf loss or gradient."""


def first_non_finite(named_tensors):
    """Name of the first tensor holding NaN/Inf, or None."""
    for name, t in named_tensors:
        if t is not None and not bool(paddle.isfinite(t).all()):
            return name
    return None


class PPOTrainer:
    pipes = None
    """`PipelinePasses` under pipeline_parallel_degree > 1: every model pass goes through it."""

    def __init__(
        self, args, models, tokenizer, train_dataset, eval_dataset=None, ptx_dataset=None, reward_client=None, eval_long_answer_len=5,
        rule_scorer=None,
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

        self.max_steps = total = args.total_steps(len(train_dataset), self.data_world)
        self.actor_scheduler = build_scheduler(
            args.lr_scheduler_type, args.learning_rate, args.min_learning_rate, args.warmup_ratio, args.warmup_steps, total
        )
        self.actor_optimizer = build_optimizer(
            models.actor, self.actor_scheduler, args.weight_decay, args.max_grad_norm, args.adam_beta1, args.adam_beta2, args.adam_epsilon,
            fused=args.use_fused_adamw,
        )
        self.critic_scheduler = self.critic_optimizer = None
        if models.critic is not None:
            self.critic_scheduler = build_scheduler(
                args.critic_lr_scheduler_type, args.critic_learning_rate, args.critic_min_learning_rate, args.critic_warmup_ratio, 0, total
            )
            self.critic_optimizer = build_optimizer(
                models.critic, self.critic_scheduler, args.critic_weight_decay, args.critic_max_grad_norm,
                args.adam_beta1, args.adam_beta2, args.adam_epsilon, fused=args.use_fused_adamw,
            )
        self.actor, self.actor_optimizer = self._wrap(models.actor, self.actor_optimizer)
        self.critic, self.critic_optimizer = self._wrap(models.critic, self.critic_optimizer)
        self.pipes = PipelinePasses(self) if args.pipeline_parallel_degree > 1 else None

        generation_model = self.models.actor if self.pipes is None else self.pipes.generation_copy
        self.engine = RolloutEngine(
            generation_model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            use_fusemt=args.use_fusemt, eval_mode=args.eval_mode,
        )
        self.sampling = SamplingParams(
            max_new_tokens=args.max_dec_len,
            min_new_tokens=args.min_dec_len,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            repetition_penalty=args.repetition_penalty,
            do_sample=True,
        )
        self.reward_normalizer = RunningMeanStd() if args.normalize_reward else None
        self.sampler = PromptSampler(
            len(train_dataset), args.per_device_prompt_batch_size, self.data_rank, self.data_world, args.seed,
            shuffle=args.dataloader_shuffle,
        )
        self.ptx_sampler = None
        if ptx_dataset is not None and args.ptx_coeff > 0:
            self.ptx_sampler = PromptSampler(len(ptx_dataset), args.per_device_train_batch_size, self.data_rank, self.data_world, args.seed + 1)
        self.collate_prompts = train_dataset.get_collator()
        self.tracker = None
        self.offload = OffloadPlan(
            parse_offload_level(args.offload_level),
            models={"actor": models.actor, "reference": models.reference, "reward": models.reward, "critic": models.critic},
            optimizers={"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer},
        )
        self.offload.offload_all()

    # ------------------------------------------------------------------ set-up helpers
    def init_step_state(self):
        """The state one training step reads and updates besides models and optimisers:
        estimator, KL controller, score parts, divergence watch, gradient norms."""
        args = self.args
        self.estimator = args.estimator  # the registry entry: critic, groups, whitening
        self.kl_controller = AdaptiveKLController(args.kl_coeff, args.target_kl, args.kl_horizon) if args.target_kl else None
        self.score_stats = {}
        self.divergence = DivergenceDetector(args.divergence_factor, args.divergence_window)
        self.grad_norms = {}  # model name -> gradient norm of its last optimiser step (before clipping)
        self.first_forward = None  # the update's first forward, kept from compute_advantages (see update_forward)
        self.diverged = {}  # metric name -> first divergence message of the current step
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

    def _wrap(self, model, optimizer):
        """Data parallel or fleet (sharding / tensor parallel) wrappers; identity on one rank."""
        if model is None or self.world_size == 1:
            return model, optimizer
        from paddle.distributed import fleet

        if self.args.use_hybrid_parallel:
            return fleet.distributed_model(model), fleet.distributed_optimizer(optimizer)
        return paddle.DataParallel(model), optimizer

    def generation_weights(self):
        """Context giving the model the rollout engine and the evaluation generate with: the
        actor, or under pipeline parallelism the engine's copy filled with all the actor's
        stages for the block and released after it."""
        if self.pipes is None:
            return contextlib.nullcontext(self.models.actor)
        return self.pipes.generation_weights()

    def _chunk(self):
        return max(self.args.per_device_eval_batch_size, self.args.per_device_train_batch_size)

    def _models_for_checkpoint(self):
        return {"policy": self.models.actor, "value": self.models.critic}

    # ------------------------------------------------------------------ 1. rollout
    def rollout(self, indices):
        """Generate `rollout_n` responses for each prompt index; returns an `Experience`."""
        n = self.args.rollout_n
        batch = self.collate_prompts([self.train_dataset[i] for i in indices])
        input_ids = paddle.repeat_interleave(batch["input_ids"], n, axis=0)
        prompt_mask = paddle.repeat_interleave(batch["attention_mask"], n, axis=0)
        seed = self.args.seed + 1_000_003 * self.gen_batches + 7919 * self.data_rank  # tensor-parallel ranks sample alike
        with self.offload.scope("actor"), self.generation_weights():
            out = self.engine.generate(input_ids, prompt_mask, self.sampling, seed=seed)
        group_base = (self.gen_batches * self.data_world + self.data_rank) * len(indices)
        self.gen_batches += 1
        exp = experience_from_rollout(batch, out, self.tokenizer.eos_token_id, repeat=n, group_base=group_base)
        if out.logprobs_match_forward and self.args.use_rollout_logprobs:
            exp.old_logprobs = out.response_logprobs * exp.response_mask
        return exp

    # ------------------------------------------------------------------ 2. score
    def score(self, exp):
        """Scores `[N]` from the reward model, server or rule scorers, minus `missing_eos_penalty`,
        plus DAPO's overlong penalty; the parts' means go to `self.score_stats`."""
        self.score_stats = {}
        if self.reward_client is not None or self.rule_scorer is not None:
            if any(label is None for label in exp.label):
                raise ValueError("rule rewards and the reward server need a reference answer (tgt) for every prompt")
            responses = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
            if self.rule_scorer is not None:
                totals = self.rule_scores(exp, responses)
                source = f"the rule scorer {self.rule_scorer.spec}"
            else:
                totals = self.reward_client.score(exp.src, exp.label, responses)
                source = f"the reward server {getattr(self.reward_client, 'url', '')}".rstrip()
            raw = np.asarray(totals, dtype="float64")
            values = np.where(np.abs(raw) <= np.finfo("float32").max, raw, np.inf)  # what a float32 cast would give
            scores = paddle.to_tensor(values, dtype="float32")
        else:
            with paddle.no_grad(), self.offload.scope("reward"):
                if self.pipes is not None:
                    scores = self.pipes.reward_scores(exp)
                else:
                    scores = in_chunks(lambda e: reward_model_scores(self.models.reward, e), exp, self._chunk())
            raw, source = None, "the reward model"
        if not bool(paddle.isfinite(scores).all()):
            bad = np.flatnonzero(~np.isfinite(scores.numpy()))
            example = float(raw[bad[0]]) if raw is not None else float(scores.numpy()[bad[0]])
            raise ValueError(
                f"step {self.step + 1}: {source} gave {len(bad)} of {scores.shape[0]} scores that are not "
                f"finite in float32 (e.g. {example!r} for item {bad[0]}; |x| must stay below 3.4e38); fix the scorer "
                "or scale its rewards"
            )
        if self.args.missing_eos_penalty:
            scores = scores - self.args.missing_eos_penalty * (~exp.ends_with_eos).astype("float32")
        if self.args.enable_overlong_reward_buffer:
            penalty = overlong_penalty(exp.response_mask.sum(axis=-1), self.args.max_dec_len,
                                       self.args.overlong_reward_buffer, self.args.overlong_penalty_factor)
            scores = scores + penalty
            self.score_stats["reward/overlong_penalty"] = penalty.mean()
            self.score_stats["reward/overlong_frac"] = (penalty < 0).astype("float32").mean()
        return scores

    def rule_scores(self, exp, responses):
        """Weighted rule scores in this process; a failing scorer stops the run naming the prompt."""
        from .scorers import ScorerError

        try:
            totals, per_function = self.rule_scorer.score_batch(exp.src, exp.label, responses)
        except ScorerError as err:
            raise ScorerError(f"{err} (prompt {exp.src[err.item]!r}, response {responses[err.item]!r})",
                              err.scorer_name, err.item, err.bad_value) from err
        if len(per_function) > 1:
            self.score_stats.update({f"reward/{name}": float(np.mean(v)) for name, v in per_function.items()})
        return totals

    def scored(self, exp):
        """`exp` with its scores, at stage "scored"."""
        exp.scores = self.score(exp)
        return exp.advance("scored")

    def normalized_scores(self, scores):
        """Scores after the running normaliser, updated with every rank's batch first."""
        if self.reward_normalizer is None:
            return scores
        stats = paddle.to_tensor([scores.shape[0], float(scores.sum()), float((scores**2).sum())], dtype="float64")
        if self.world_size > 1:
            dist.all_reduce(stats)
        copies = self.world_size / self.data_world  # tensor-parallel ranks hold the same batch
        count, total, sq = (stats.numpy() / copies).tolist()
        mean = total / count
        self.reward_normalizer.merge(count, mean, max(sq / count - mean * mean, 0.0))
        return self.reward_normalizer.normalize(scores)

    def sample_with_dynamic_filter(self):
        """Rollout (+ score); with `dynamic_sampling`, zero-variance groups are replaced by
        groups from further batches (at most `max_gen_batches`; all ranks draw together)."""
        if not self.args.dynamic_sampling:  # the arguments allow it only for per-group estimators
            return self.scored(self.rollout(self.sampler.next_indices())), 1
        with self.generation_weights():  # one gathering of the actor's stages for all the draws
            return self._draw_until_groups_vary()

    def _draw_until_groups_vary(self):
        """`sample_with_dynamic_filter`'s draws: (the merged experience, the number of draws)."""
        exp = self.scored(self.rollout(self.sampler.next_indices()))
        want = self.args.per_device_prompt_batch_size
        kept, spare, draws = [], [], 1
        while True:
            groups = self.split_groups(exp)
            for g in groups:
                (kept if float(exp.scores.numpy()[g].std()) > 0 else spare).append((exp, g))
            need = paddle.to_tensor([int(len(kept) < want)], dtype="int64")
            if self.world_size > 1:
                dist.all_reduce(need, op=dist.ReduceOp.MAX)
            if int(need) == 0 or draws >= self.args.max_gen_batches:
                break
            exp = self.scored(self.rollout(self.sampler.next_indices()))
            draws += 1
        chosen = (kept + spare)[:want]
        return merge_rows([e.select(g) for e, g in chosen], self.tokenizer.pad_token_id), draws

    def check_groups(self, exp):
        """Each group is `rollout_n` consecutive rows of one prompt, and no group id is on
        two ranks. Returns the number of groups on this rank."""
        n = self.args.rollout_n
        ids = exp.group_ids.numpy().reshape(-1, n)
        prompts = exp.sequences[:, : exp.prompt_len].numpy().reshape(ids.shape[0], n, -1)
        if not (ids == ids[:, :1]).all() or not (prompts == prompts[:, :1]).all():
            raise RuntimeError(f"step {self.step + 1}: a group is not {n} consecutive rows of one prompt")
        if self.world_size > 1:
            gathered = []
            dist.all_gather(gathered, paddle.to_tensor([self.data_rank, *ids[:, 0].tolist()], dtype="int64"))
            by_data_rank = {}
            for row in (g.numpy() for g in gathered):  # tensor-parallel copies of a data rank must agree
                if by_data_rank.setdefault(int(row[0]), row[1:].tolist()) != row[1:].tolist():
                    raise RuntimeError(f"step {self.step + 1}: tensor-parallel ranks of data rank {row[0]} hold different groups")
            all_ids = np.concatenate([np.asarray(v) for v in by_data_rank.values()])
            if len(np.unique(all_ids)) != len(all_ids):
                raise RuntimeError(f"step {self.step + 1}: a group id appears on more than one rank")
        return ids.shape[0]

    def split_groups(self, exp):
        n = self.args.rollout_n
        return [list(range(s, s + n)) for s in range(0, len(exp), n)]

    # ------------------------------------------------------------------ 3.-4. log-probs, values, rewards, advantages
    def compute_advantages(self, exp):
        """Complete a scored experience in one place: old and reference log-probs, critic
        values, shaped rewards and advantages (stage "scored" -> "complete"); returns stats."""
        args = self.args
        exp.require("scored")
        mask = exp.response_mask

        def logprobs_under(model, name):
            if self.pipes is not None:
                return self.pipes.logprobs(name, exp)
            one_chunk = lambda e: response_logprobs(model, e, args.temperature, args.logprob_chunk_size)[0]  # noqa: E731
            return in_chunks(one_chunk, exp, self._chunk())

        def values():
            if self.pipes is not None:
                return self.pipes.values(exp)
            return in_chunks(lambda e: response_values(self.models.critic, e), exp, self._chunk())

        need_ref = args.kl_coeff != 0 or args.kl_loss_coeff != 0
        reuse = self.first_update_forward_reusable(len(exp))
        with paddle.no_grad():
            if need_ref:  # a LoRA actor with its adapter disabled is the reference: both on the device
                with self.offload.scope("reference", *(() if self.models.reference is not None else ("actor",))):
                    with self.models.reference_mode() as ref:
                        exp.ref_logprobs = logprobs_under(ref, "reference")
            if exp.old_logprobs is None and not reuse:
                with self.offload.scope("actor"):
                    exp.old_logprobs = logprobs_under(self.models.actor, "actor")
            if self.models.critic is not None and not reuse:  # no-grad passes use the unwrapped models
                with self.offload.scope("critic"):
                    exp.values = values()
        if reuse:
            self.first_forward = self.update_forward(exp)
            if exp.old_logprobs is None:  # else the rollout's own log-probs (use_rollout_logprobs)
                exp.old_logprobs = self.first_forward["logprobs"].detach()
            if self.critic is not None:
                exp.values = self.first_forward["values"].detach()
        if not need_ref:
            exp.ref_logprobs = exp.old_logprobs
        with paddle.no_grad():
            scores = self.normalized_scores(exp.scores)
            kl_coeff = self.kl_controller.value if self.kl_controller else args.kl_coeff
            exp.rewards, kl = kl_shaped_rewards(
                scores, exp.old_logprobs, exp.ref_logprobs, mask, kl_coeff, args.clip_range_score, kind=args.kl_estimator,
                clamp=args.kl_clamp if args.kl_estimator in K3_NAMES else None,
            )
            exp.advantages, exp.returns = self.estimator(
                exp.rewards, mask, values=exp.values, group_size=args.rollout_n, gamma=args.gamma,
                gae_lambda=args.gae_lambda, scale_by_std=args.scale_reward_std,
            )
            if args.normalize_advantage:
                exp.advantages = masked_whiten(exp.advantages, mask)
        exp.advance("complete")
        lengths = mask.sum(axis=-1)
        kl_sum = (kl * mask).sum(axis=-1)
        stats = {
            "objective/scores": exp.scores.mean(),
            "objective/kl": kl_sum.mean(),
            "objective/kl_coeff": kl_coeff,
            "objective/non_score_reward": (-kl_coeff * kl_sum).mean(),
            "objective/rlhf_reward": (exp.scores - kl_coeff * kl_sum).mean(),
            "objective/entropy": (-exp.old_logprobs * mask).sum(axis=-1).mean(),
            "val/num_eos_tokens": exp.ends_with_eos.astype("float32").sum(),
            "response_length/mean": lengths.mean(),
            "response_length/max": lengths.max(),
            "response_length/min": lengths.min(),
            "response_length/clip_ratio": ((~exp.ends_with_eos).astype("float32")).mean(),
            **self.score_stats,
        }
        if self.estimator.per_group:
            stats["grpo/frac_reward_zero_std"] = group_zero_std_fraction(exp.scores, args.rollout_n)
            stats["grpo/groups_per_rank"] = float(self.check_groups(exp))
        if args.mask_truncated_completions:  # TRL: truncated responses leave every loss
            exp.response_mask = truncated_completion_mask(mask, exp.ends_with_eos)
            stats["response_length/masked_truncated_frac"] = ((~exp.ends_with_eos).astype("float32")).mean()
        if self.kl_controller is not None:  # one update per step from the rank-averaged KL
            self.kl_controller.update(self.global_count(float(kl_sum.mean())), len(exp) * self.world_size)
        return stats

    # ------------------------------------------------------------------ 5. update
    def first_update_forward_reusable(self, n_rows):
        """True when the update's first optimiser step takes all `n_rows` rows in one
        micro-batch with the rollout-time weights (so its forward is the old-policy pass)."""
        args = self.args
        return (
            bool(args.reuse_first_update_forward) and n_rows <= args.per_device_train_batch_size and not self.offload.enabled
            and self.pipes is None  # the pipeline schedule's forward stays inside the schedule
        )

    def update_forward(self, mb):
        """The training forward of one micro-batch, with gradients: actor log-probs and entropy
        `[N, Tr]`, critic values `[N, Tr]` (None without a critic)."""
        self.actor.train()
        logprobs, entropy = response_logprobs(self.actor, mb, self.args.temperature, self.args.logprob_chunk_size,
                                              with_entropy=True)
        values = None
        if self.critic is not None:
            self.critic.train()
            values = response_values(self.critic, mb)
        return {"logprobs": logprobs, "entropy": entropy, "values": values}

    def take_first_forward(self, rows):
        """The kept first forward (see `first_update_forward_reusable`) gathered to `rows`; None
        when there is none. Handed out once."""
        kept, self.first_forward = self.first_forward, None
        if kept is None:
            return None
        index = paddle.to_tensor(np.asarray(rows, dtype="int64"))
        return {k: (None if v is None else paddle.gather(v, index)) for k, v in kept.items()}

    def minibatch_plan(self, n_rows, epoch):
        """Shuffled row indices split into optimiser steps of `grad_accum` micro-batches."""
        rng = np.random.RandomState(self.args.seed + 10007 * self.step + 101 * epoch + self.data_rank)
        perm = rng.permutation(n_rows)
        micro, accum = self.args.per_device_train_batch_size, self.args.gradient_accumulation_steps
        micro_batches = [perm[s : s + micro].tolist() for s in range(0, n_rows, micro)]
        return [micro_batches[s : s + accum] for s in range(0, len(micro_batches), accum)]

    def global_count(self, value):
        """Sum of `value` over ranks divided by the world size (the per-rank share that makes
        a data-parallel gradient average equal the global token-mean)."""
        t = paddle.to_tensor([float(value)], dtype="float64")
        if self.world_size > 1:
            dist.all_reduce(t)
        return float(t.numpy()[0]) / self.world_size

    def _agg(self, num_tokens, num_seqs):
        """Aggregation keywords shared by every loss term."""
        return dict(loss_agg_mode=self.args.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=self.args.loss_scale)

    def actor_loss(self, mb, num_tokens, num_seqs, forward=None):
        """pg_loss_coeff * policy loss - entropy_coeff * entropy + kl_loss_coeff * KL; `forward`:
        the micro-batch's `update_forward` outputs when already computed."""
        args = self.args
        agg = self._agg(num_tokens, num_seqs)
        if forward is None:
            logprobs, entropy = response_logprobs(self.actor, mb, args.temperature, args.logprob_chunk_size, with_entropy=True)
        else:
            logprobs, entropy = forward["logprobs"], forward["entropy"]
        pg_loss, stats = ppo_policy_loss(
            logprobs, mb.old_logprobs, mb.advantages, mb.response_mask,
            clip_range_ratio=args.clip_range_ratio, clip_range_ratio_low=args.clip_range_ratio_low,
            clip_range_ratio_high=args.clip_range_ratio_high, dual_clip=args.dual_clip,
            importance_sampling_level=args.importance_sampling_level, **agg,
        )
        loss = args.pg_loss_coeff * pg_loss
        if args.entropy_coeff:
            bonus, entropy_stats = entropy_bonus_from_token_entropy(entropy, mb.response_mask, **agg)
            loss = loss - args.entropy_coeff * bonus
            stats.update(entropy_stats)
        if args.kl_loss_coeff:
            kl_term, kl_stats = kl_loss(logprobs, mb.ref_logprobs, mb.response_mask, kind=args.kl_loss_type,
                                        clamp=args.kl_clamp if args.kl_loss_type in K3_NAMES else None, **agg)
            loss = loss + args.kl_loss_coeff * kl_term
            stats.update(kl_stats)
        stats["policy/entropy_avg"] = masked_mean(entropy.detach(), mb.response_mask)
        return loss, stats

    def next_ptx_batch(self):
        """This rank's next supervised batch (`input_ids`, `attention_mask`, `labels`, `[n, T]`)."""
        return self.ptx_dataset.get_collator()([self.ptx_dataset[i] for i in self.ptx_sampler.next_indices()])

    def ptx_loss(self):
        batch = self.next_ptx_batch()
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        loss, _ = answer_nll(self.actor, ids, mask, labels, self.args.logprob_chunk_size)
        return loss

    def critic_loss(self, mb, num_tokens, num_seqs, forward=None):
        values = response_values(self.critic, mb) if forward is None else forward["values"]
        return value_loss(values, mb.values, mb.returns, mb.response_mask, self.args.clip_range_value,
                          **self._agg(num_tokens, num_seqs))

    def optimizer_step(self, optimizer, model, loss_value, name):
        """Step unless the loss or a gradient is non-finite; returns None when stepped, else
        what was non-finite. The norm and the check see the gradients after the optimizer's
        own data-parallel / sharding sync (`grad_sync.prepare_step`), so all ranks agree."""
        where = " (on this or another rank)" if self.world_size > 1 else ""
        bad = None if self.all_ranks_finite(loss_value) else f"loss of the {name}{where}"
        self.grad_norms.pop(name, None)
        prepared = prepare_step(model, optimizer)
        # collective (model-parallel / sharding groups): every rank computes it, even with nothing to count
        total = squared_grad_norm(prepared.params, model_parallel_group(), prepared.sharding_group, pipeline_group())
        if bad is None and not math.isfinite(total):  # one host sync; search names only when needed
            grads = [(f"{name} grad of {p.name}", p.grad) for p in prepared.params]
            bad = first_non_finite(grads) or f"{name} gradient slice on another tensor-parallel or sharding rank"
        elif bad is None and prepared.params:
            self.grad_norms[name] = math.sqrt(total)
        if bad is None:
            prepared.step()
        optimizer.clear_grad(set_to_zero=not self.args.release_gradients)  # release_grads: free, not zero
        return bad

    def all_ranks_finite(self, value):
        """Whether `value` is finite on every rank (one all-reduce when there are several)."""
        finite = math.isfinite(value)
        if self.world_size > 1:
            flag = paddle.to_tensor([0.0 if finite else 1.0], dtype="float32")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            finite = float(flag) == 0.0
        return finite

    def update(self, exp, acc):
        """Train the actor (and critic) on a complete experience, their weights and optimizer
        states on the device for the duration (see `offload_level`)."""
        exp.require("complete")
        with self.offload.scope("actor", "critic", with_optimizer=True):
            self._update_epochs(exp, acc)

    def _update_epochs(self, exp, acc):
        """`update_iters` passes over `exp` in optimiser steps of `grad_accum` micro-batches."""
        args = self.args
        response_mask = exp.response_mask.numpy()  # one host copy for all token counts
        for epoch in range(args.update_iters):
            for plan in self.minibatch_plan(len(exp), epoch):
                rows = [r for mb in plan for r in mb]
                mask = response_mask[rows]
                num_tokens = self.global_count(mask.sum())
                num_seqs = self.global_count((mask.sum(-1) > 0).sum())
                actor_total = critic_total = 0.0
                if self.pipes is not None:  # every micro-batch through the pipeline schedule
                    actor_total, critic_total, micro_stats = self.pipes.backward_step(exp, plan, num_tokens, num_seqs)
                    for stats in micro_stats:
                        acc.add(stats)
                    stats, plan = micro_stats[-1], []
                for mb_rows in plan:
                    mb = exp.select(mb_rows)
                    forward = self.take_first_forward(mb_rows)  # only ever the first micro-batch
                    loss, stats = self.actor_loss(mb, num_tokens, num_seqs, forward)
                    if self.ptx_sampler is not None:
                        ptx = self.ptx_loss()
                        loss = loss + args.ptx_coeff * ptx / len(plan)
                        stats["loss/ptx"] = ptx.detach()
                    loss.backward()
                    actor_total += float(loss)
                    acc.add(stats)
                    if self.critic is not None:
                        vloss, vstats = self.critic_loss(mb, num_tokens, num_seqs, forward)
                        vloss.backward()
                        critic_total += float(vloss)
                        acc.add(vstats)
                bad = self.optimizer_step(self.actor_optimizer, self.actor, actor_total, "actor")
                if self.critic is not None:
                    bad = bad or self.optimizer_step(self.critic_optimizer, self.critic, critic_total, "critic")
                judged = {f"train/{name}_grad_norm": norm for name, norm in self.grad_norms.items()}
                acc.add(judged)
                judged["loss/policy_avg"] = actor_total
                if "policy/approxkl_avg" in stats:  # the last micro-batch's KL(old || current policy)
                    judged["policy/approxkl_avg"] = float(stats["policy/approxkl_avg"])
                if self.critic is not None:
                    judged["loss/value_avg"] = critic_total
                for name, message in self.divergence.check(self.step + 1, judged).items():  # every optimiser step
                    self.diverged.setdefault(name, message)
                self.handle_non_finite(bad, acc)

    def handle_non_finite(self, bad, acc):
        if bad is None:
            self.nan_streak = 0
            acc.add({"train/nan_skipped_updates": 0.0})
            return
        self.nan_streak += 1
        acc.add({"train/nan_skipped_updates": 1.0})
        logger.warning(f"step {self.step + 1}: skipped an update, non-finite {bad}")
        if self.nan_streak > self.args.max_nan_skips:
            raise NonFiniteError(
                f"step {self.step + 1}: {self.nan_streak} consecutive updates had non-finite values "
                f"(last: {bad}); stopping. Lower the learning rate, check the reward scale, or clip scores."
            )

    # ------------------------------------------------------------------ one step
    def train_step(self):
        t_start = time.time()
        self.actor.eval()
        exp, draws = self.sample_with_dynamic_filter()
        t_rollout = time.time()
        stats = self.compute_advantages(exp)
        t_logprob = time.time()
        acc = MetricAccumulator()
        acc.add(stats)
        self.actor.train()
        if self.critic is not None:
            self.critic.train()
        self.update(exp, acc)
        self.actor_scheduler.step()
        if self.critic_scheduler is not None:
            self.critic_scheduler.step()
        t_end = time.time()
        tokens = float(exp.response_mask.sum())
        self.episodes += len(exp) * self.data_world
        local = acc.local_result()
        local.update(
            {
                "timing_s/rollout": t_rollout - t_start,
                "timing_s/logprob": t_logprob - t_rollout,
                "timing_s/update": t_end - t_logprob,
                "timing_s/step": t_end - t_start,
                "perf/tokens_per_s": tokens / max(t_rollout - t_start, 1e-9),
                "perf/episodes_per_s": len(exp) / max(t_end - t_start, 1e-9),
                "rollout/gen_batches": float(draws),
            }
        )
        metrics = reduce_across_ranks(local)
        metrics["lr"] = self.actor_optimizer.get_lr()
        metrics["episode"] = float(self.episodes)
        return metrics, exp

    # ------------------------------------------------------------------ evaluation
    def evaluate(self):
        """Greedy responses to this rank's share of the eval prompts: mean score and, with
        reference answers, exact match; reduced across ranks."""
        if self.eval_dataset is None:
            return {}
        labelled = all(self.eval_dataset[i]["label"] is not None for i in range(len(self.eval_dataset)))
        score_fn = None
        if labelled or (self.reward_client is None and self.rule_scorer is None):
            score_fn = lambda batch, out: self.score(
                experience_from_rollout(batch, out, self.tokenizer.eos_token_id)
            ).numpy().tolist()
        self.actor.eval()
        with self.offload.scope("actor"), self.generation_weights() as model:
            metrics, _ = evaluate_generation(
                model, self.tokenizer, self.eval_dataset,
                batch_size=self.args.per_device_eval_batch_size,
                max_new_tokens=self.args.eval_max_new_tokens or self.args.max_dec_len,
                long_answer_len=self.eval_long_answer_len, engine=self.engine, score_fn=score_fn,
                indices=list(range(self.data_rank, len(self.eval_dataset), self.data_world)),
            )
        metrics.pop("eval/num_samples", None)
        return reduce_across_ranks(metrics)

    # ------------------------------------------------------------------ traces
    def log_samples(self, exp, n=4):
        responses = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
        rows = [
            {"step": self.step, "prompt": exp.prompt_text[i], "response": responses[i], "score": float(exp.scores.numpy()[i]),
             "group_id": int(exp.group_ids.numpy()[i])}
            for i in range(min(n * max(1, self.args.rollout_n), len(exp)))
        ]
        with open(os.path.join(self.args.output_dir, "samples.jsonl"), "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        table = "\n".join(f"  {r['score']:+.3f} | {r['prompt']!r} -> {r['response']!r}" for r in rows[: n])
        logger.info(f"step {self.step} samples (score | prompt -> response):\n{table}")

    def trainer_state(self):
        return {
            "step": self.step,
            "episodes": self.episodes,
            "gen_batches": self.gen_batches,
            "sampler": self.sampler.state_dict(),
            "ptx_sampler": self.ptx_sampler.state_dict() if self.ptx_sampler else None,
            "reward_normalizer": self.reward_normalizer.state_dict() if self.reward_normalizer else None,
            "kl_controller": self.kl_controller.state_dict() if self.kl_controller else None,
            "divergence": self.divergence.state_dict(),
        }

    def save(self):
        keep_optimizers = not self.args.ignore_save_lr_and_optim  # PaddleNLP: smaller checkpoints, fresh AdamW on resume
        save_checkpoint(
            self.args.output_dir, self.step, self._models_for_checkpoint(),
            {"policy": self.actor_optimizer, "value": self.critic_optimizer} if keep_optimizers else {},
            {"policy": self.actor_scheduler, "value": self.critic_scheduler},
            {**self.trainer_state(), "optimizer_states": keep_optimizers}, self.tokenizer, self.args.save_total_limit,
        )

    def maybe_resume(self):
        """Resume from the newest complete checkpoint in `output_dir` that loads (older ones are
        tried when it does not), unless overwrite_output_dir starts afresh (clearing the old run)."""
        fresh = self.args.overwrite_output_dir and not self.args.resume_from_checkpoint
        prepare_output_dir(self.args.output_dir, fresh)
        if fresh:
            return False
        found = [path for _, path in reversed(list_checkpoints(self.args.output_dir))]
        candidates = [self.args.resume_from_checkpoint] if self.args.resume_from_checkpoint else found
        state = None
        for i, path in enumerate(candidates):
            try:
                state = load_checkpoint(
                    path, self._models_for_checkpoint(), {"policy": self.actor_optimizer, "value": self.critic_optimizer},
                    {"policy": self.actor_scheduler, "value": self.critic_scheduler},
                )
                break
            except Exception as err:  # a damaged checkpoint: fall back to the one before it
                if i == len(candidates) - 1:
                    raise
                logger.warning(f"cannot resume from {path} ({type(err).__name__}: {err}); trying {candidates[i + 1]}")
        if state is None:
            return False
        self.step, self.episodes, self.gen_batches = state["step"], state["episodes"], state["gen_batches"]
        self.sampler.set_state_dict(state["sampler"])
        if self.ptx_sampler and state.get("ptx_sampler"):
            self.ptx_sampler.set_state_dict(state["ptx_sampler"])
        if self.reward_normalizer and state.get("reward_normalizer"):
            self.reward_normalizer.set_state_dict(state["reward_normalizer"])
        if self.kl_controller and state.get("kl_controller"):
            self.kl_controller.set_state_dict(state["kl_controller"])
        self.divergence.set_state_dict(state.get("divergence"))
        logger.info(f"resumed from {path} at step {self.step}")
        return True

    # ------------------------------------------------------------------ loop
    def train(self):
        args = self.args
        resumed = self.maybe_resume()
        self.tracker = RunTracker(args.output_dir, args.logging_dir, report_to=args.report_to,
                                  enabled=self.is_main, resume=resumed, run_name=args.run_name)
        if resumed:
            self.tracker.truncate_after(self.step)
        if self.is_main:  # samples of steps after the checkpoint are logged again
            keep_rows_up_to(os.path.join(args.output_dir, "samples.jsonl"), self.step)
        if args.evaluates and self.step == 0 and self.eval_dataset is not None:
            self.tracker.log(self.evaluate(), step=0)
        bar = tqdm(total=self.max_steps, initial=self.step, desc="ppo", disable=not self.is_main or args.disable_tqdm)
        start = time.time()
        while self.step < self.max_steps:
            metrics, exp = self.train_step()
            self.step += 1
            bar.update(1)
            bar.set_postfix(score=f"{metrics['objective/scores']:.3f}", len=f"{metrics['response_length/mean']:.1f}")
            diverged = self.step_divergence(metrics)
            first = args.logging_first_step and self.step == 1
            if self.step % args.logging_steps == 0 or self.step == self.max_steps or diverged or first:
                self.tracker.log(metrics, step=self.step)
            if diverged and args.stop_on_divergence:
                return self.stop_diverged(diverged)
            if self.is_main and args.num_sample_generations and self.step % args.num_sample_generations == 0:
                self.log_samples(exp)
            if args.evaluates and self.eval_dataset is not None and (self.step % args.eval_steps == 0 or self.step == self.max_steps):
                self.tracker.log(self.evaluate(), step=self.step)
            if args.saves_checkpoints and args.save_steps and self.step % args.save_steps == 0 and self.step != self.max_steps:
                self.save()
        bar.close()
        if args.saves_checkpoints:
            self.save()
        else:  # save_strategy no: the final models only, no checkpoint-<step>
            save_final_models(args.output_dir, self._models_for_checkpoint(), self.tokenizer)
        fingerprints = self.actor_fingerprints()
        if len(set(fingerprints)) > 1:
            logger.warning(f"actor weights differ across ranks: {fingerprints}")
        extra = {"diverged": self.divergence_log} if self.divergence_log else {}
        return self.tracker.finish(steps=self.step, train_wall_s=time.time() - start, actor_fingerprints=fingerprints, **extra)

    def step_divergence(self, metrics):
        """This step's divergence messages (KL per step, gradient norms and losses per optimiser
        step), logged as warnings; every rank gets a non-empty list when any rank diverged."""
        self.diverged.update(self.divergence.check(self.step, {"objective/kl": metrics["objective/kl"]}))
        messages, self.diverged = list(self.diverged.values()), {}
        self.divergence_log += messages
        for message in messages:
            logger.warning(f"the run is diverging: {message}")
        if self.world_size > 1:
            flag = paddle.to_tensor([int(bool(messages))], dtype="int64")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if int(flag) and not messages:
                messages = [f"step {self.step}: a metric diverged on another rank"]
        return messages

    def stop_diverged(self, messages):
        """Write `summary.json` naming the divergence and raise DivergenceError; nothing is
        saved, so `output_dir/policy` and the checkpoints keep the last good weights."""
        kept = list_checkpoints(self.args.output_dir)
        where = f"the last good checkpoint is {kept[-1][1]}" if kept else "no checkpoint was saved before it"
        self.tracker.finish(steps=self.step, diverged=self.divergence_log)
        raise DivergenceError(f"stopped: {'; '.join(messages)}; {where} (stop_on_divergence=False lets the run go on)")

    def actor_fingerprints(self):
        """One number per rank summarising the (whole, merged) actor weights; equal on every rank
        when in sync, and between tensor-parallel degrees up to float rounding."""
        params = list(self.models.actor.parameters())
        value = sum(float((p.astype("float64") * (i + 1)).sum()) for i, p in enumerate(params) if not p.is_distributed)
        split = [float((p.astype("float64") * (i + 1)).sum()) for i, p in enumerate(params) if p.is_distributed]
        group = model_parallel_group()
        if split and group is not None:  # tensor-parallel slices add up to the whole weight's number
            t = paddle.to_tensor([sum(split)], dtype="float64")
            dist.all_reduce(t, group=group)
            value += float(t.numpy()[0])
        else:
            value += sum(split)
        if self.pipes is not None:  # each stage holds other layers: the whole model's number is their sum
            value = self.pipes.group_sum(value)
        if self.world_size == 1:
            return [value]
        gathered = []
        dist.all_gather(gathered, paddle.to_tensor([value], dtype="float64"))
        return [float(t.numpy()[0]) for t in gathered]
