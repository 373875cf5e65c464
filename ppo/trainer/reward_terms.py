"""What goes onto an objective's token rewards besides its KL, asked of the side that owns it.

`AdvantageStage.shape` never tests for a kind of scorer or reward; it asks:

- the objective's scorer where its (normalised) scores go: `scorer.place(trace, scores)` ->
  `(scores at the last token [N], token rewards [N, Tr] or None)`. Every scorer puts its score at
  the last token (`EndScore`, the default for a scorer without `place`); a process reward
  model with `prm_reduction step` puts every step's score at the step's last token
  (`ProcessRewardModelScorer.place`, ppo/trainer/scoring.py);
- the same scorer for advantages of its own: `scorer.advantages(stage, trace, token_rewards,
  mask)` -> `[N, Tr]` or None (the run's estimator then makes them); the process reward model
  gives DeepSeekMath's process-supervision advantages under a per-group estimator;
- every entry of `TOKEN_REWARD_TERMS` for rewards from elsewhere: `term(exp, objective, first)`
  -> `[N, Tr]` or None, added on the response mask; the environment's rewards of a multi-turn
  run go onto the reward's (`environment_token_rewards`, ppo/trainer/env_reward.py).
"""
from .env_reward import environment_token_rewards


class EndScore:
    """The placement of a scorer without its own: the score at the last token, the run's
    estimator's advantages."""

    @staticmethod
    def place(trace, scores):
        return scores, None

    @staticmethod
    def advantages(stage, trace, token_rewards, mask):
        return None


def placement_of(scorer):
    """`scorer` when it places its own scores (`place` and `advantages`), else `EndScore`."""
    return scorer if callable(getattr(scorer, "place", None)) else EndScore


TOKEN_REWARD_TERMS = [environment_token_rewards]
"""Token rewards from outside an objective's scorer, in the order they are added."""


def register_token_reward_term(term):
    """Add `term(exp, objective, first) -> [N, Tr] or None` to `TOKEN_REWARD_TERMS`; returns it."""
    if term not in TOKEN_REWARD_TERMS:
        TOKEN_REWARD_TERMS.append(term)
    return term


def with_token_reward_terms(rewards, exp, objective, first, mask):
    """`rewards` `[N, Tr]` plus every registered term's token rewards for `objective` (`first`:
    whether it is the run's reward), each on `mask`."""
    for term in TOKEN_REWARD_TERMS:
        extra = term(exp, objective, first)
        if extra is not None:
            rewards = rewards + extra * mask
    return rewards
