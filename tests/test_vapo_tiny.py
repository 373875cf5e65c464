"""config/tiny/vapo_argument.json through rl/run_rl.py (PaddleNLP's entry name): two VAPO steps on
the tiny model with the GRPO demo's in-process rule reward, and the run's own advantages and critic
targets checked against VAPO's decoupled lambdas computed by hand.

Hand computation (gamma 1, the run's settings): a response of ``l`` tokens gets the actor lambda
``clip(1 - 1/(0.05 l), 0, 1)``, which is 0 for every ``l <= 20`` (the tiny responses have at most
``max_dec_len`` tokens), so the advantages are one-step TD errors
``A_t = r_t + V_{t+1} - V_t`` (``V`` after the last token 0); the critic's lambda is 1, so its
targets are the reward-to-go ``R_t = sum_{t' >= t} r_t'`` whatever the values.
"""
import json
import os

import numpy as np

import tests.rule_reward_helpers  # noqa: F401  (registers test_rule_len: a reward that varies by response)
from ppo.common.argument_parsing import REPO_ROOT

CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "vapo_argument.json")


def hand_vapo(rewards, values, mask):
    """Per row: one-step TD advantages (actor lambda 0 at these lengths), reward-to-go returns."""
    advantages, returns = np.zeros_like(rewards), np.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        cols = np.flatnonzero(mask[i] > 0)
        assert len(cols) <= 20 and np.array_equal(cols, np.arange(len(cols)))  # lambda 0, mask from column 0
        next_value, to_go = 0.0, 0.0
        for t in cols[::-1]:
            advantages[i, t] = rewards[i, t] + next_value - values[i, t]
            to_go += rewards[i, t]
            returns[i, t] = to_go
            next_value = values[i, t]
    return advantages, returns


def test_tiny_vapo_config_runs_two_steps_with_decoupled_lambdas(tiny_model_dir, tiny_data_dir, tmp_path):
    from rl.run_rl import build_trainer

    out = str(tmp_path / "vapo")
    trainer = build_trainer([
        CONFIG, "--actor_model_name_or_path", tiny_model_dir, "--reward_critic_model_name_or_path", tiny_model_dir,
        "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl",
        "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl",
        "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "2", "--per_device_prompt_batch_size", "4",
        "--rollout_n", "4", "--per_device_train_batch_size", "8", "--max_dec_len", "6", "--evaluation_strategy", "no",
        "--save_steps", "0", "--num_sample_generations", "0", "--disable_tqdm", "true",
        "--rule_reward_scorers", "test_rule_len",
    ])
    stage = trainer.experience.completion  # the AdvantageStage: the estimator with its settings
    assert stage.estimator.name == "vapo" and stage.estimator_settings == {"vapo_alpha": 0.05, "critic_gae_lambda": 1.0}
    seen, original = [], stage.advantages_and_returns

    def recorded(rewards, values, mask):
        advantages, returns = original(rewards, values, mask)
        seen.append([x.numpy().copy() for x in (rewards, values, mask, advantages, returns)])
        return advantages, returns

    stage.advantages_and_returns = recorded
    actor = trainer.passes.models.actor
    actor_before = actor.parameters()[-1].numpy().copy()
    trainer.train()

    assert len(seen) == 2
    for rewards, values, mask, advantages, returns in seen:
        assert np.abs(rewards).max() > 0 and np.abs(values * mask).max() > 0  # a test that can fail
        want_adv, want_ret = hand_vapo(rewards, values, mask)
        np.testing.assert_allclose(advantages * mask, want_adv, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(returns * mask, want_ret, rtol=1e-5, atol=1e-6)

    rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl") if "objective/scores" in line]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("objective/scores", "loss/policy_avg", "loss/value_avg", "policy/approxkl_avg"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert np.abs(actor.parameters()[-1].numpy() - actor_before).max() > 0  # the policy moved
    resolved = json.load(open(f"{out}/resolved_arguments.json"))["PPOTrainingArguments"]
    assert resolved["adv_estimator"] == "vapo" and resolved["vapo_alpha"] == 0.05 and resolved["critic_gae_lambda"] == 1.0
