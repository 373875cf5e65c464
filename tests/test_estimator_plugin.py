"""A new advantage estimator with a setting of its own is one module and its entry: this module
defines `POWERED` (GRPO on scores raised to `power`, a setting no other estimator has), and a run
takes it as `adv_estimator tests.test_estimator_plugin:POWERED` with `adv_estimator_settings
{"power": 2}`; no other file of the toolkit changes. Registering it under a name is one entry in
`ppo.algos.ADV_ESTIMATORS`."""
import numpy as np
import paddle
import pytest

from ppo.algos import AdvEstimator, broadcast_sequence_advantages, grpo_advantages
from ppo.common.argument_problems import ArgumentError
from tests.rule_reward_helpers import rule_argv


def _powered(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std, power):
    scores = (rewards * mask.astype(rewards.dtype)).sum(axis=-1)
    return broadcast_sequence_advantages(grpo_advantages(scores**power, group_size, scale_by_std=scale_by_std), mask), None


POWERED = AdvEstimator("powered_grpo", _powered, needs_critic=False, per_group=True, whitens=False, min_group_size=2,
                       settings={"power": 1.0})


@pytest.mark.parametrize("settings, power", [("", 1.0), ('{"power": 2}', 2.0)])
def test_a_module_estimator_with_its_own_setting_runs(settings, power, tiny_model_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "powered"), "--rule_reward_scorers",
                                      "test_rule_len", "--adv_estimator", "tests.test_estimator_plugin:POWERED",
                                      "--adv_estimator_settings", settings))
    stage = trainer.experience.completion
    assert stage.estimator.name == POWERED.name and stage.estimator_settings == {"power": power}
    exp, _ = trainer.experience.sample()
    stage.complete(exp)
    scores, mask = exp.objectives["reward"].scores, exp.response_mask
    expected = broadcast_sequence_advantages(grpo_advantages(scores.astype("float32")**power, 4), mask)
    assert float(paddle.abs(expected).max()) > 0  # the length scores vary within groups
    np.testing.assert_allclose(exp.advantages.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_an_unknown_setting_or_estimator_is_refused_before_models_load(tiny_model_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    argv = rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "bad"), "--adv_estimator", "tests.test_estimator_plugin:POWERED")
    with pytest.raises(ArgumentError, match=r"takes no \['gamma_prime'\] \(its settings: \['power'\]\)"):
        build_trainer([*argv, "--adv_estimator_settings", '{"gamma_prime": 1}'])
    with pytest.raises(ArgumentError, match="adv_estimator must be one of"):
        build_trainer([*argv, "--adv_estimator", "tests.test_estimator_plugin:_powered"])
