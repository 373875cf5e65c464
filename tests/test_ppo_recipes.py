"""The estimator registry drives the argument checks, and the RL recipes reach the trainer:
GSPO, Dr.GRPO's constant normaliser, entropy bonus, pg_loss_coeff, DAPO overlong shaping,
truncated-completion masking, the KL-loss estimator and the adaptive KL controller."""
import json
import os

import numpy as np
import paddle
import pytest

from ppo.algos import ADV_ESTIMATORS
from ppo.entry.ppo_arguments import PPOTrainingArguments
from tests.rule_reward_helpers import read_metrics, rule_argv


def make_args(tmp_path, **kw):
    # groups of 4: every registered estimator runs with its default settings (pass_at_k's pass_k is 4)
    base = dict(output_dir=str(tmp_path), per_device_prompt_batch_size=2, rollout_n=4, per_device_train_batch_size=8)
    base.update(kw)
    return PPOTrainingArguments(**base)


def test_registry_drives_argument_checks(tmp_path):
    for name, entry in ADV_ESTIMATORS.items():
        args = make_args(tmp_path, adv_estimator=name, normalize_advantage=entry.whitens)
        assert args.use_critic == entry.needs_critic and args.estimator is entry
    with pytest.raises(ValueError, match="rollout_n >= 2"):
        make_args(tmp_path, adv_estimator="reinforce_pp_baseline", normalize_advantage=False, rollout_n=1,
                  per_device_train_batch_size=2)
    for name, entry in ADV_ESTIMATORS.items():  # unset: the registry's default; set: as given (PaddleNLP)
        assert make_args(tmp_path, adv_estimator=name).normalize_advantage is entry.whitens
        assert make_args(tmp_path, adv_estimator=name, normalize_advantage=True).normalize_advantage is True
    with pytest.raises(ValueError, match="has no groups"):
        make_args(tmp_path, adv_estimator="gae", dynamic_sampling=True)


def test_recipe_argument_checks(tmp_path):
    with pytest.raises(ValueError, match="importance_sampling_level"):
        make_args(tmp_path, importance_sampling_level="seq")
    with pytest.raises(ValueError, match="kl_loss_type"):
        make_args(tmp_path, kl_loss_type="k4")
    with pytest.raises(ValueError, match="neither kl_estimator nor kl_loss_type is k3"):
        make_args(tmp_path, kl_clamp=10.0, kl_loss_type="k1")
    with pytest.raises(ValueError, match="overlong_reward_buffer"):
        make_args(tmp_path, enable_overlong_reward_buffer=True, overlong_reward_buffer=100, max_dec_len=10)
    with pytest.raises(ValueError, match="must start positive"):
        make_args(tmp_path, target_kl=1.0, kl_coeff=0.0)
    assert make_args(tmp_path, max_dec_len=12).loss_scale == 12
    assert make_args(tmp_path, loss_scale_factor=3.0).loss_scale == 3.0


def test_trainer_runs_the_recipes_and_logs_their_metrics(tiny_model_dir, tiny_data_dir, tmp_path):
    """One rule-reward step with every recipe switched on: their metrics are logged and
    finite, the loss terms are trained, and the KL controller's state is checkpointed."""
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "recipes")
    trainer = build_trainer(rule_argv(
        tiny_model_dir, tiny_data_dir, out, "--rule_reward_scorers", "reverse", "--max_steps", "2", "--save_steps", "1",
        "--adv_estimator", "reinforce_pp_baseline", "--importance_sampling_level", "sequence",
        "--loss_agg_mode", "seq-mean-token-sum-norm", "--entropy_coeff", "0.01", "--pg_loss_coeff", "0.5",
        "--enable_overlong_reward_buffer", "true", "--overlong_reward_buffer", "3", "--overlong_penalty_factor", "1.0",
        "--mask_truncated_completions", "true", "--kl_loss_coeff", "0.01", "--kl_loss_type", "low_var_kl",
        "--kl_clamp", "10", "--kl_coeff", "0.05", "--target_kl", "0.001", "--kl_horizon", "100",
    ))
    trainer.train()
    first, second = read_metrics(out)
    for key in ("actor/entropy", "loss/kl", "reward/overlong_penalty", "reward/overlong_frac",
                "response_length/masked_truncated_frac", "objective/kl_coeff", "grpo/frac_reward_zero_std"):
        assert np.isfinite(first[key]), key
    # max_dec_len 6, buffer 3: responses of 6 tokens (all truncated ones) get -1
    assert first["reward/overlong_penalty"] <= 0.0
    assert first["objective/kl_coeff"] == 0.05
    # step 1: the actor still equals the reference, KL ~0 < target, so e = -0.2 and
    # coef = 0.05 * (1 - 0.2 * 16 samples / 100) = 0.0484
    assert abs(first["objective/kl"]) < 1e-5
    assert second["objective/kl_coeff"] == pytest.approx(0.0484, rel=1e-9)
    ckpt = sorted(d for d in os.listdir(out) if d.startswith("checkpoint"))
    assert ckpt, os.listdir(out)
    state = json.load(open(os.path.join(out, ckpt[0], "trainer_state.json")))
    error = min(max(second["objective/kl"] / 0.001 - 1, -0.2), 0.2)  # the last checkpoint holds step 2's update
    assert state["kl_controller"]["value"] == pytest.approx(0.0484 * (1 + error * 16 / 100), rel=1e-6)


def test_pg_loss_coeff_and_entropy_coeff_scale_the_actor_loss(tiny_model_dir, tiny_data_dir, tmp_path):
    """On one fixed micro-batch: loss(pg 0.5, ent c) = 0.5 * loss(pg 1, ent 0) - c * entropy."""
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "coef"), "--rule_reward_scorers",
                                      "test_rule_len"))
    import dataclasses

    from ppo.experience import response_logprobs

    exp, _ = trainer.experience.sample()
    trainer.experience.completion.complete(exp)
    mb = exp.select(list(range(8)))
    n_tok, n_seq = float(mb.response_mask.sum()), 8.0
    learner, passes = trainer.learner, trainer.passes
    with paddle.no_grad():
        logprobs, entropy = response_logprobs(trainer.actor, mb, passes.temperature, passes.logprob_chunk_size, with_entropy=True)
        forward = {"logprobs": logprobs, "entropy": entropy}
        base, _ = learner.actor_loss(mb, forward, n_tok, n_seq)
        learner.settings = dataclasses.replace(learner.settings, pg_loss_coeff=0.5, entropy_coeff=0.1)
        scaled, stats = learner.actor_loss(mb, forward, n_tok, n_seq)
    np.testing.assert_allclose(float(scaled), 0.5 * float(base) - 0.1 * float(stats["actor/entropy"]), rtol=1e-5)
    assert float(stats["actor/entropy"]) > 0


@pytest.mark.parametrize("normalize", ["false", "true"])
def test_normalize_advantage_whitens_grpo_advantages_only_when_asked(normalize, tiny_model_dir, tiny_data_dir, tmp_path):
    """PaddleNLP whitens every estimator's advantages with normalize_advantage; GRPO's
    default (unset) leaves them as the group estimator made them."""
    from ppo.algos import masked_whiten
    from ppo.run_ppo import build_trainer

    trainer = build_trainer(rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / normalize), "--rule_reward_scorers",
                                      "test_rule_len", "--normalize_advantage", normalize))
    stage = trainer.experience.completion
    exp, _ = trainer.experience.sample()
    stage.complete(exp)
    raw, _ = stage.estimator(exp.objectives["reward"].rewards, exp.response_mask, group_size=stage.settings.rollout_n,
                             scale_by_std=stage.settings.scale_reward_std)
    expected = masked_whiten(raw, exp.response_mask) if normalize == "true" else raw
    mask = exp.response_mask.numpy().astype(bool)
    np.testing.assert_allclose(exp.advantages.numpy()[mask], expected.numpy()[mask], rtol=1e-5, atol=1e-6)
    if normalize == "true":
        assert abs(float(exp.advantages.numpy()[mask].mean())) < 1e-5
