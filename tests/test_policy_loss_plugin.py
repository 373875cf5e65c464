"""A policy loss with a setting of its own, from a module outside the package (one file, written
here into tmp_path): `policy_loss: module:NAME` in the argument file makes its declared setting a
key of the same file, the real argument parsing reads it, the trainer's loss receives it, and a
misspelt key or a value outside the declaration is refused in one line (exit status 2)."""
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from ppo.common.argument_parsing import ArgumentError, parse_arguments
from ppo.common.argument_table import check_early
from ppo.entry.ppo_arguments import DataArgument, ModelArgument, PPOTrainingArguments
from ppo.trainer.settings import UpdateSettings, slice_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = (ModelArgument, DataArgument, PPOTrainingArguments)
PLUGIN = textwrap.dedent('''
    """A policy loss of one's own: the ratio-weighted advantage, scaled by its setting."""
    import paddle

    from ppo.algos import PolicyLoss, Setting

    RECEIVED = []


    def _scaled(logprobs, old_logprobs, advantages, mask, scaled_coef=0.5):
        RECEIVED.append(float(scaled_coef))
        ratio = paddle.exp(logprobs - old_logprobs.detach())
        return -advantages * ratio * scaled_coef, {}


    SCALED = PolicyLoss("scaled_pg", _scaled,
                        (Setting("scaled_coef", float, 0.5, "scaled_pg: weight of the loss.", bounds=(0.0, False, None, False)),),
                        "a test", "by hand")
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The module name of the outside policy loss (importable from tmp_path)."""
    name = f"outside_loss_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def argument_file(tmp_path, **keys):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({**keys, "output_dir": str(tmp_path / "out"), "max_steps": 1}))
    return str(path)


def test_an_outside_policy_loss_setting_is_read_from_the_argument_file(tmp_path, plugin):
    path = argument_file(tmp_path, policy_loss=f"{plugin}:SCALED", scaled_coef=0.7)
    check_early("ppo", [path])  # the stored table leaves a file naming an outside entry to the full pass
    _, _, args = parse_arguments(CLASSES, [path])
    assert isinstance(args, PPOTrainingArguments) and args.scaled_coef == 0.7
    settings = slice_of(UpdateSettings, args)
    assert settings.policy_settings == {"scaled_coef": 0.7}
    from ppo.trainer.updater import PPOUpdater

    updater = PPOUpdater(None, [], None, None, ptx=None, divergence=None, offload=None, state=None, ranks=None,
                         settings=settings, samples=None)
    mask = paddle.to_tensor([[1.0, 1.0, 0.0]])
    mb = SimpleNamespace(old_logprobs=paddle.to_tensor([[-1.0, -2.0, -3.0]]), advantages=paddle.to_tensor([[1.0, -2.0, 5.0]]),
                         response_mask=mask, ref_logprobs=None, rollout_is_weights=None)
    logprobs = paddle.to_tensor([[-0.5, -2.5, -1.0]])
    entropy = paddle.ones([1, 3])
    loss, _ = updater.actor_loss(mb, {"logprobs": logprobs, "entropy": entropy}, num_tokens=2.0, num_seqs=1.0)
    # token-mean over the 2 real tokens of -A * exp(logp - old) * 0.7
    want = -0.7 * (1.0 * np.exp(0.5) - 2.0 * np.exp(-0.5)) / 2
    np.testing.assert_allclose(float(loss), want, rtol=1e-6)
    assert sys.modules[plugin].RECEIVED[-1] == pytest.approx(0.7)


def test_a_misspelt_outside_setting_is_one_line_naming_the_key(tmp_path, plugin):
    path = argument_file(tmp_path, policy_loss=f"{plugin}:SCALED", scaled_coeff=0.7)
    with pytest.raises(ArgumentError) as err:
        parse_arguments(CLASSES, [path])
    assert str(err.value) == f"{path}: unknown argument 'scaled_coeff'; did you mean 'scaled_coef'?"


def test_an_outside_setting_outside_its_declaration_stops_the_entry_point(tmp_path, plugin, tiny_model_dir, tiny_data_dir):
    """Through `ppo/run_ppo.py` itself: one line on stderr naming the key, exit status 2, before any model loads."""
    config = json.load(open(os.path.join(ROOT, "config/tiny/grpo_argument.json")))
    config.update(actor_model_name_or_path=tiny_model_dir, use_rm_server=False, use_rule_reward=True,
                  train_datasets=f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl", eval_datasets="",
                  load_best_model_at_end=False, policy_loss=f"{plugin}:SCALED", scaled_coef=-1.0)
    path = argument_file(tmp_path, **config)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    done = subprocess.run([sys.executable, "ppo/run_ppo.py", path], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == "run_ppo.py: error: scaled_coef=-1.0 (must be > 0)"
    assert "Traceback" not in done.stderr


def test_an_outside_policy_loss_trains_with_its_setting(tmp_path, plugin, tiny_model_dir, tiny_data_dir):
    """One GRPO step on the tiny model with the outside loss: the loss receives the file's value,
    the metrics are finite, and resolved_arguments.json records the setting."""
    import tests.rule_reward_helpers  # noqa: F401  (registers the test scorers)
    from ppo.run_ppo import build_trainer

    out = tmp_path / "out"
    config = json.load(open(os.path.join(ROOT, "config/tiny/grpo_argument.json")))
    config.update(actor_model_name_or_path=tiny_model_dir, use_rm_server=False, use_rule_reward=True,
                  rule_reward_scorers="tests.rule_reward_helpers:_char_recall_scorer",
                  train_datasets=f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl", eval_datasets="", evaluation_strategy="no",
                  load_best_model_at_end=False, logging_dir=str(out / "vdl"), per_device_prompt_batch_size=4, rollout_n=4,
                  per_device_train_batch_size=16, max_dec_len=6, save_steps=0, num_sample_generations=0,
                  disable_tqdm=True, policy_loss=f"{plugin}:SCALED", scaled_coef=0.7)
    trainer = build_trainer([argument_file(tmp_path, **config)])
    trainer.train()
    received = sys.modules[plugin].RECEIVED
    assert received and all(v == pytest.approx(0.7) for v in received)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert any("loss/policy_avg" in r and np.isfinite(r["loss/policy_avg"]) for r in rows)
    resolved = json.load(open(out / "resolved_arguments.json"))
    assert resolved["PPOTrainingArguments"]["scaled_coef"] == 0.7
    assert resolved["PPOTrainingArguments"]["policy_loss"] == f"{plugin}:SCALED"


ESTIMATOR_PLUGIN = textwrap.dedent('''
    """An advantage estimator of one's own: GRPO on scores raised to its setting `power`."""
    from ppo.algos import AdvEstimator, Setting, broadcast_sequence_advantages, grpo_advantages


    def _powered(rewards, mask, values, group_size, gamma, gae_lambda, scale_by_std, power=1.0):
        scores = (rewards * mask.astype(rewards.dtype)).sum(axis=-1)
        return broadcast_sequence_advantages(grpo_advantages(scores**power, group_size), mask), None


    POWERED = AdvEstimator("powered", _powered, needs_critic=False, per_group=True, whitens=False, min_group_size=2,
                           settings=(Setting("power", float, 1.0, "powered: the scores' exponent.",
                                             bounds=(0.0, False, None, False)),))
''')


def test_an_outside_estimator_setting_is_a_key_of_the_argument_file(tmp_path, monkeypatch):
    from ppo.entry.ppo_argument_checks import estimator_settings

    name = f"outside_estimator_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(ESTIMATOR_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        path = argument_file(tmp_path, adv_estimator=f"{name}:POWERED", rollout_n=4, power=3.0)
        _, _, args = parse_arguments(CLASSES, [path])
        assert args.power == 3.0 and estimator_settings(args) == {"power": 3.0}
        with pytest.raises(ArgumentError) as err:
            parse_arguments(CLASSES, [argument_file(tmp_path, adv_estimator=f"{name}:POWERED", rollout_n=4, power=0.0)])
        assert str(err.value) == "power=0.0 (must be > 0)"
        with pytest.raises(ArgumentError) as err:  # the same declaration checks the JSON object's value
            parse_arguments(CLASSES, [argument_file(tmp_path, adv_estimator=f"{name}:POWERED", rollout_n=4,
                                                    adv_estimator_settings={"power": -2})])
        assert str(err.value) == "adv_estimator_settings: power=-2 (must be > 0)"
    finally:
        sys.modules.pop(name, None)
