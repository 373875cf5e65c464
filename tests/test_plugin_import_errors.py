"""A module of one's own named by an argument (an environment, a tool, a scorer, an advantage
estimator) that fails at import in any way (a SyntaxError, any exception its top-level code
raises): one line naming the module, what it was for, the error and its place, before any model
loads, exit status 2, no traceback."""
import json
import os
import subprocess
import sys

import pytest

from ppo.agents import environment_problems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_LOADED = "Loading weights file"  # PaddleNLP's line when a model's weights load

RAISES = 'import os\n\nraise RuntimeError("no licence server at " + "example:7070")\n'
BROKEN = "def make(:\n    pass\n"


@pytest.fixture
def plugin_dir(tmp_path):
    """A directory with `boom_plugin.py` (raises RuntimeError at line 3) and `broken_plugin.py`
    (a syntax error at line 1)."""
    (tmp_path / "boom_plugin.py").write_text(RAISES)
    (tmp_path / "broken_plugin.py").write_text(BROKEN)
    return tmp_path


def run_grpo_agent(tmp_path, plugin_dir, model_dir, data_dir, *flags):
    """`python ppo/run_ppo.py` on the tiny agent config with `flags`, `plugin_dir` importable."""
    config = json.load(open(os.path.join(ROOT, "config/tiny/grpo_agent_argument.json")))
    config.update(actor_model_name_or_path=model_dir, train_datasets=f"Jsonfile:1.0:{data_dir}/prompts.jsonl",
                  output_dir=str(tmp_path / "out"), logging_dir=str(tmp_path / "out" / "vdl"))
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="5", PYTHONPATH=os.pathsep.join([ROOT, str(plugin_dir)]))
    return subprocess.run([sys.executable, "ppo/run_ppo.py", str(path), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)


def assert_one_line_refusal(done, expected, tmp_path):
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout and MODEL_LOADED not in done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"run_ppo.py: error: {expected}", done.stderr[-3000:]
    assert done.stderr.count("error:") == 1  # the data's log lines come before it, no other error
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("module, error", [
    pytest.param("boom_plugin", "RuntimeError: no licence server at example:7070 ({dir}/boom_plugin.py, line 3)", marks=pytest.mark.slow),
    pytest.param("broken_plugin", "SyntaxError: invalid syntax ({dir}/broken_plugin.py, line 1)", marks=pytest.mark.slow),
])
def test_an_environment_module_that_fails_at_import_is_one_line_before_models_load(
        module, error, plugin_dir, tiny_model_dir, tiny_data_dir, tmp_path):
    done = run_grpo_agent(tmp_path, plugin_dir, tiny_model_dir, tiny_data_dir, "--env_name", f"{module}:Env")
    reason = error.format(dir=plugin_dir)
    assert_one_line_refusal(
        done, f"env_name {module}:Env: cannot import module '{module}' for environment '{module}:Env': {reason}", tmp_path)


def test_a_scorer_module_that_fails_at_import_is_one_line_before_models_load(
        plugin_dir, tiny_model_dir, tiny_data_dir, tmp_path):
    done = run_grpo_agent(tmp_path, plugin_dir, tiny_model_dir, tiny_data_dir, "--rule_reward_scorers",
                          "boom_plugin:score")
    assert_one_line_refusal(
        done, "rule_reward_scorers / rule_reward_weights: cannot import module 'boom_plugin' for scorer "
              f"'boom_plugin:score': RuntimeError: no licence server at example:7070 ({plugin_dir}/boom_plugin.py, line 3)",
        tmp_path)


def test_a_tool_or_estimator_module_that_fails_at_import_is_a_value_error(plugin_dir, monkeypatch):
    from ppo.entry.ppo_argument_checks import find_adv_estimator

    monkeypatch.syspath_prepend(str(plugin_dir))
    problems = environment_problems("tools", {"tools": ["broken_plugin:fn"]})
    assert problems == [
        "environment 'tools' could not be built with env_kwargs {'tools': ['broken_plugin:fn']}: ValueError: cannot "
        f"import module 'broken_plugin' for tool 'broken_plugin:fn': SyntaxError: invalid syntax "
        f"({plugin_dir}/broken_plugin.py, line 1)"]
    with pytest.raises(ValueError) as info:
        find_adv_estimator("boom_plugin:POWERED")
    assert str(info.value) == ("cannot import module 'boom_plugin' for adv_estimator 'boom_plugin:POWERED': RuntimeError: "
                               f"no licence server at example:7070 ({plugin_dir}/boom_plugin.py, line 3)")
    assert "boom_plugin" not in sys.modules


def test_a_missing_module_keeps_the_import_systems_words():
    from ppo.common.plugins import import_plugin_module

    with pytest.raises(ValueError) as info:
        import_plugin_module("no_such_plugin_module", "scorer 'no_such_plugin_module:f'")
    assert str(info.value) == ("cannot import module 'no_such_plugin_module' for scorer 'no_such_plugin_module:f': "
                               "No module named 'no_such_plugin_module'")
