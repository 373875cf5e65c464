"""The four models of PPO: actor, reference, reward (or a reward server) and critic.

- actor: from the SFT model; with `use_lora`, a fresh LoRA adapter on it (an SFT adapter
  is merged into its base in memory first, as TRL does with a PEFT model); without
  `use_lora`, an SFT adapter keeps training (its base with the adapter off is the reference);
- reference: a frozen copy, or, with a LoRA actor, the actor itself with the
  adapter disabled (one copy of the base weights in memory);
- reward: a frozen score model, absent when a reward server scores; a score-model adapter
  (rm/run_reward.py with `use_lora`) is merged into its base in memory;
- critic: a score model (`score_type="critic"`) from `reward_critic_model_name_or_path`
  or the reward model; absent for critic-free estimators (GRPO, RLOO, REINFORCE++).
  From full weights it trains all of them (weights, gradients and two AdamW moments: about
  4x the weights' bytes); from a score-model adapter it trains its own LoRA adapter and
  score head on the merged reward weights (one frozen copy of the weights plus the adapter's
  small state).
- cost and cost critic (PPO-Lagrangian, with `cost_model_name_or_path`): a frozen score model
  whose end score is the response's cost, and a critic of the costs from
  `cost_critic_model_name_or_path` or the cost model, built as the reward critic is.
Dropout is off in all of them. Adapter chains are described in `ppo.models.adapters`.
"""
import contextlib
from dataclasses import dataclass
from typing import Any, Optional

from .adapters import load_merged_causal_lm, load_merged_score_model, score_lora_settings
from .loading import apply_lora, freeze, is_lora_dir, load_causal_lm, load_reference, lora_disabled, set_dropout_off


@dataclass
class PPOModels:
    actor: Any
    reference: Optional[Any]  # None: the LoRA actor with its adapter disabled
    reward: Optional[Any]  # None: scores come from a reward server
    critic: Optional[Any]  # None: critic-free estimator
    cost: Optional[Any] = None  # PPO-Lagrangian's frozen cost model; None: plain PPO
    cost_critic: Optional[Any] = None  # the critic of the costs (with `cost`)

    @contextlib.contextmanager
    def reference_mode(self):
        """Yield the model that computes reference log-probs (disables the actor's LoRA if shared)."""
        if self.reference is not None:
            yield self.reference
            return
        with lora_disabled(self.actor) as base:
            yield base

    def score_models(self):
        """`{objective: frozen score model}` of the scored objectives a model scores: "reward"
        (absent when a reward server or rule scorers score) and "cost" (PPO-Lagrangian)."""
        return {name: model for name, model in (("reward", self.reward), ("cost", self.cost)) if model is not None}

    def critic_models(self):
        """`{objective: critic}` of the objectives with a critic: "reward" (GAE), "cost"."""
        return {name: model for name, model in (("reward", self.critic), ("cost", self.cost_critic)) if model is not None}


def build_ppo_models(model_args, use_critic, dtype="float32", **extra):
    """Load the four models from `ModelArgument` paths (see module docstring);
    `extra` are config overrides (see `loading.load_overrides`). A pipeline run loads this
    rank's stages of each instead (its strategy's `load_models`,
    `ppo.strategy.pipeline.models.build_ppo_pipes`)."""
    actor_path = model_args.actor_model_name_or_path
    actor = load_actor(model_args, dtype, **extra)

    reference = load_reference(actor, actor_path, model_args.reference_model_name_or_path, dtype, **extra)

    reward = None  # the model paths were checked at start (ppo.entry.ppo_argument_checks.model_path_problems)
    if model_args.reward_model_name_or_path and not (model_args.use_rm_server or model_args.use_rule_reward):
        reward = freeze(set_dropout_off(load_merged_score_model(model_args.reward_model_name_or_path, dtype=dtype, **extra)))

    critic = None
    if use_critic:
        critic = build_critic(model_args, dtype, **extra)
    cost = cost_critic = None
    if model_args.cost_model_name_or_path:  # PPO-Lagrangian (the arguments require a critic then)
        cost_path = model_args.cost_model_name_or_path
        cost = freeze(set_dropout_off(load_merged_score_model(cost_path, dtype=dtype, **extra)))
        cost_critic = build_critic(model_args, dtype, critic_path=model_args.cost_critic_model_name_or_path or cost_path, **extra)
    return PPOModels(actor=actor, reference=reference, reward=reward, critic=critic, cost=cost, cost_critic=cost_critic)


def load_actor(model_args, dtype="float32", **extra):
    """The actor as `build_ppo_models` loads it (a LoRA adapter on its merged base with
    `use_lora`), dropout off; a split run's rollout rank loads it alone."""
    actor_path = model_args.actor_model_name_or_path
    if model_args.use_lora:
        actor = load_merged_causal_lm(actor_path, dtype=dtype, **extra)
        actor = apply_lora(actor, base_model_name_or_path=actor_path, **model_args.lora_settings())
    else:
        actor = load_causal_lm(actor_path, dtype=dtype, **extra)
    return set_dropout_off(actor)


def build_critic(model_args, dtype="float32", critic_path=None, **extra):
    """A critic from `critic_path`, by default `reward_critic_model_name_or_path` or the reward
    model: full weights train as they are; a score-model adapter is merged into its base and gets
    a fresh LoRA adapter of `lora_settings()` with a trainable score head (see module docstring)."""
    critic_path = critic_path or model_args.reward_critic_model_name_or_path or model_args.reward_model_name_or_path
    if not critic_path:
        raise ValueError("the gae estimator needs a critic: set reward_critic_model_name_or_path or reward_model_name_or_path")
    critic = load_merged_score_model(
        critic_path, dtype=dtype, score_type="critic", do_normalize=False, normalizer_type=None, **extra
    )
    if is_lora_dir(critic_path):
        critic = apply_lora(
            critic, base_model_name_or_path=critic_path, **score_lora_settings(model_args.lora_settings())
        )
    return set_dropout_off(critic)
