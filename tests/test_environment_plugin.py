"""An environment with a setting of its own, from a module outside the package (one file, written
here into tmp_path, nothing of the package edited): `env_name` names its class as `module:Class`,
`env_kwargs` in a JSON argument file sets the setting it declares, the real argument parsing
reads it, the environments the run builds receive it (the environment's reward reaches the
experience of a GRPO step on the tiny model), and a misspelt key or a value outside the
declaration is refused in one line naming the key by the start-up pass, before any model loads."""
import json
import os
import sys
import textwrap

import numpy as np
import pytest

from ppo.agents import AgentSettings, environment_facts, list_environments
from ppo.agents.record_env import record_environment
from ppo.common.argument_parsing import parse_arguments
from ppo.common.argument_problems import UsageError
from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments
from ppo.run_ppo import build_trainer, start_up
from ppo.trainer.loop import StepClock
from tests.plugin_helpers import forget_module, write_plugin_module
from tests.test_agent_training import grpo_agent_argv

CLASSES = (ModelArgument, DataArgument, PPOTrainingArguments)
PLUGIN = textwrap.dedent('''
    """An environment of one's own: one turn, whose reward is the setting `bonus`."""
    from ppo.agents import Environment, EnvironmentFacts, register_environment
    from ppo.algos import Setting

    BUILT = []


    @register_environment(__name__ + ".bonus", facts=EnvironmentFacts(
        summary="one turn; its reward is bonus", observation_role="user",
        settings=(Setting("bonus", float, 1.0, "The reward of the one turn.", bounds=(0.0, True, None, False)),)))
    class BonusEnv(Environment):
        def __init__(self, bonus=1.0):
            BUILT.append(bonus)
            self.bonus = bonus

        def reset(self, record):
            return record["src"]

        def step(self, action_text):
            return None, self.bonus, True, {}
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """`module:Class` of the outside environment (importable from tmp_path; the one file written)."""
    name = write_plugin_module(tmp_path, monkeypatch, "outside_env", PLUGIN)
    yield name + ":BonusEnv"
    forget_module(name)


def test_an_outside_environment_setting_reaches_the_environment(tmp_path, plugin):
    assert plugin not in list_environments() and plugin.split(":")[0] not in sys.modules
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"env_name": plugin, "env_kwargs": {"bonus": 2.5}, "output_dir": str(tmp_path / "out")}))
    _, _, args = parse_arguments(CLASSES, [str(path)])
    assert args.env_options == {"bonus": 2.5}
    assert [s.name for s in environment_facts(plugin).settings] == ["bonus"]  # the facts its module registered
    assert environment_facts(plugin).observation_role == "user"
    env = record_environment(AgentSettings.of(args), {"src": "hi"})  # as the agent rollout builds them
    assert env.bonus == 2.5 and env.reset({"src": "hi"}) == "hi" and env.step("x")[1:3] == (2.5, True)


@pytest.mark.parametrize("kwargs, problem", [
    ('{"bonus": -1.0}', "env_kwargs: bonus=-1.0 (must be >= 0)"),
    ('{"bonus": "high"}', "env_kwargs: bonus='high' (must be float)"),
    ('{"bonsu": 2.0}', "env_kwargs has no option 'bonsu' (did you mean 'bonus'?); its options: bonus"),
])
def test_a_bad_outside_environment_setting_is_one_line_naming_the_key(tmp_path, plugin, tiny_model_dir, tiny_data_dir,
                                                                      kwargs, problem):
    argv = grpo_agent_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "bad"), "--env_name", plugin,
                           "--env_kwargs", kwargs)
    with pytest.raises(UsageError) as err:
        start_up(argv)
    assert str(err.value) == f"env_name {plugin}: {problem}"
    assert sys.modules[plugin.split(":")[0]].BUILT == []  # refused from the declaration, never constructed
    assert not os.path.exists(str(tmp_path / "bad" / "resolved_arguments.json"))


def test_its_reward_reaches_a_grpo_step(tmp_path, plugin, tiny_model_dir, tiny_data_dir):
    """The run's environments are built with the file's value: each trajectory's one turn is
    rewarded 2.5, and the experience's environment rewards say so."""
    out = str(tmp_path / "run")
    trainer = build_trainer(grpo_agent_argv(tiny_model_dir, tiny_data_dir, out, "--env_name", plugin,
                                            "--env_kwargs", '{"bonus": 2.5}'))
    exp, _ = trainer.experience.make(StepClock())
    built = sys.modules[plugin.split(":")[0]].BUILT
    assert built and all(b == 2.5 for b in built)
    np.testing.assert_allclose(exp.env_rewards.numpy().sum(axis=-1), np.full(len(exp), 2.5))
    resolved = json.load(open(os.path.join(out, "resolved_arguments.json")))
    assert json.loads(resolved["PPOTrainingArguments"]["env_kwargs"]) == {"bonus": 2.5}


def test_a_constructor_that_disagrees_with_its_declaration_is_refused():
    """The declaration is the one place of a setting: a constructor default that differs from it,
    or a declared setting the constructor does not take, is refused when the class registers."""
    from ppo.agents import Environment, EnvironmentFacts, register_environment
    from ppo.algos import Setting

    class Other(Environment):
        def __init__(self, bonus=2.0):
            self.bonus = bonus

        def reset(self, record):
            return ""

        def step(self, action_text):
            return None, 0.0, True, {}

    facts = EnvironmentFacts(summary="s", settings=(Setting("bonus", float, 1.0, "h"),))
    with pytest.raises(TypeError, match=r"declares 'bonus' with default 1.0, but .*Other defaults it to 2.0"):
        register_environment("disagreeing_test", Other, facts)
    facts = EnvironmentFacts(summary="s", settings=(Setting("penalty", float, 1.0, "h"),))
    with pytest.raises(TypeError, match="declares the setting 'penalty', but .*Other takes no such keyword"):
        register_environment("disagreeing_test", Other, facts)
    assert "disagreeing_test" not in list_environments()


def test_environment_settings_table_in_docs_is_up_to_date():
    from scripts.gen_env_table import main as gen_env_table

    assert gen_env_table(["--check"]) == 0, "run: python scripts/gen_env_table.py"
