"""Model roles as data: the run's scored objectives, the models it trains, and the one
combiner that turns the objectives' advantages into the actor's.

A `ScoredObjective` is one thing the responses are scored on (the reward; a cost under
PPO-Lagrangian, Safe RLHF, Dai et al. 2023), with its scorer, its critic (a `TrainedModel`, or
None for critic-free estimators) and the facts the step reads: the sign of the KL term in its
token rewards (`kl_weight`: +1 subtracts the KL from the reward, -1 adds it to the cost, as
safe-rlhf's `add_kl_divergence_regularization`), its running normaliser, its score penalties
and its metric names. The loop iterates over the objectives; nothing branches on their names.

A combiner turns the objectives' advantages into the one the actor trains on: `PlainCombiner`
takes the reward's; `LagrangianCombiner` first moves the Lagrange multiplier from the window of
episode costs (every data rank's, in data-rank order, so every rank takes the same step) and
then forms `(A_R - lambda * A_C) / (1 + lambda)` (`ppo.algos.lagrangian`), as safe-rlhf's
`PPOLagTrainer.rl_step` (there once per mini-batch, here once per training step)."""
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..algos import LagrangeMultiplier, combined_advantages


@dataclass
class TrainedModel:
    """A model the run trains: `name` in metrics and offloading ("actor", "critic",
    "cost_critic"), its `checkpoint` folder ("policy", "value", "cost_value"), the `model` as
    the strategy wrapped it, the unwrapped `inner` one, its `optimizer` and `scheduler`."""

    name: str
    checkpoint: str
    model: Any
    inner: Any
    optimizer: Any
    scheduler: Any


@dataclass
class ScoredObjective:
    """One scored objective of the run (see the module docstring). `metric`: the mean score's
    name; `value_stats` renames the critic loss's stats (None keeps them; names it does not map
    are dropped); `sample_key`: its score's key in `samples.jsonl`."""

    name: str
    scorer: Any
    critic: Optional[TrainedModel] = None
    kl_weight: float = 1.0
    normalizer: Any = None
    penalties: Any = None
    metric: str = "objective/scores"
    value_stats: Optional[Mapping[str, str]] = None
    sample_key: str = "score"

    def critic_stats(self, stats):
        """The critic loss's `stats` under this objective's names."""
        if self.value_stats is None:
            return stats
        return {new: stats[old] for old, new in self.value_stats.items()}

    @property
    def value_loss_metric(self):
        """The name of its critic's value loss (`loss/value_avg` under this objective's names)."""
        return (self.value_stats or {}).get("loss/value_avg", "loss/value_avg")


COST_VALUE_STATS = {"loss/value_avg": "loss/cost_value_avg", "val/clipfrac_avg": "val/cost_clipfrac_avg"}
"""The cost critic's loss stats under their own names."""


class PlainCombiner:
    """The actor trains on the reward's advantages."""

    constrained = False

    def __init__(self, reward="reward"):
        self.reward = reward

    def combine(self, exp, step):
        exp.advantages = exp.objectives[self.reward].advantages
        return {}

    def state_dict(self):
        return None

    def set_state_dict(self, state):
        pass


class LagrangianCombiner:
    """PPO-Lagrangian's advantage (see the module docstring): `multiplier` a
    `LagrangeMultiplier`, `ranks` the run's `Ranks`."""

    constrained = True

    def __init__(self, multiplier, ranks, reward="reward", cost="cost"):
        self.multiplier, self.ranks, self.reward, self.cost = multiplier, ranks, reward, cost

    @classmethod
    def from_args(cls, args, ranks):
        return cls(LagrangeMultiplier(args.lambda_init, args.lambda_lr, args.lambda_max, args.lambda_update_delay_steps,
                                      args.episode_cost_window_size, args.threshold), ranks)

    def all_data_rank_costs(self, costs):
        """This step's costs of every data rank, in data-rank order, as a list of floats
        (tensor-parallel copies of a data rank counted once)."""
        mine = costs.numpy().astype("float64").tolist()
        if self.ranks.world_size == 1:
            return mine
        by_rank = {int(row[0]): row[1:].tolist() for row in self.ranks.gather([float(self.ranks.data_rank)] + mine)}
        return [c for rank in sorted(by_rank) for c in by_rank[rank]]

    def combine(self, exp, step):
        """Record this step's episode costs, move the multiplier (after the delay; `step`: the
        training steps completed), then the actor's advantage; returns the multiplier's metrics."""
        self.multiplier.record(self.all_data_rank_costs(exp.objectives[self.cost].scores))
        episode_cost = self.multiplier.episode_cost()
        self.multiplier.update(step, episode_cost)
        exp.advantages = combined_advantages(exp.objectives[self.reward].advantages, exp.objectives[self.cost].advantages,
                                             self.multiplier.value)
        return {"lagrange/lambda": self.multiplier.value, "lagrange/episode_cost": episode_cost}

    def state_dict(self):
        return self.multiplier.state_dict()

    def set_state_dict(self, state):
        self.multiplier.set_state_dict(state)
