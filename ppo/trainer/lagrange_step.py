"""PPO-Lagrangian (Safe RLHF, Dai et al. 2023) inside a PPO step, with a cost model
(`cost_model_name_or_path`): the cost of each response, the cost critic's values, the token
rewards and token costs (the full KL penalty on each), reward and cost advantages from the same
GAE, the multiplier's update from the windowed episode cost, and the combined advantage
`(A_R - lambda * A_C) / (1 + lambda)` the actor trains on; the cost critic's clipped value loss
in the update. The math is `ppo.algos.lagrangian`; every model pass goes through `self.passes`.

As safe-rlhf's `PPOLagTrainer.rl_step`, the multiplier moves first (from the episode costs
including this step's rollouts, once `lambda_update_delay_steps` steps are done) and the
actor's advantage uses the moved value; safe-rlhf steps it once per mini-batch update, here once
per training step. The window holds the costs of every data rank (safe-rlhf: each rank's own,
means averaged), so every rank takes the same step and one copy of the state is checkpointed.
With `normalize_advantage` the reward and cost advantages are whitened separately before they
are combined (safe-rlhf whitens neither: set it false to match)."""
import numpy as np
import paddle
import paddle.distributed as dist

from ..algos import LagrangeMultiplier, combined_advantages, lagrangian_shaped_rewards, value_loss
from ..algos.kl import K3_NAMES


def build_lagrange_multiplier(args):
    """The multiplier of the run's PPO-Lagrangian arguments."""
    return LagrangeMultiplier(args.lambda_init, args.lambda_lr, args.lambda_max, args.lambda_update_delay_steps,
                              args.episode_cost_window_size, args.threshold)


class LagrangeStep:
    """The PPO-Lagrangian parts of `PPOTrainer`. Reads `args`, `passes`, `offload`, `models`,
    `step`, `world_size`, `data_rank`, `data_world` and ExperienceMaking's `advantages_and_returns`;
    keeps `lagrange` (a `LagrangeMultiplier`, None without a cost model) and `lagrange_stats`."""

    def cost_scores(self, exp):
        """Cost-model end scores `[N]`; a non-finite cost stops the run naming the row."""
        with paddle.no_grad(), self.offload.scope("cost"):
            costs = self.passes.cost_scores(exp)
        if not bool(paddle.isfinite(costs).all()):
            bad = np.flatnonzero(~np.isfinite(costs.numpy()))
            raise ValueError(f"step {self.step + 1}: the cost model gave {len(bad)} non-finite costs (e.g. item {bad[0]})")
        return costs

    def fill_cost_values(self, exp):
        """`exp.cost_values` `[N, Tr]` from the cost critic (no gradient)."""
        with paddle.no_grad(), self.offload.scope("cost_critic"):
            exp.cost_values = self.passes.cost_values(exp)

    def all_data_rank_costs(self, costs):
        """This step's costs of every data rank, in data-rank order, as a list of floats
        (tensor-parallel copies of a data rank counted once)."""
        mine = costs.numpy().astype("float64").tolist()
        if self.world_size == 1:
            return mine
        gathered = []
        dist.all_gather(gathered, paddle.to_tensor([float(self.data_rank)] + mine, dtype="float64"))
        by_rank = {int(row[0]): row[1:].tolist() for row in (g.numpy() for g in gathered)}
        return [c for rank in sorted(by_rank) for c in by_rank[rank]]

    def update_multiplier(self, costs):
        """Record this step's episode costs, move the multiplier (after the delay); its metrics."""
        self.lagrange.record(self.all_data_rank_costs(costs))
        episode_cost = self.lagrange.episode_cost()
        self.lagrange.update(self.step, episode_cost)
        return {"lagrange/lambda": self.lagrange.value, "lagrange/episode_cost": episode_cost}

    def shape_lagrangian_rewards_and_advantages(self, exp, kl_coeff):
        """`exp.rewards` / `cost_rewards` (the full KL each, score / cost at the last token),
        `returns` / `cost_returns`, `cost_advantages` and the combined `advantages` `[N, Tr]`,
        after one multiplier update; returns the per-token KL `[N, Tr]`."""
        args, mask = self.args, exp.response_mask
        with paddle.no_grad():
            scores = self.normalized_scores(exp.scores)
            exp.rewards, exp.cost_rewards, kl = lagrangian_shaped_rewards(
                scores, exp.costs, exp.old_logprobs, exp.ref_logprobs, mask, kl_coeff, args.clip_range_score,
                kind=args.kl_estimator, clamp=args.kl_clamp if args.kl_estimator in K3_NAMES else None,
            )
            reward_advantages, exp.returns = self.advantages_and_returns(exp.rewards, exp.values, mask)
            exp.cost_advantages, exp.cost_returns = self.advantages_and_returns(exp.cost_rewards, exp.cost_values, mask)
            self.lagrange_stats = self.update_multiplier(exp.costs)
            exp.advantages = combined_advantages(reward_advantages, exp.cost_advantages, self.lagrange.value)
        return kl

    def lagrangian_metrics(self, exp):
        """`objective/cost` (mean raw cost), `lagrange/lambda` (the value the actor's advantage
        used), `lagrange/episode_cost` (the window's mean it was moved by)."""
        return {"objective/cost": exp.costs.mean(), **self.lagrange_stats}

    def cost_critic_loss(self, mb, num_tokens, num_seqs, forward):
        """The cost critic's clipped value loss on `forward["values"]` `[n, Tr]` against the
        cost returns; stats `loss/cost_value_avg`, `val/cost_clipfrac_avg`."""
        loss, stats = value_loss(forward["values"], mb.cost_values, mb.cost_returns, mb.response_mask,
                                 self.args.clip_range_value, **self._agg(num_tokens, num_seqs))
        return loss, {"loss/cost_value_avg": stats["loss/value_avg"], "val/cost_clipfrac_avg": stats["val/clipfrac_avg"]}
