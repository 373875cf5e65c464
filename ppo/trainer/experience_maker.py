"""Steps 1-4 of an online step: the experience a learner trains on.

`ExperienceMaker.make` draws a rollout (`ppo.trainer.rollout.Rollout`), scores it for every
objective (`ppo.trainer.scoring.Scoring`), with DAPO's dynamic sampling replaces groups whose
scores do not vary by groups of further draws (all ranks draw together), with `balance_batch`
reorders the groups over the data ranks for even token counts, and, for the PPO family,
completes it in one place (`ppo.trainer.advantages.AdvantageStage`: log-probs, values, rewards,
advantages). Online DPO's maker stops at the scored experience: its learner makes the pairs.
The stages an experience passes are marked on it (`Experience.stage`)."""
from ..experience.stages import merge_rows
from .balance import balance_rows
from .groups import split_groups


class ExperienceMaker:
    """`rollout`: a `Rollout`; `scoring`: a `Scoring`; `completion`: an `AdvantageStage`, or None
    to hand on scored experiences; `actor`: the trained actor (in eval mode while experience is
    made); `state`: the `RunState`; `ranks`: the run's `Ranks`; `settings`: `RolloutSettings`;
    `pad_token_id`: the padding of merged draws."""

    def __init__(self, rollout, scoring, completion, actor, state, ranks, *, settings, pad_token_id):
        self.rollout, self.scoring, self.completion, self.actor = rollout, scoring, completion, actor
        self.state, self.ranks, self.settings, self.pad_token_id = state, ranks, settings, pad_token_id

    def make(self, clock):
        """`(experience, metrics)`: complete for the PPO family, scored otherwise. `clock` (a
        `StepClock`) times the rollout ("rollout") and the completion ("logprob")."""
        self.actor.eval()
        exp, draws = self.sample()  # 1.-2. rollout and scores (groups that vary)
        exp, stats = self.balanced(exp)  # balance_batch: even token counts over data ranks
        stats["rollout/gen_batches"] = float(draws)
        stats.update(self.rollout.metrics)  # a multi-turn rollout's agent/* and tool/* counts
        clock.lap("rollout", tokens=float(exp.response_mask.sum()))
        if self.completion is not None:  # 3.-4. log-probs, values, shaped rewards, advantages
            stats.update(self.completion.complete(exp, self.scoring.stats))
            clock.lap("logprob")
        return exp, stats

    def close(self):
        """The run is over: the rollout releases what it holds (`Rollout.close`)."""
        self.rollout.close()

    def check_peer(self):
        """A split run's trainer, stopping on a signal: is its rollout rank still there
        (`RemoteRollout.check_peer` raises `RolloutRankLost` when not)? Other rollouts: nothing to check."""
        check = getattr(self.rollout, "check_peer", None)
        if check is not None:
            check()

    def scored_rollout(self):
        """One draw of the rollout, scored (stage "scored")."""
        return self.scoring.score(self.rollout.generate(), self.state.step + 1)

    def sample(self):
        """`(scored experience, draws)`: with `dynamic_sampling`, zero-variance groups are replaced
        by groups from further draws (at most `max_gen_batches`)."""
        if not self.settings.dynamic_sampling:  # the arguments allow it only for per-group estimators
            return self.scored_rollout(), 1
        with self.rollout.passes.generation_weights():  # one gathering of the actor's stages for all the draws
            return self.draw_until_groups_vary()

    def draw_until_groups_vary(self):
        """`sample`'s draws under dynamic sampling: (the merged experience, the number of draws)."""
        exp = self.scored_rollout()
        want = self.settings.per_device_prompt_batch_size
        kept, spare, draws = [], [], 1
        while True:
            for g in split_groups(len(exp), self.settings.rollout_n):
                (kept if float(exp.scores.numpy()[g].std()) > 0 else spare).append((exp, g))
            if not self.ranks.any(len(kept) < want) or draws >= self.settings.max_gen_batches:
                break
            exp = self.scored_rollout()
            draws += 1
        chosen = (kept + spare)[:want]
        return merge_rows([e.select(g) for e, g in chosen], self.pad_token_id), draws

    def balanced(self, exp):
        """With `balance_batch` and several data ranks, `exp`'s groups reordered over the ranks
        for even token counts (`ppo.trainer.balance`) and its stats; else `exp` and `{}`."""
        if not self.settings.balance_batch or self.ranks.data_world == 1:
            return exp, {}
        return balance_rows(exp, self.ranks, self.settings.rollout_n, self.pad_token_id)
