"""A process reward model (PRM) as the PPO/GRPO reward: its step rewards, the checks made before
any model loads, and short GRPO / PPO runs with `prm_reduction step`.

Hand computation of GRPO's process supervision (DeepSeekMath section 4.1.3): with each step's
score ``s_k`` at its last token, a group's valid steps are normalised together,
``r~ = (s - mean) / (std + 1e-6)`` (unbiased std; 0 when all equal), and a token's advantage is
the sum of the ``r~`` of the steps that end at or after it.
"""
import json
import os
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from ppo.algos import add_to_last_step
from ppo.common.argument_parsing import REPO_ROOT
from ppo.entry.paddlenlp_rl_arguments import process_reward_model_problems
from ppo.scoring.process_reward import fixed_step_groups
from tests.pinned_metrics import assert_pinned


def test_fixed_step_groups():
    assert fixed_step_groups(5, 2) == [[0, 1], [2, 3], [4]]
    assert fixed_step_groups(0, 2) == [[]]  # an empty response is one empty step
    with pytest.raises(ValueError, match="step_tokens"):
        fixed_step_groups(3, 0)


def test_add_to_last_step_hand_case_and_inputs_untouched():
    """Row 0's last valid step is 1 (step 2 masked, garbage there): 0.5 + (-1) = -0.5; row 1 has one step."""
    s = paddle.to_tensor([[0.2, 0.5, 9.0], [0.7, 3.0, 4.0]])
    m = paddle.to_tensor([[1, 1, 0], [1, 0, 0]])
    before = s.numpy().copy()
    out = add_to_last_step(s, m, paddle.to_tensor([-1.0, 0.25]))
    np.testing.assert_allclose(out.numpy(), [[0.2, -0.5, 0.0], [0.95, 0.0, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(s.numpy(), before)


def prm_args(**kw):
    base = dict(prm_reduction="last", prm_step_separator="\n", prm_step_tokens=0, prm_end_step=False, tensor_parallel_degree=1,
                pipeline_parallel_degree=1, normalize_reward=False, adv_estimator="grpo", kl_coeff=0.0)
    args = SimpleNamespace(**{**base, **kw})
    from ppo.algos import get_adv_estimator

    args.estimator = get_adv_estimator(args.adv_estimator)
    return args


def model_args(path):
    return SimpleNamespace(use_rm_server=False, use_rule_reward=False, external_scores=False, reward_model_name_or_path=path)


def test_process_reward_model_checks_before_loading(tmp_path):
    prm, rm = tmp_path / "prm", tmp_path / "rm"
    for d, flag in ((prm, True), (rm, False)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"process_reward": flag}))
    assert process_reward_model_problems(model_args(str(prm)), prm_args(prm_reduction="step", prm_step_tokens=2)) == []
    assert process_reward_model_problems(model_args(str(rm)), prm_args()) == []
    problems = process_reward_model_problems(model_args(str(rm)), prm_args(prm_reduction="min", prm_step_tokens=2))
    assert problems and "prm_reduction, prm_step_tokens set, but the reward is no process reward model" in problems[0]
    problems = process_reward_model_problems(model_args(str(rm)), prm_args(prm_end_step=True))
    assert problems and problems[0].startswith("prm_end_step set, but the reward is no process reward model")
    problems = process_reward_model_problems(model_args(str(prm)), prm_args(
        prm_reduction="step", normalize_reward=True, kl_coeff=0.05, tensor_parallel_degree=2))
    assert len(problems) == 3
    assert any("normalize_reward" in p for p in problems) and any("set kl_coeff 0" in p for p in problems)
    assert any("tensor/pipeline parallel" in p for p in problems)
    # a critic-based estimator puts the KL into its token rewards: kl_coeff is fine there
    assert process_reward_model_problems(model_args(str(prm)), prm_args(prm_reduction="step", adv_estimator="gae",
                                                                        kl_coeff=0.05)) == []


@pytest.fixture(scope="module")
def prm_dir(tiny_rm_dir, tmp_path_factory):
    """The tiny score model saved as a process reward model (placeholder `|`)."""
    from ppo.models.adapters import load_merged_score_model
    from paddlenlp.transformers import AutoTokenizer

    model = load_merged_score_model(tiny_rm_dir)
    model.config.process_reward, model.config.placeholder_token, model.config.reward_tokens = True, "|", "+,-"
    path = str(tmp_path_factory.mktemp("prm") / "prm")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_rm_dir).save_pretrained(path)
    return path


def hand_process_advantages(steps, step_mask, mask, group):
    out = np.zeros_like(steps)
    for g in range(0, steps.shape[0], group):
        vals = steps[g:g + group][step_mask[g:g + group] > 0]
        mean, std = vals.mean(), vals.std(ddof=1) if len(vals) > 1 else 0.0
        norm = (steps[g:g + group] - mean) / (std + 1e-6) if vals.max() > vals.min() else np.zeros_like(steps[g:g + group])
        for i in range(group):
            for t in np.flatnonzero(mask[g + i] > 0):
                out[g + i, t] = sum(norm[i, k] for k in np.flatnonzero(step_mask[g + i] > 0) if k >= t)
    return out


def run_args(config, prm_dir, tiny_model_dir, tiny_data_dir, out, *extra):
    return [os.path.join(REPO_ROOT, "config", "tiny", config), "--actor_model_name_or_path", tiny_model_dir,
            "--reward_model_name_or_path", prm_dir, "--train_datasets", f"Jsonfile:1.0:{tiny_data_dir}/prompts.jsonl",
            "--eval_datasets", f"Jsonfile:1.0:{tiny_data_dir}/test.jsonl", "--output_dir", out, "--logging_dir",
            f"{out}/vdl", "--max_steps", "2", "--per_device_prompt_batch_size", "4", "--rollout_n", "4",
            "--per_device_train_batch_size", "8", "--max_dec_len", "6", "--evaluation_strategy", "no", "--save_steps", "0",
            "--num_sample_generations", "0", "--disable_tqdm", "true", "--load_best_model_at_end", "false",
            "--prm_reduction", "step", "--prm_step_tokens", "2", *extra]


def test_grpo_with_a_process_reward_model_trains_on_step_advantages(prm_dir, tiny_model_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "grpo_prm")
    trainer = build_trainer(run_args("grpo_argument.json", prm_dir, tiny_model_dir, tiny_data_dir, out,
                                     "--use_rm_server", "false"))
    stage = trainer.experience.completion
    seen, original = [], stage.process_advantages

    def recorded(steps, step_mask, mask):
        advantages = original(steps, step_mask, mask)
        seen.append([x.numpy().copy() for x in (steps, step_mask, mask, advantages)])
        return advantages

    stage.process_advantages = recorded
    trainer.train()
    assert len(seen) == 2
    for steps, step_mask, mask, advantages in seen:
        assert (step_mask.sum(axis=1) >= 1).all() and ((steps > 0) & (steps < 1))[step_mask > 0].all()  # P(good) per step
        want = hand_process_advantages(steps.astype("float64"), step_mask, mask, 4)
        # float32 centring of near-equal P(good) divided by their small std: about 1e-4 apart
        np.testing.assert_allclose(advantages * mask, want, rtol=1e-3, atol=1e-3)
        assert np.abs(want).max() > 0.1  # a test that can fail
    rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
    trained = [r for r in rows if "loss/policy_avg" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for key in ("objective/scores", "loss/policy_avg", "prm/step_score_mean", "prm/steps_per_response"):
        assert all(np.isfinite(r[key]) for r in trained), key
    assert trained[0]["objective/scores"] != trained[1]["objective/scores"]  # moving
    assert_pinned("grpo_prm_step", rows, rtol=3e-5, atol=1e-6)


def test_ppo_with_a_process_reward_model_puts_step_scores_into_token_rewards(prm_dir, tiny_model_dir, tiny_data_dir,
                                                                            tmp_path):
    """PPO (GAE): the token rewards are the KL rewards plus each step's score at its last token."""
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "ppo_prm")
    trainer = build_trainer(run_args("ppo_argument.json", prm_dir, tiny_model_dir, tiny_data_dir, out,
                                     "--reward_critic_model_name_or_path", tiny_model_dir, "--normalize_reward", "false",
                                     "--missing_eos_penalty", "0"))
    stage = trainer.experience.completion
    seen, original = [], stage.advantages_and_returns

    def recorded(rewards, values, mask):
        seen.append([x.numpy().copy() for x in (rewards, mask)])
        return original(rewards, values, mask)

    stage.advantages_and_returns = recorded
    trainer.train()
    assert len(seen) == 2
    for rewards, mask in seen:  # P(good) of a step (in (0, 1)) at every 2nd token and the last; the KL part is small
        lengths = mask.sum(axis=1).astype(int)
        for row, n in zip(rewards, lengths):
            ends = sorted({min(t, n - 1) for t in range(1, n, 2)} | {n - 2 if n > 1 else 0})  # the last token is EOS
            big = np.flatnonzero(np.abs(row[:n]) > 0.05)
            assert set(big) <= set(ends) | {n - 1}, (row[:n], ends)
    rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl") if "loss/policy_avg" in line]
    assert all(np.isfinite(r["loss/value_avg"]) and np.isfinite(r["objective/scores"]) for r in rows)
