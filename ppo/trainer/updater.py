"""Step 5 of a PPO-family step: the update. `PPOUpdater.learn` runs `update_iters` epochs of
shuffled optimiser steps (`minibatch_plan`) on a complete experience: each step's gradients
come from the passes' `backward_step` with the losses handed in (the actor's objective with
its entropy and KL terms and VAPO's positive-example NLL, each critic's clipped value loss, the
ptx batches), then every trained model takes one optimiser step through the strategy, skipped
when the loss or a gradient is not finite (more than `max_nan_skips` in a row stop the run). The
divergence watch judges every optimiser step's losses and gradient norms. During VAPO's value
pretraining (the first `pretrain_critic_steps` steps) only the critics train: the actor's
weights, optimiser state and learning-rate schedule stay as they are."""
import logging

import numpy as np
import paddle

from ..algos import (LOSS_AGG_MODES, POLICY_LOSSES, PolicyLoss, count_from_fraction, entropy_bonus_from_token_entropy,
                     in_value_pretraining, kl_loss, masked_mean, positive_example_nll, value_loss,
                     value_pretraining_targets)
from ..algos.kl import K3_NAMES
from ..common.plugins import find_entry
from ..passes import UpdateLosses

logger = logging.getLogger("ppo")


class NonFiniteError(RuntimeError):
    """Too many consecutive updates with a NaN/Inf loss or gradient."""


def minibatch_plan(n_rows, micro_rows, accumulation, seed):
    """`n_rows` row indices shuffled with `seed`, cut into micro-batches of `micro_rows` and
    grouped into optimiser steps of `accumulation` micro-batches: a list (steps) of lists
    (micro-batches) of row-index lists."""
    perm = np.random.RandomState(seed).permutation(n_rows)
    micro_batches = [perm[s : s + micro_rows].tolist() for s in range(0, n_rows, micro_rows)]
    return [micro_batches[s : s + accumulation] for s in range(0, len(micro_batches), accumulation)]


class OptimizerSteps:
    """The optimiser steps of the trained models through the strategy, with the non-finite
    watch: `step(models, totals, acc)` steps each `TrainedModel` in order (the first non-finite
    one stops the rest), keeps each one's last gradient norm, and raises NonFiniteError after
    more than `max_nan_skips` skipped updates in a row."""

    def __init__(self, strategy, state, max_nan_skips, release_gradients):
        self.strategy, self.state = strategy, state
        self.max_nan_skips, self.release_gradients = max_nan_skips, release_gradients
        self.grad_norms = {}  # model name -> gradient norm of its last optimiser step (before clipping)
        self.nan_streak = 0

    def step(self, models, totals, acc):
        """One optimiser step of each of `models` (`TrainedModel`s) whose summed loss is `totals[name]`;
        returns the `train/<name>_grad_norm` metrics."""
        bad = None
        for trained in models:
            if bad is None:
                self.grad_norms.pop(trained.name, None)
                bad, norm = self.strategy.optimizer_step(trained.model, trained.optimizer, totals[trained.name],
                                                         trained.name, self.release_gradients)
                if bad is None and norm is not None:
                    self.grad_norms[trained.name] = norm
        judged = {f"train/{name}_grad_norm": norm for name, norm in self.grad_norms.items()}
        acc.add(judged)
        self.count(bad, acc)
        return judged

    def count(self, bad, acc):
        """Count a skipped update (`bad`: what was non-finite, None when the step was taken)."""
        if bad is None:
            self.nan_streak = 0
            acc.add({"train/nan_skipped_updates": 0.0})
            return
        self.nan_streak += 1
        acc.add({"train/nan_skipped_updates": 1.0})
        logger.warning(f"step {self.state.step + 1}: skipped an update, non-finite {bad}")
        if self.nan_streak > self.max_nan_skips:
            raise NonFiniteError(
                f"step {self.state.step + 1}: {self.nan_streak} consecutive updates had non-finite values "
                f"(last: {bad}); stopping. Lower the learning rate, check the reward scale, or clip scores."
            )


class PtxBatches:
    """The supervised (ptx) batches of the update: this rank's `sampler` over `dataset`."""

    def __init__(self, dataset, sampler):
        self.dataset, self.sampler = dataset, sampler
        self.collate = dataset.get_collator()

    def next_batch(self):
        """This rank's next supervised batch (`input_ids`, `attention_mask`, `labels`, `[n, T]`)."""
        return self.collate([self.dataset[i] for i in self.sampler.next_indices()])


class PPOUpdater:
    """The PPO-family learner. `actor`: the actor's `TrainedModel`; `objectives`: the
    `ScoredObjective`s (those with a critic train it); `passes`: the `ModelPasses`; `steps`: the
    `OptimizerSteps`; `ptx`: the ptx data (`PtxBatches`, or None); `divergence`: the run's
    `DivergenceWatch`; `offload`: the `OffloadPlan`; `state`: the `RunState`; `ranks`: the
    run's `Ranks`; `settings`: `UpdateSettings`; `samples`: the `samples.jsonl` rows of an
    experience (`ppo.trainer.report.ResponseSamples`). The actor's policy loss is the registry
    entry `settings.policy_loss` (or `module.path:NAME`) with its own settings
    (`settings.policy_settings`, else read off `settings`)."""

    progress_metrics = {"score": "objective/scores", "kl": "objective/kl", "len": "response_length/mean"}
    """The progress bar's numbers: label -> metric."""

    def __init__(self, actor, objectives, passes, steps, *, ptx, divergence, offload, state, ranks, settings, samples):
        self.actor, self.passes, self.steps, self.ptx, self.divergence = actor, passes, steps, ptx, divergence
        self.critics = [o for o in objectives if o.critic is not None]
        self.offload, self.state, self.ranks, self.settings, self.sample_rows = offload, state, ranks, settings, samples
        self.policy_loss = find_entry(settings.policy_loss, POLICY_LOSSES, PolicyLoss, "policy_loss")
        given = settings.policy_settings
        self.policy_settings = dict(given) if given is not None else self.policy_loss.settings_from(settings)

    @property
    def trained(self):
        """The `TrainedModel`s of this step's update: the actor (unless the critics are being
        pretrained, `pretrain_critic_steps`), then each objective's critic."""
        critics = [o.critic for o in self.critics]
        return critics if self.pretraining_critics else [self.actor] + critics

    @property
    def pretraining_critics(self):
        """Whether the coming step is one of VAPO's value-pretraining steps (critics only)."""
        return in_value_pretraining(self.state.step, self.settings.pretrain_critic_steps)

    def learn(self, exp, acc, clock):
        """Train on a complete experience (the models and optimiser states on the device for the
        duration, see `offload_level`), then step the schedulers; metrics go to `acc`."""
        exp.require("complete")
        if self.settings.pretrain_critic_steps:
            acc.add({"train/critic_pretrain": float(self.pretraining_critics)})
        for trained in self.trained:
            trained.model.train()
        with self.offload.scope(*(t.name for t in self.trained), with_optimizer=True):
            response_mask = exp.response_mask.numpy()  # one host copy for all token counts
            for epoch in range(self.settings.update_iters):
                for plan in self.minibatch_plan(len(exp), epoch):
                    self.update_on_plan(exp, plan, response_mask, acc)
        for trained in self.trained:
            if trained.scheduler is not None:
                trained.scheduler.step()
        clock.lap("update")

    def lr(self):
        return self.actor.optimizer.get_lr()

    def minibatch_plan(self, n_rows, epoch):
        """This step's and `epoch`'s shuffled optimiser steps of `update_accumulation_steps`
        micro-batches of `update_micro_rows` rows (see `minibatch_plan`; PaddleNLP's
        `global_mini_batch_size` sets both)."""
        s = self.settings
        seed = s.seed + 10007 * self.state.step + 101 * epoch + self.ranks.data_rank
        return minibatch_plan(n_rows, s.update_micro_rows, s.update_accumulation_steps, seed)

    def update_on_plan(self, exp, plan, response_mask, acc):
        """One optimiser step of every trained model over `plan`'s micro-batches of `exp`:
        gradients from the passes, the steps, the divergence watch and the non-finite check. The
        first step takes the experience's first forward (`Experience.first_forward`) off it."""
        first_forward, exp.first_forward = exp.first_forward, None  # the first step's only: the weights change after it
        mask = response_mask[[r for mb in plan for r in mb]]
        world = self.ranks.world_size
        num_tokens = self.ranks.sum([mask.sum()])[0] / world  # the per-rank share of the global counts
        num_seqs = self.ranks.sum([(mask.sum(-1) > 0).sum()])[0] / world
        positive_tokens = self.positive_token_count(exp, plan, mask)
        losses = self.losses(num_tokens, num_seqs, positive_tokens, self.kept_token_count(plan, response_mask))
        actor_total, value_totals, micro_stats = self.passes.backward_step(exp, plan, losses, first_forward)
        if positive_tokens is not None:  # the step's token mean: the sum of its micro-batches' parts
            acc.add({"loss/positive_lm": sum(float(st.pop("loss/positive_lm_part")) for st in micro_stats)})
        for stats in micro_stats:
            acc.add(stats)
        totals = {self.actor.name: actor_total, **{o.critic.name: value_totals[o.name] for o in self.critics}}
        judged = dict(self.steps.step(self.trained, totals, acc))
        if losses.actor is not None:
            judged["loss/policy_avg"] = actor_total
        if "policy/approxkl_avg" in micro_stats[-1]:  # the last micro-batch's KL(old || current policy)
            judged["policy/approxkl_avg"] = float(micro_stats[-1]["policy/approxkl_avg"])
        for objective in self.critics:
            judged[objective.value_loss_metric] = value_totals[objective.name]
        self.divergence.judge_update(self.state.step + 1, judged)  # every optimiser step

    def positive_token_count(self, exp, plan, mask):
        """With `positive_example_lm_coeff`: the per-rank share of the global count of the response
        tokens of the plan's rows scored at least `positive_example_min_score`; else None.
        `mask`: the plan's rows of the response mask (numpy, `[n, Tr]`)."""
        s = self.settings
        if not s.positive_example_lm_coeff or self.pretraining_critics:
            return None
        positive = exp.scores.numpy()[[r for mb in plan for r in mb]] >= s.positive_example_min_score
        return self.ranks.sum([mask[positive].sum()])[0] / self.ranks.world_size

    def kept_token_count(self, plan, response_mask):
        """With `top_entropy_frac` < 1 and `top_entropy_norm` kept: the per-rank share of the
        global count of the tokens the entropy selection keeps over `plan`'s micro-batches (a
        micro-batch of N response tokens keeps `count_from_fraction(N, top_entropy_frac,
        round_up=True)` of them whatever their entropies), the policy loss's token normaliser;
        else None. `response_mask`: the experience's (numpy, `[rows, Tr]`)."""
        s = self.settings
        if s.top_entropy_frac >= 1.0 or s.top_entropy_norm != "kept":
            return None
        kept = sum(float(count_from_fraction(paddle.to_tensor(response_mask[mb]), s.top_entropy_frac, round_up=True))
                   for mb in plan)
        return self.ranks.sum([kept])[0] / self.ranks.world_size

    def losses(self, num_tokens, num_seqs, positive_tokens=None, kept_tokens=None):
        """The losses of one optimiser step for `ModelPasses.backward_step`, normalised by the
        step's global `num_tokens` / `num_seqs` (`positive_tokens`: the positive-example NLL's
        count, None without it; `kept_tokens`: the policy loss's with `top_entropy_norm` kept);
        no actor loss while the critics are pretrained."""
        critics = {o.name: (lambda mb, forward, o=o: self.critic_loss(o, mb, forward, num_tokens, num_seqs))
                   for o in self.critics}
        extra = {} if positive_tokens is None else {"positive_tokens": positive_tokens}
        if kept_tokens is not None:
            extra["kept_tokens"] = kept_tokens
        actor = None if self.pretraining_critics else (
            lambda mb, forward: self.actor_loss(mb, forward, num_tokens, num_seqs, **extra))
        return UpdateLosses(
            actor=actor, critics=critics, next_ptx_batch=self.ptx.next_batch if self.ptx is not None else None,
            ptx_coeff=self.settings.ptx_coeff,
        )

    def aggregation(self, num_tokens, num_seqs):
        """Aggregation keywords of the value, entropy and KL terms: `loss_agg_mode`, token-mean
        when it is not set (the policy loss then takes its paper's, `PolicyLoss.aggregation`)."""
        s = self.settings
        mode = s.loss_agg_mode if s.loss_agg_mode is not None else LOSS_AGG_MODES[0]
        return dict(loss_agg_mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, loss_scale_factor=s.loss_scale)

    def actor_loss(self, mb, forward, num_tokens, num_seqs, positive_tokens=None, kept_tokens=None):
        """pg_loss_coeff * policy loss - entropy_coeff * entropy + kl_loss_coeff * KL (+ VAPO's
        positive_example_lm_coeff * positive-example NLL over `positive_tokens`) and its stats;
        `forward`: the micro-batch's training forward (`{"logprobs", "entropy"}`, `[n, Tr]`). The
        policy loss's tokens are weighted by the rollout correction's `mb.rollout_is_weights`
        (None: none) and, with `top_entropy_frac` < 1, kept by their entropy; with
        `top_entropy_norm` kept its token normaliser is `kept_tokens` (None: the micro-batch's)."""
        s, agg = self.settings, self.aggregation(num_tokens, num_seqs)
        logprobs, entropy = forward["logprobs"], forward["entropy"]
        selection = {}
        if s.top_entropy_frac < 1.0:
            selection = dict(entropy=entropy.detach(), top_entropy_frac=s.top_entropy_frac, top_entropy_norm=s.top_entropy_norm)
        policy_agg = {**agg, "loss_agg_mode": s.loss_agg_mode}  # None: the policy loss's paper's
        if s.top_entropy_frac < 1.0 and s.top_entropy_norm == "kept":
            policy_agg["num_tokens"] = kept_tokens
        pg_loss, stats = self.policy_loss(logprobs, mb.old_logprobs, mb.advantages, mb.response_mask,
                                          rollout_is_weights=mb.rollout_is_weights, **selection, **self.policy_settings,
                                          **policy_agg)
        loss = s.pg_loss_coeff * pg_loss
        if s.entropy_coeff:
            bonus, entropy_stats = entropy_bonus_from_token_entropy(entropy, mb.response_mask, **agg)
            loss = loss - s.entropy_coeff * bonus
            stats.update(entropy_stats)
        if s.kl_loss_coeff:
            kl_term, kl_stats = kl_loss(logprobs, mb.ref_logprobs, mb.response_mask, kind=s.kl_loss_type,
                                        clamp=s.kl_clamp if s.kl_loss_type in K3_NAMES else None, **agg)
            loss = loss + s.kl_loss_coeff * kl_term
            stats.update(kl_stats)
        if positive_tokens is not None:
            nll = positive_example_nll(logprobs, mb.response_mask, mb.scores >= s.positive_example_min_score, positive_tokens)
            loss = loss + s.positive_example_lm_coeff * nll
            stats["loss/positive_lm_part"] = nll.detach()
        stats["policy/entropy_avg"] = masked_mean(entropy.detach(), mb.response_mask)
        return loss, stats

    def critic_loss(self, objective, mb, forward, num_tokens, num_seqs):
        """The clipped value loss of `objective`'s critic on `forward["values"]` `[n, Tr]` and
        its stats under the objective's names; the targets are the experience's returns, or
        during value pretraining the lambda = 1 returns of its token rewards."""
        trace = mb.objectives[objective.name]
        returns = trace.returns
        if self.pretraining_critics:  # VAPO's value pretraining: the Monte-Carlo returns (GAE lambda 1)
            returns = value_pretraining_targets(trace.rewards, mb.response_mask, self.settings.gamma)
        loss, stats = value_loss(forward["values"], trace.values, returns, mb.response_mask,
                                 self.settings.clip_range_value, **self.aggregation(num_tokens, num_seqs))
        return loss, objective.critic_stats(stats)
