"""The online loop's evaluation of a multi-turn run (`env_name` with `eval_datasets`).

At each evaluation every eval prompt of this rank's share gets one greedy trajectory (an
environment per record, the record's own fields and environment as in training,
ppo/agents/record_env.py), rated with the run's reward as trained: the reward's scorer plus
`env_reward_weight` times the environment's rewards, or those alone without a scorer
(ppo/trainer/env_reward.py). A scorer that needs reference answers some eval prompt lacks is
left out (the environment's rewards alone then rate it). Metrics (means over the trajectories,
then over the ranks):

- `eval/agent/success`: the share of trajectories whose reward is > 0 (a 0/1 reward: solved);
- `eval/agent/reward_mean` (also `eval/score`), `eval/agent/env_reward_mean`;
- `eval/agent/turns_mean`, `eval/agent/tool_calls_mean`, `eval/agent/tool_errors_mean` (calls
  that failed: malformed, unknown tool, bad arguments, raised, timed out, answer cut),
  `eval/agent/env_error_frac` (episodes the environment ended by raising or timing out),
  `eval/agent/truncated_frac`.
"""
import numpy as np

from ..agents import collate_trajectories, rollout_trajectories
from ..rollout import SamplingParams
from .agent_rollout import experience_from_trajectories
from .evaluator import Evaluator


def agent_eval_metrics(trajectories, rewards, env_sums):
    """The `eval/agent/*` metrics of `trajectories` with their rewards `[N]` and summed
    environment rewards `[N]` (module docstring)."""
    n = max(len(trajectories), 1)
    calls = [c for t in trajectories for c in t.tool_calls]
    rewards = np.asarray(rewards, dtype="float64")
    return {
        "eval/agent/success": float((rewards > 0).mean()) if len(rewards) else 0.0,
        "eval/agent/reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
        "eval/score": float(rewards.mean()) if len(rewards) else 0.0,
        "eval/agent/env_reward_mean": float(np.mean(env_sums)) if len(env_sums) else 0.0,
        "eval/agent/turns_mean": sum(t.num_turns for t in trajectories) / n,
        "eval/agent/tool_calls_mean": len(calls) / n,
        "eval/agent/tool_errors_mean": sum(1 for c in calls if c.get("error")) / n,
        "eval/agent/env_error_frac": sum(1 for t in trajectories if t.stop_reason in ("env_error", "env_timeout")) / n,
        "eval/agent/truncated_frac": sum(1 for t in trajectories if t.truncated) / n,
    }


class AgentEvaluator(Evaluator):
    """`Evaluator` for multi-turn runs (module docstring); `agent`: the run's `AgentSettings`;
    `turn_format`: the prompts' turn format (as the training rollout's)."""

    def __init__(self, *args, agent, turn_format, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent, self.turn_format = agent, turn_format

    def evaluate(self):
        """The `eval/agent/*` metrics, reduced over the ranks; {} without eval prompts."""
        if self.dataset is None:
            return {}
        s = self.settings
        indices = list(range(self.ranks.data_rank, len(self.dataset), self.ranks.data_world))
        params = SamplingParams(max_new_tokens=s.eval_max_new_tokens or s.max_dec_len, min_new_tokens=0,
                                do_sample=False)
        trajectories, rewards, env_sums = [], [], []
        self.actor.eval()
        with self.offload.scope("actor"), self.passes.generation_weights():
            for start in range(0, len(indices), s.per_device_eval_batch_size):
                chunk = [self.dataset[i] for i in indices[start: start + s.per_device_eval_batch_size]]
                batch_trajectories, batch_rewards, batch_env = self.rate(chunk, params)
                trajectories += batch_trajectories
                rewards += batch_rewards
                env_sums += batch_env
        return self.ranks.reduce_metrics(agent_eval_metrics(trajectories, rewards, env_sums))

    def rate(self, items, params):
        """`(trajectories, rewards, summed env rewards)` of one greedy trajectory per item."""
        records = [{**(item.get("extra") or {}), "src": item["src"], "tgt": item["label"]} for item in items]
        result = rollout_trajectories(self.engine, records, self.agent, self.turn_format, params, seed=self.settings.seed)
        trajectories = result.trajectories
        layout = collate_trajectories(trajectories, self.tokenizer.pad_token_id, self.agent.turn_reward_mode)
        weight = float(self.agent.env_reward_weight)
        exp = experience_from_trajectories(trajectories, layout, self.tokenizer.eos_token_id,
                                           np.arange(len(trajectories)), [item["prompt"] for item in items],
                                           self.tokenizer.eos_token, weight)
        env_sums = [float(sum(t.rewards)) for t in trajectories]
        scorer = self.scoring.objectives[0].scorer
        if getattr(scorer, "from_environment", False) or (scorer.needs_labels and any(r["tgt"] is None for r in records)):
            rewards = [weight * e for e in env_sums]  # the environment's rewards are (or stand in for) the reward
        else:
            scores = self.scoring.reward_scores(exp, self.state.step + 1).numpy().tolist()
            rewards = [score + weight * e for score, e in zip(scores, env_sums)]
        return trajectories, rewards, env_sums
