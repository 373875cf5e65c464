"""The environment's rewards in the reward of a multi-turn run (`env_name`).

How the two combine: each trajectory's environment rewards (what `env.step` returned, and a
stateful tool's end-of-episode reward) are weighted by `env_reward_weight` and placed on the
policy's tokens by `turn_reward_mode` (`Experience.env_rewards [N, Tr]`). With a reward model,
reward server or rule scorer, those token rewards are ADDED to the scorer's (its score at the
last token, after penalties, normaliser and `clip_range_score`), as TRL's GRPOTrainer sums its
reward functions weighted by `reward_weights`. Without one, `EnvironmentScorer` makes the
weighted sum the reward's score (as SkyRL-gym's and OpenRLHF's agent `step` rewards, or verl's
agent loop `reward_score` that stands in for the reward function): it then goes through the
score's penalties, normaliser and clip like any score, and is not added a second time.
"""
import numpy as np

PER_TURN_PROBLEM = ("turn_reward_mode per_turn with the environment as the only reward (no reward_model_name_or_path, "
                    "use_rm_server or use_rule_reward): the environment's total is the score at the last policy token; "
                    "set turn_reward_mode final, or add a scorer whose score the per-turn rewards add to")


class EnvironmentScorer:
    """The reward's scorer when the environment's rewards are the only reward: each
    trajectory's score is the sum of its weighted environment rewards (`exp.env_rewards`
    summed over the response, `[N]` float32)."""

    needs_labels = False
    judge = None
    from_environment = True  # AdvantageStage: these scores already hold the environment's rewards
    source = "the environment's rewards (env_name without a reward model or scorer)"

    def __call__(self, exp):
        if exp.env_rewards is None:
            raise ValueError("the environment's rewards are the reward, but the rollout has none (env_name unset?)")
        scores = exp.env_rewards.sum(axis=-1).astype("float32")
        return scores, np.asarray(scores.numpy(), dtype="float64"), {}


def environment_token_rewards(exp, objective, first):
    """The environment's token rewards `exp.env_rewards` `[N, Tr]` for the run's reward (`first`),
    unless its scorer's scores already are them (`EnvironmentScorer`); None otherwise
    (ppo/trainer/reward_terms.py adds them)."""
    if getattr(exp, "env_rewards", None) is None or not first or getattr(objective.scorer, "from_environment", False):
        return None
    return exp.env_rewards


def env_only_reward(model_args, training_args):
    """Whether the environment's rewards are the run's only reward: `env_name` set and no reward
    model, reward server or rule scorer."""
    return bool(getattr(training_args, "env_name", "")) and not (
        model_args.reward_model_name_or_path or model_args.use_rm_server or model_args.use_rule_reward)


def env_reward_problems(model_args, training_args):
    """What an environment-only reward cannot run with (one message each)."""
    if env_only_reward(model_args, training_args) and training_args.turn_reward_mode == "per_turn":
        return [PER_TURN_PROBLEM]
    return []
