"""Environments written outside the package, driven through ppo/run_ppo.py: the environment's
rewards as the only reward (and summed with a scorer's), per-record data and a per-record
environment reaching `env.reset`, and stateful tools (create, call, reward, release) whose
release runs for every trajectory."""
import json
import os
import textwrap

import numpy as np
import pytest

from ppo.common.argument_problems import UsageError
from ppo.run_ppo import build_trainer, main, start_up
from ppo.trainer.loop import StepClock

USER_ENV = textwrap.dedent('''
    from ppo.agents import Environment

    class LengthEnv(Environment):
        """One turn; reward: the turn's length mod 3 plus the record's bonus (0 when absent)."""
        stop_strings = []
        def __init__(self, scale=1.0):
            self.scale = scale
        def reset(self, record):
            self.record = record
            return record["src"]
        def step(self, action_text):
            return None, self.scale * (len(action_text) % 3) + float(self.record.get("bonus", 0.0)), True, {}

    class StoreEnv(Environment):
        """One turn; reward: the sum of the record's store (per-record data) times `scale`."""
        stop_strings = []
        def __init__(self, scale=1.0):
            self.scale = scale
        def reset(self, record):
            self.store = record["store"]
            return record["src"]
        def step(self, action_text):
            return None, self.scale * sum(self.store.values()), True, {}

''')

USER_TOOLS = textwrap.dedent('''
    import os, time
    from ppo.agents import ToolEnvironment
    from ppo.agents.tool_state import StatefulTool

    class Counter(StatefulTool):
        """Adds to this trajectory's scratch file; reward 1 when its total is the record's target."""
        name, description = "add", "add n to the running total"
        parameters = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        def __init__(self, log):
            self.log = log
        def create(self, record, start=0):
            self.target = record["target"]
            self.path = os.path.join(os.path.dirname(self.log), "scratch-%d" % id(self))
            with open(self.path, "w") as f:
                f.write(str(start))
        def call(self, n):
            with open(self.path) as f:
                total = int(f.read()) + n
            with open(self.path, "w") as f:
                f.write(str(total))
            return str(total)
        def reward(self):
            with open(self.path) as f:
                return float(int(f.read()) == self.target)
        def release(self):
            os.remove(self.path)
            with open(self.log, "a") as f:
                f.write("released\\n")

    class ScriptedCounter(ToolEnvironment):
        """The tool environment with the policy's turns replaced by the record's `actions`."""
        stop_strings = []
        def reset(self, record):
            self.actions, self.turn = list(record["actions"]), 0
            return super().reset(record)
        def step(self, action_text):
            action = self.actions[self.turn] if self.turn < len(self.actions) else "done"
            self.turn += 1
            if action == "hang":  # longer than step_timeout_s: the row ends env_timeout
                time.sleep(3.0)
            return super().step(action)
''')


@pytest.fixture
def user_env(tmp_path, monkeypatch):
    """Modules of environments and tools in tmp_path, importable as `agents2a_user_env:Name` and
    `agents2a_user_tools:Name`."""
    (tmp_path / "agents2a_user_env.py").write_text(USER_ENV)
    (tmp_path / "agents2a_user_tools.py").write_text(USER_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "agents2a_user_env"


def env_argv(model_dir, prompts, out, *extra):
    """GRPO on `prompts` with no reward model, server or rule scorer (the environment's only)."""
    return ["config/tiny/grpo_rule_argument.json", "--actor_model_name_or_path", model_dir,
            "--use_rule_reward", "false", "--rule_reward_scorers", "",
            "--train_datasets", f"Jsonfile:1.0:{prompts}", "--eval_datasets", "",
            "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "1", "--evaluation_strategy", "no",
            "--save_steps", "0", "--num_sample_generations", "1", "--disable_tqdm", "true", "--rollout_n", "2",
            "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-3",
            "--max_turns", "4", "--max_total_len", "110", "--max_dec_len", "5", *extra]


RULE = ["--use_rule_reward", "true", "--rule_reward_scorers", "tests.agent_helpers:text_sum_scorer"]


def write_prompts(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


def made(trainer):
    exp, stats = trainer.experience.make(StepClock())
    return exp, stats, trainer.experience.rollout.metrics


def token_reward_sums(exp):
    return (exp.objectives["reward"].rewards.numpy() * exp.response_mask.numpy()).sum(axis=1)


def test_the_environment_reward_alone_is_the_reward(tiny_model_dir, user_env, tmp_path):
    """env_name with no reward model or scorer starts (it was refused), the scores are the
    environment's rewards times env_reward_weight, counted once in the token rewards; with a
    rule scorer too, the token rewards are the scorer's score plus the weighted env rewards."""
    prompts = write_prompts(tmp_path / "p.jsonl", [{"src": "Reverse: ab12", "tgt": "21ba"},
                                                   {"src": "Reverse: cd3", "tgt": "3dc"}])
    argv = env_argv(tiny_model_dir, prompts, str(tmp_path / "a"), "--env_name", f"{user_env}:LengthEnv",
                    "--env_reward_weight", "2.0")
    trainer = build_trainer(argv)
    exp, stats, metrics = made(trainer)
    env_sums = np.array([sum(t["rewards"]) for t in exp.turns])
    assert len(env_sums) == 4 and env_sums.std() >= 0.0
    np.testing.assert_allclose(exp.scores.numpy(), 2.0 * env_sums, rtol=1e-6)
    np.testing.assert_allclose(token_reward_sums(exp), 2.0 * env_sums, rtol=1e-6)  # kl_coeff 0: once, not twice
    assert float(stats["objective/scores"]) == pytest.approx(2.0 * env_sums.mean(), rel=1e-6)
    assert metrics["agent/env_reward_mean"] == pytest.approx(env_sums.mean(), rel=1e-6)
    argv = env_argv(tiny_model_dir, prompts, str(tmp_path / "b"), "--env_name", f"{user_env}:LengthEnv",
                    "--env_reward_weight", "0.5", "--use_rule_reward", "true", "--rule_reward_scorers",
                    "tests.agent_helpers:text_sum_scorer")
    exp, _, _ = made(build_trainer(argv))
    env_sums = np.array([sum(t["rewards"]) for t in exp.turns])
    np.testing.assert_allclose(token_reward_sums(exp), exp.scores.numpy() + 0.5 * env_sums, rtol=1e-5, atol=1e-6)
    with pytest.raises(UsageError) as err:
        start_up(env_argv(tiny_model_dir, prompts, str(tmp_path / "c"), "--env_name", f"{user_env}:LengthEnv",
                          "--turn_reward_mode", "per_turn"))
    assert "turn_reward_mode per_turn with the environment as the only reward" in str(err.value)
    with pytest.raises(UsageError) as err:
        start_up(env_argv(tiny_model_dir, prompts, str(tmp_path / "d")))
    assert "reward_model_name_or_path is required unless use_rm_server, use_rule_reward or env_name is set" in str(err.value)


def test_records_carry_their_data_and_choose_their_environment(tiny_model_dir, user_env, tmp_path):
    """A record's other fields reach env.reset (a per-record store, read by the environment),
    two records with one prompt and different data are both kept, and a record's own
    env_name / env_kwargs build its environment; a record naming an environment that does not
    exist is refused at start-up, naming the record."""
    prompts = write_prompts(tmp_path / "p.jsonl", [
        {"src": "Reverse: ab", "tgt": "ba", "store": {"a": 1, "b": 2}},
        {"src": "Reverse: ab", "tgt": "ba", "store": {"a": 10, "b": 20}},
        {"src": "Reverse: cd", "tgt": "dc", "bonus": 100.0, "env_name": f"{user_env}:LengthEnv",
         "env_kwargs": {"scale": 0.0}},
    ])
    argv = env_argv(tiny_model_dir, prompts, str(tmp_path / "a"), "--env_name", f"{user_env}:StoreEnv",
                    "--env_kwargs", '{"scale": 2.0}', "--per_device_prompt_batch_size", "3", "--rollout_n", "2",
                    "--per_device_train_batch_size", "6", *RULE)
    trainer = build_trainer(argv)
    assert len(trainer.experience.rollout.dataset) == 3
    exp, _, _ = made(trainer)
    assert sorted(sum(t["rewards"]) for t in exp.turns) == [6.0, 6.0, 60.0, 60.0, 100.0, 100.0]
    bad = write_prompts(tmp_path / "bad.jsonl", [{"src": "Reverse: ab", "tgt": "ba", "store": {"a": 1},
                                                  "env_name": "no_such_env"}])
    with pytest.raises(UsageError) as err:
        start_up(env_argv(tiny_model_dir, bad, str(tmp_path / "b"), "--env_name", f"{user_env}:StoreEnv", *RULE))
    assert "train_datasets record 0: env_name no_such_env: unknown environment 'no_such_env'" in str(err.value)


def test_stateful_tools_live_one_trajectory_and_score_it(tiny_model_dir, user_env, tmp_path):
    """A StatefulTool in the tools environment: created per trajectory with the record's
    tools_kwargs (verl's create_kwargs), called across turns on its own scratch file, its
    reward() the environment's reward (also for a trajectory cut at max_turns), and release()
    run once per trajectory (a trajectory whose step timed out too), every scratch file gone
    after the run."""
    log = tmp_path / "tools" / "release.log"
    log.parent.mkdir()
    call = '<tool_call>{"name": "add", "arguments": {"n": %d}}</tool_call>'
    prompts = write_prompts(tmp_path / "p.jsonl", [
        {"src": "Reverse: ab", "tgt": "ba", "target": 7, "actions": [call % 3, call % 4, "7"],
         "tools_kwargs": {"add": {"create_kwargs": {"start": 0}}}},
        {"src": "Reverse: cd", "tgt": "dc", "target": 7, "actions": [call % 1, call % 1, call % 0, call % 1],
         "extra_info": {"tools_kwargs": {"add": {"create_kwargs": {"start": 5}}}}},
        {"src": "Reverse: ef", "tgt": "fe", "target": 7, "actions": [call % 1, "hang"]},
    ])
    env_kwargs = json.dumps({"tools": ["agents2a_user_tools:Counter"], "tool_options": {"agents2a_user_tools:Counter": {"log": str(log)}}})
    out = str(tmp_path / "run")
    argv = env_argv(tiny_model_dir, prompts, out, "--env_name", "agents2a_user_tools:ScriptedCounter", "--env_kwargs", env_kwargs,
                    "--max_turns", "3", "--step_timeout_s", "0.5", "--per_device_prompt_batch_size", "3",
                    "--per_device_train_batch_size", "6", *RULE)
    summary = main(argv)
    assert summary is not None
    rows = [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]
    # 0+3+4 = 7, and 5+1+1+0 = 7 cut at max_turns: reward 1; the third row's step hangs: env_timeout, reward 0
    assert rows[0]["agent/env_reward_mean"] == pytest.approx(4 / 6)
    assert rows[0]["agent/tool_calls_mean"] == pytest.approx((2 + 2 + 3 + 3 + 1 + 1) / 6)
    # one per trajectory, the timed-out ones too, and one per record for the start-up check that
    # starts each training prompt as the rollout will (ppo/agents/prompt_room.py)
    assert log.read_text().count("released") == 6 + 3
    assert sorted(os.listdir(log.parent)) == ["release.log"]


def test_the_trainer_evaluates_trajectories(tiny_model_dir, user_env, tmp_path):
    """eval_datasets with env_name (refused before): at step 0 and at each evaluation step one
    greedy trajectory per eval record, with success, turns, tool calls and tool errors logged
    as eval/agent/* in metrics.jsonl."""
    call = '<tool_call>{"name": "add", "arguments": {"n": %s}}</tool_call>'
    records = [{"src": "Reverse: ab", "tgt": "ba", "target": 7, "actions": [call % 3, call % 4, "7"]},
               {"src": "Reverse: cd", "tgt": "dc", "target": 7, "actions": [call % 1, call % '"x"', "done"]}]
    prompts = write_prompts(tmp_path / "p.jsonl", records)
    log = tmp_path / "tools" / "release.log"
    log.parent.mkdir()
    env_kwargs = json.dumps({"tools": ["agents2a_user_tools:Counter"],
                             "tool_options": {"agents2a_user_tools:Counter": {"log": str(log)}}})
    out = str(tmp_path / "run")
    argv = env_argv(tiny_model_dir, prompts, out, "--env_name", "agents2a_user_tools:ScriptedCounter",
                    "--env_kwargs", env_kwargs, "--eval_datasets", f"Jsonfile:1.0:{prompts}",
                    "--evaluation_strategy", "steps", "--eval_steps", "1", "--max_turns", "3", "--max_total_len", "128",
                    "--eval_max_new_tokens", "3")
    main(argv)
    evals = [r for r in (json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))) if "eval/agent/success" in r]
    assert [r["step"] for r in evals] == [0, 1]
    for row in evals:
        assert row["eval/agent/success"] == pytest.approx(0.5)  # 3+4 = 7; 1 and a bad call: 1
        assert row["eval/agent/reward_mean"] == pytest.approx(0.5) and row["eval/score"] == pytest.approx(0.5)
        assert row["eval/agent/turns_mean"] == pytest.approx(3.0)
        assert row["eval/agent/tool_calls_mean"] == pytest.approx(2.0)
        assert row["eval/agent/tool_errors_mean"] == pytest.approx(0.5)  # "x" is no integer: bad_arguments
        assert row["eval/agent/env_error_frac"] == 0.0 and row["eval/agent/truncated_frac"] == 0.0
