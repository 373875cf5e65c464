"""The agent rollout's settings slice: `AgentSettings` holds the `AgentArguments` fields (declared
there once), frozen and checked; the rollout refuses anything else (a whole argument object);
the PPO run builder builds one and hands the same object to the rollout and the evaluator."""
import dataclasses

import pytest

from ppo.agents import AgentArguments, AgentSettings, rollout_trajectories
from ppo.run_ppo import build_trainer
from ppo.trainer.agent_eval import AgentEvaluator
from tests.test_agent_training import grpo_agent_argv


def test_settings_are_the_agent_fields_frozen_and_checked():
    assert [f.name for f in dataclasses.fields(AgentSettings)] == [f.name for f in dataclasses.fields(AgentArguments)]
    assert {f.name: f.default for f in dataclasses.fields(AgentSettings)} == \
        {f.name: f.default for f in dataclasses.fields(AgentArguments)}
    args = AgentArguments(env_name="tools", env_kwargs='{"tools": ["calculator"]}', max_turns=2)
    args.kl_coeff = 0.05  # a field of the whole argument object, not the agent's
    settings = AgentSettings.of(args)
    assert settings.max_turns == 2 and settings.env_options == {"tools": ["calculator"]} and settings.multi_turn
    assert not hasattr(settings, "kl_coeff")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_turns = 3
    with pytest.raises(ValueError, match="AgentSettings: max_turns must be >= 1, got 0; env_kwargs must be a JSON object"):
        AgentSettings(max_turns=0, env_kwargs="[1]")


def test_the_rollout_refuses_a_whole_argument_object():
    """Before, the rollout read whatever object it was given (the run passed its whole arguments)."""
    with pytest.raises(TypeError, match="rollout_trajectories takes AgentSettings .* got AgentArguments"):
        rollout_trajectories(None, [{"src": "hi"}], AgentArguments(env_name="tools"), None, None)


def test_the_run_builder_hands_one_settings_slice_to_the_rollout_and_the_evaluator(tiny_model_dir, tiny_data_dir,
                                                                                     tmp_path):
    out = str(tmp_path / "g")
    argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, out, "--eval_datasets",
                           f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl", "--max_turns", "3")
    trainer = build_trainer(argv)
    rollout, evaluator = trainer.experience.rollout, trainer.evaluator
    assert type(rollout.agent) is AgentSettings and rollout.agent.max_turns == 3
    assert rollout.agent.env_name == "tests.agent_helpers:EchoEnv" and rollout.agent.env_options == {"turns": 3}
    assert isinstance(evaluator, AgentEvaluator) and evaluator.agent is rollout.agent
