"""Step 1 of an online step with an environment (`env_name`): prompts become trajectories.

`TrajectoryRollout` has `Rollout`'s interface (`generate() -> Experience` at stage "rollout")
and is chosen where the run is built: each prompt, repeated `rollout_n` times, gets its own
environment, and the multi-turn decoder (`rollout_trajectories` of ppo/agents/rollout.py, on the
rollout engine's kernels) writes, pauses the row while its tool runs, feeds the answer onto the
row's cache and writes again. The trajectories are laid out by `collate_trajectories` (the one
layout of ppo/agents/trajectory.py): left-padded prompt columns, then response columns that
hold the policy's turns and the environment's answers. `response_mask` is the policy mask (1 on
the policy's own tokens only), so the log-probs, KL, entropy, values, advantages and every loss
downstream see the policy's tokens only; `attention_mask` is 1 on every real token (the answers
are read). The environment's rewards (`env_rewards`, placed by `turn_reward_mode`) are added
to the reward's token rewards; scorers rate `response_text` (every turn and answer).

`ToolFailureWatch` stops a run whose tools fail (raise, time out, or the environment fails) on
most rows for several steps in a row: the loop saves the last completed step first."""
import numpy as np
import paddle

from ..agents import collate_trajectories, make_environment, rollout_trajectories, turn_format_for
from ..agents.record_env import rollout_record
from ..common.process_exit import RunStopped
from ..experience.stages import Experience
from ..models.causal_lm import position_ids_from_mask

FAILED_CALLS = ("raised", "timeout", "crashed", "bad_result", "env_error")
"""Tool-call errors that are the tool's (or the environment's) failure, not the policy's call."""


class ToolPoolError(RunStopped):
    """The tools failed on most rows for `tool_failure_steps` steps in a row (one message, no
    traceback, from the entry points)."""


def last_failure(trajectories):
    """What the last failed tool call (or environment step) of `trajectories` said: the tool's
    name, its error kind and the message the policy read."""
    for t in reversed(trajectories):
        for call in reversed(t.tool_calls):
            if call.get("error") in FAILED_CALLS:
                who = f"tool {call['name']}" if call.get("name") else "the environment"
                return f"{who}: {call['error']}: {call.get('detail') or 'no detail'}"
        if t.stop_reason == "env_timeout":
            return "the environment: env.step did not return within step_timeout_s"
    return "none recorded"


def trajectory_failed(trajectory):
    """Whether a tool (or the environment) failed in `trajectory`."""
    if trajectory.stop_reason in ("env_error", "env_timeout"):
        return True
    return any(call.get("error") in FAILED_CALLS for call in trajectory.tool_calls)


class ToolFailureWatch:
    """Counts consecutive steps on which more than `max_frac` of the rows had a failed tool;
    `check` raises ToolPoolError at `patience` such steps. Its count goes into checkpoints."""

    def __init__(self, max_frac, patience):
        self.max_frac, self.patience, self.streak = float(max_frac), int(patience), 0

    def check(self, trajectories, step):
        """The failed fraction of `trajectories` (the rollout of training `step`, 1-based)."""
        failed = [t for t in trajectories if trajectory_failed(t)]
        frac = len(failed) / max(len(trajectories), 1)
        self.streak = self.streak + 1 if frac > self.max_frac else 0
        if self.streak >= self.patience:
            raise ToolPoolError(
                f"step {step}: the tools failed on {len(failed)} of {len(trajectories)} rows, more than "
                f"max_tool_failure_frac={self.max_frac:g} for {self.streak} steps in a row (tool_failure_steps="
                f"{self.patience}); last failure: {last_failure(failed)}; check the tools (tool_options, their "
                "timeouts) and run the same command again to resume")
        return frac

    def state_dict(self):
        return {"streak": self.streak}

    def set_state_dict(self, state):
        self.streak = int(state.get("streak", 0))


def rated_text(trajectory, eos_text):
    """What scorers rate of `trajectory`: its `response_text` without the final EOS's text (as
    single-turn responses are decoded without it)."""
    text = trajectory.response_text
    return text[: -len(eos_text)] if eos_text and text.endswith(eos_text) else text


def experience_from_trajectories(trajectories, batch, eos_token_id, group_ids, prompt_text, eos_text="",
                                 env_reward_weight=1.0):
    """An `Experience` (stage "rollout") of `trajectories` and their `TrajectoryBatch`; `group_ids`
    `[N]` and `prompt_text` (N strings) as the prompts were repeated; `eos_text`: the EOS token's
    text, cut off the end of the rated texts; `env_reward_weight`: the environment's rewards are
    weighted by it (ppo/trainer/env_reward.py)."""
    sequences = paddle.to_tensor(batch.sequences, dtype="int64")
    attention_mask = paddle.to_tensor(batch.attention_mask, dtype="int64")
    Tp = batch.sequences.shape[1] - batch.response_mask.shape[1]
    response_ids = batch.sequences[:, Tp:]
    has_policy = batch.response_mask.sum(axis=1) > 0
    last_ids = response_ids[np.arange(len(trajectories)), batch.last_policy_index]
    return Experience(
        prompt_len=Tp,
        sequences=sequences,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        response_ids=paddle.to_tensor(response_ids, dtype="int64"),
        response_mask=paddle.to_tensor(batch.response_mask, dtype="float32"),
        group_ids=paddle.to_tensor(np.asarray(group_ids, dtype="int64")),
        src=[t.record["src"] for t in trajectories],
        label=[t.record.get("tgt") for t in trajectories],
        prompt_text=list(prompt_text),
        ends_with_eos=paddle.to_tensor((last_ids == eos_token_id) & has_policy),
        env_rewards=paddle.to_tensor(batch.rewards * float(env_reward_weight), dtype="float32"),
        response_text=[rated_text(t, eos_text) for t in trajectories],
        turns=[t.as_record() for t in trajectories],
    )


def keep_engine_logprobs(exp, response_logprobs, agent, rollout_is):
    """The engine's log-probs of the policy's tokens (`response_logprobs` `[N, Tr]`, 0 elsewhere)
    become `exp.old_logprobs` with `agent.reuse_trajectory_logprobs` (the multi-turn decoder samples
    without a repetition penalty: they are the forward pass's up to rounding; the old-log-prob
    pass is skipped), else are kept as `exp.rollout_logprobs` for the rollout correction
    (`rollout_is` not "none") or the samples (`agent.sample_token_details`), else dropped: the old
    log-probs then come from the training forward, which does not depend on how the rows were
    scheduled. `agent`: the run's `AgentSettings`."""
    engine_logprobs = paddle.to_tensor(response_logprobs, dtype="float32") * exp.response_mask
    if agent.reuse_trajectory_logprobs:
        exp.old_logprobs = engine_logprobs
    elif rollout_is != "none" or agent.sample_token_details:
        exp.rollout_logprobs = engine_logprobs


def declared_tool_metrics(agent):
    """`tool/<name>/*` at 0 for every tool the environment of `agent` (`AgentSettings`) declares
    (`tools` schemas), so that each step's metrics have the same names on every data rank
    whichever tools were called."""
    env = make_environment(agent.env_name, agent.env_options)
    try:
        names = [t.get("function", t).get("name") for t in getattr(env, "tools", None) or []]
    finally:
        if callable(getattr(env, "close", None)):
            env.close()
    return {f"tool/{name}/{what}": 0.0 for name in names if name for what in ("calls", "errors", "timeouts", "latency_ms")}


class TrajectoryRollout:
    """`Rollout` for multi-turn runs (see the module docstring). `agent`: the run's `AgentSettings`
    (`env_name`, `env_options`, `max_turns`, ...; built once by the run builder); `prompt_format`:
    `(use_chat_template, prompt_template)` of the data; `watch`: a `ToolFailureWatch`; the
    other arguments are `Rollout`'s."""

    def __init__(self, engine, sampling, sampler, dataset, tokenizer, passes, *, offload, state, ranks, settings, agent,
                 prompt_format, watch):
        self.engine, self.sampling, self.sampler, self.dataset = engine, sampling, sampler, dataset
        self.tokenizer, self.passes, self.offload, self.state, self.ranks = tokenizer, passes, offload, state, ranks
        self.settings, self.agent, self.watch = settings, agent, watch
        self.turn_format = turn_format_for(tokenizer, *prompt_format)
        self.collate = dataset.get_collator()
        self.metrics = {}  # the last rollout's agent/* and tool/* counts
        self.tool_zeros = declared_tool_metrics(agent)

    def generate(self):
        """`rollout_n` trajectories from each of the next prompts, as an `Experience` at stage "rollout"."""
        indices = self.sampler.next_indices()
        n, ranks = self.settings.rollout_n, self.ranks
        batch = self.collate([self.dataset[i] for i in indices])
        records = [rollout_record(src, label, extra)  # the record's own fields reach env.reset (ppo/agents/record_env.py)
                   for src, label, extra in zip(batch["src"], batch["label"], batch["extra"]) for _ in range(n)]
        draws = self.state.gen_batches
        seed, rows = self.settings.seed + 1_000_003 * draws, len(records)
        with self.offload.scope("actor"), self.passes.generation_weights():
            result = rollout_trajectories(self.engine, records, self.agent, self.turn_format, self.sampling, seed=seed,
                                          row_offset=ranks.data_rank * rows)
        group_base = (draws * ranks.data_world + ranks.data_rank) * len(indices)
        self.state.gen_batches += 1
        trajectories = result.trajectories
        failed_frac = self.watch.check(trajectories, self.state.step + 1)
        layout = collate_trajectories(trajectories, self.tokenizer.pad_token_id, self.agent.turn_reward_mode)
        exp = experience_from_trajectories(trajectories, layout, self.tokenizer.eos_token_id,
                                           np.repeat(np.arange(len(indices)) + group_base, n),
                                           [p for p in batch["prompt"] for _ in range(n)], self.tokenizer.eos_token,
                                           self.agent.env_reward_weight)
        exp.version = self.state.step
        keep_engine_logprobs(exp, layout.response_logprobs, self.agent, self.settings.rollout_is)
        self.metrics = {**self.tool_zeros, **result.metrics, "agent/tool_failed_frac": failed_frac,
                        "agent/env_reward_mean": float(np.mean([sum(t.rewards) for t in trajectories]))}
        return exp

    def close(self):
        """Nothing to release at the end of the run (as `Rollout.close`)."""
