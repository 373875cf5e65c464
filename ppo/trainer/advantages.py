"""Steps 3-4 of a PPO-family step: a scored experience becomes complete in one place.

`AdvantageStage.complete` runs the no-gradient passes (reference and old log-probs, every
objective's critic values), shapes each objective's token rewards (the KL per token with the
objective's sign, its normalised score at the last token; a multi-turn environment's rewards
added to the reward's), runs the estimator and the whitening on each, lets the combiner form the
actor's advantage, sets the rollout correction's importance weights (when the engine's log-probs
were kept beside the training forward's), and returns the step's `objective/*`,
`response_length/*`, `rollout/*` (and per-group) metrics. With `reuse_first_update_forward`
the old log-probs and the first critic's values come from the update's first forward, run
here and carried to the updater by the experience (`Experience.first_forward`). Every model pass goes through the passes; every reduction over processes
through the run's `Ranks`."""
import paddle

from ..algos import (
    in_value_pretraining,
    group_zero_std_fraction,
    process_group_advantages,
    rollout_correction,
    kl_shaped_rewards,
    masked_centered_square_sum,
    masked_sum,
    masked_whiten,
    truncated_completion_mask,
    whiten_with_statistics,
)
from ..algos.kl import K3_NAMES
from .groups import check_groups
from .reward_terms import placement_of, with_token_reward_terms


class AdvantageStage:
    """`passes`: the `ModelPasses`; `objectives`: the `ScoredObjective`s; `combiner`: the
    actor's advantage (`PlainCombiner` / `LagrangianCombiner`); `estimator`: the
    `ppo.algos.AdvEstimator` entry and `estimator_settings` its own settings (name -> value);
    `kl_control`: a fixed or adaptive KL controller; `offload`: the `OffloadPlan`;
    `reference_scope`: the offload names the reference pass needs; `ranks`: the run's `Ranks`;
    `state`: the `RunState`; `settings`: `AdvantageSettings`."""

    def __init__(self, passes, objectives, combiner, estimator, *, kl_control, offload, reference_scope, ranks, state, settings,
                 estimator_settings=None):
        self.passes, self.objectives, self.combiner, self.estimator = passes, list(objectives), combiner, estimator
        self.estimator_settings = dict(estimator_settings or {})
        self.kl_control, self.offload, self.reference_scope = kl_control, offload, reference_scope
        self.ranks, self.state, self.settings = ranks, state, settings
        self.combined = {}  # the combiner's metrics of the last step

    def first_update_forward_reusable(self, n_rows):
        """True when the update's first optimiser step takes all `n_rows` rows in one
        micro-batch with the rollout-time weights (so its forward is the old-policy pass), and
        trains the actor (not a value-pretraining step, whose update runs no actor pass)."""
        s = self.settings
        return (bool(s.reuse_first_update_forward) and n_rows <= s.update_micro_rows and not self.offload.enabled
                and self.passes.first_forward_reusable()
                and not in_value_pretraining(self.state.step, s.pretrain_critic_steps))

    def complete(self, exp, score_stats=None):
        """Complete a scored experience (stage "scored" -> "complete"); returns its metrics."""
        exp.require("scored")
        self.fill_model_passes(exp)
        correction = self.correct_rollout(exp)
        kl_coeff = self.kl_control.value
        kl = self.shape(exp, kl_coeff)
        exp.advance("complete")
        kl_sum = (kl * exp.response_mask).sum(axis=-1)
        stats = {**self.experience_stats(exp, kl_sum, kl_coeff), **(score_stats or {}), **self.combined, **correction}
        if self.settings.mask_truncated_completions:  # TRL: truncated responses leave every loss
            exp.response_mask = truncated_completion_mask(exp.response_mask, exp.ends_with_eos)
            stats["response_length/masked_truncated_frac"] = ((~exp.ends_with_eos).astype("float32")).mean()
        if self.kl_control.adapts:  # one update per step from the rank-averaged KL
            mean_kl = self.ranks.sum([float(kl_sum.mean())])[0] / self.ranks.world_size
            self.kl_control.update(mean_kl, len(exp) * self.ranks.world_size)
        return stats

    def fill_model_passes(self, exp):
        """`exp.ref_logprobs` (unless a split run's rollout rank computed them), `old_logprobs`
        (unless the rollout's own) and each critic's values `[N, Tr]`; with a reusable first forward, the old log-probs and the first
        critic's values come from the update's first forward, which `exp.first_forward` carries
        to the updater."""
        s = self.settings
        need_ref = s.kl_coeff != 0 or s.kl_loss_coeff != 0
        reuse = self.first_update_forward_reusable(len(exp))
        critics = [o for o in self.objectives if o.critic is not None]
        with paddle.no_grad():
            if need_ref and exp.ref_logprobs is None:  # a LoRA actor with its adapter disabled is the reference: both on the device
                with self.offload.scope(*self.reference_scope):
                    exp.ref_logprobs = self.passes.logprobs("reference", exp)
            if exp.old_logprobs is None and not reuse:
                with self.offload.scope("actor"):
                    exp.old_logprobs = self.passes.logprobs("actor", exp)
            for i, objective in enumerate(critics):
                if i > 0 or not reuse:  # the first critic's values come with a kept first forward
                    with self.offload.scope(objective.critic.name):
                        exp.objectives[objective.name].values = self.passes.values(objective.name, exp)
        if reuse:  # the experience carries the update's first forward (`Experience.first_forward`)
            exp.first_forward = self.passes.first_forward(exp)
            if exp.old_logprobs is None:  # else the rollout's own log-probs (use_rollout_logprobs)
                exp.old_logprobs = exp.first_forward["logprobs"].detach()
            for objective in critics[:1]:
                exp.objectives[objective.name].values = exp.first_forward["values"].detach()
        if not need_ref:
            exp.ref_logprobs = exp.old_logprobs

    def correct_rollout(self, exp):
        """The rollout/training mismatch of `exp` (the engine's `rollout_logprobs` against the
        training forward's `old_logprobs`): sets `exp.rollout_is_weights` `[N, Tr]` (None with
        `rollout_is` none) and returns the `rollout/*` metrics; nothing when the engine's
        log-probs are the old log-probs."""
        if exp.rollout_logprobs is None:
            return {}
        s = self.settings
        exp.rollout_is_weights, stats = rollout_correction(
            exp.old_logprobs, exp.rollout_logprobs, exp.response_mask, rollout_is=s.rollout_is,
            rollout_is_threshold=s.rollout_is_threshold, rollout_is_lower=s.rollout_is_lower,
            rollout_is_upper=s.rollout_is_upper)
        return stats

    def shape(self, exp, kl_coeff):
        """Each objective's token rewards, advantages and returns `[N, Tr]`, then the actor's
        advantage from the combiner (its metrics kept in `self.combined`); returns the per-token
        KL `[N, Tr]` (the first objective's, the step's KL). Where the scores go, advantages of a
        scorer's own and token rewards from elsewhere (the environment's) are asked of their owners
        (ppo/trainer/reward_terms.py)."""
        s, mask, kl = self.settings, exp.response_mask, None
        clamp = s.kl_clamp if s.kl_estimator in K3_NAMES else None
        with paddle.no_grad():
            for index, objective in enumerate(self.objectives):
                trace, owner = exp.objectives[objective.name], placement_of(objective.scorer)
                scores, token_rewards = owner.place(trace, self.normalized(objective, trace.scores))
                trace.rewards, objective_kl = kl_shaped_rewards(scores, exp.old_logprobs, exp.ref_logprobs, mask,
                                                                objective.kl_weight * float(kl_coeff), s.clip_range_score,
                                                                kind=s.kl_estimator, clamp=clamp)
                kl = objective_kl if kl is None else kl
                trace.rewards = with_token_reward_terms(trace.rewards, exp, objective, index == 0, mask)
                if token_rewards is not None:
                    trace.rewards = trace.rewards + token_rewards * mask
                own = owner.advantages(self, trace, token_rewards, mask)
                if own is not None:
                    trace.advantages = trace.returns = own
                else:
                    trace.advantages, trace.returns = self.advantages_and_returns(trace.rewards, trace.values, mask)
            self.combined = self.combiner.combine(exp, self.state.step)
        return kl

    def normalized(self, objective, scores):
        """`scores` after the objective's running normaliser, updated with every rank's batch first."""
        if objective.normalizer is None:
            return scores
        count, total, sq = self.ranks.sum([scores.shape[0], float(scores.sum()), float((scores**2).sum())],
                                          divisor=self.ranks.copies)  # tensor-parallel ranks hold the same batch
        mean = total / count
        objective.normalizer.merge(count, mean, max(sq / count - mean * mean, 0.0))
        return objective.normalizer.normalize(scores)

    def process_advantages(self, steps, step_mask, mask):
        """DeepSeekMath's process-supervision advantages `[N, Tr]` of a process reward model's
        `steps` (`[N, Tr]`, each step's score at its last token, 1 there in `step_mask`), for a
        per-group estimator: each step's score normalised over its group's steps, summed over the
        steps at or after each token (no KL reward: `kl_coeff` 0, checked at start-up); whitened
        over the data ranks with `normalize_advantage`."""
        ends = paddle.arange(mask.shape[-1], dtype="int64").unsqueeze(0).expand(mask.shape)
        advantages = process_group_advantages(steps, step_mask, ends, mask, self.settings.rollout_n)
        return self.whitened_over_ranks(advantages, mask) if self.settings.normalize_advantage else advantages

    def advantages_and_returns(self, rewards, values, mask):
        """`(advantages, returns)` `[N, Tr]` of token `rewards` (and critic `values`, or None) from
        the run's estimator, whitened over the data ranks with `normalize_advantage`."""
        s = self.settings
        advantages, returns = self.estimator(rewards, mask, values=values, group_size=s.rollout_n, gamma=s.gamma,
                                             gae_lambda=s.gae_lambda, scale_by_std=s.scale_reward_std,
                                             **self.estimator_settings)
        if s.normalize_advantage:
            advantages = self.whitened_over_ranks(advantages, mask)
        return advantages, returns

    def whitened_over_ranks(self, x, mask):
        """`masked_whiten(x, mask)` with the mean and (unbiased) variance of every data rank's
        masked tokens, so that data parallelism whitens as one process would. `[N, Tr]`."""
        if self.ranks.world_size == 1:
            return masked_whiten(x, mask)
        copies = self.ranks.copies  # tensor-/pipeline-parallel ranks hold the same rows
        count, total = self.ranks.sum([mask.astype("float32").sum(), masked_sum(x, mask)], divisor=copies)
        mean = total / max(count, 1e-8)
        (squares,) = self.ranks.sum([masked_centered_square_sum(x, mask, mean)], divisor=copies)
        return whiten_with_statistics(x, mask, mean, squares / max(count - 1.0, 1.0))

    def experience_stats(self, exp, kl_sum, kl_coeff):
        """The step's `objective/*`, `response_length/*` (and `grpo/*` for per-group estimators)
        metrics of a complete experience; `kl_sum` `[N]`: each response's summed KL."""
        mask = exp.response_mask
        lengths = mask.sum(axis=-1)
        stats = {
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
        }
        for objective in self.objectives:
            stats[objective.metric] = exp.objectives[objective.name].scores.mean()
        if self.estimator.per_group:
            stats["grpo/frac_reward_zero_std"] = group_zero_std_fraction(exp.scores, self.settings.rollout_n)
            stats["grpo/groups_per_rank"] = float(check_groups(exp, self.settings.rollout_n, self.ranks, self.state.step + 1))
        return stats
