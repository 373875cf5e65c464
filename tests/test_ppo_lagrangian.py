"""PPO-Lagrangian (Safe RLHF) end to end on tiny models: a cost model whose every cost is the
constant c (zero score head, bias c) moves lambda by the hand formula (up above the threshold,
down below it), the cost critic trains and is saved, frozen models stay put, a stopped and
resumed run (and, slow, one killed with SIGKILL at random moments) repeats the
uninterrupted multiplier trajectory, and bad settings are refused
before any model loads."""
import json
import math
import os
import types

import numpy as np
import paddle
import pytest

from ppo.algos import LagrangeMultiplier
from ppo.common.argument_parsing import ArgumentError
from ppo.models.loading import load_tokenizer
from ppo.models.score_model import AutoModelForScore
from ppo.run_ppo import build_trainer
from ppo.experience import ObjectiveTrace
from ppo.strategy import Ranks
from ppo.trainer.advantages import AdvantageStage
from ppo.trainer.objectives import LagrangianCombiner, ScoredObjective
from tests.test_ppo_trainer import ppo_argv, read_metrics, weights

COST = 0.5


@pytest.fixture(scope="module")
def constant_cost_dir(tiny_model_dir, tmp_path_factory):
    """A score model on the tiny Llama whose end score is COST for every input."""
    path = str(tmp_path_factory.mktemp("constant_cost"))
    model = AutoModelForScore.from_pretrained(tiny_model_dir)
    model.score_head.weight.set_value(paddle.zeros_like(model.score_head.weight))
    model.score_head.bias.set_value(paddle.full_like(model.score_head.bias, COST))
    model.save_pretrained(path)
    load_tokenizer(tiny_model_dir).save_pretrained(path)
    return path


def safe_argv(model_dir, rm_dir, cost_dir, data_dir, out, *extra):
    return ppo_argv(model_dir, rm_dir, data_dir, out, "--cost_model_name_or_path", cost_dir, "--lambda_lr", "0.2",
                    "--num_sample_generations", "0", *extra)


def expected_lambdas(steps, cost, threshold, lr, lam=1.0, delay=0):
    """safe-rlhf's update by hand: log lambda += lr * (J_C - d) * lambda from step `delay` on."""
    out, x = [], math.log(lam)
    for step in range(steps):
        if step >= delay:
            x += lr * (cost - threshold) * math.exp(x)
        out.append(math.exp(x))
    return out


@pytest.mark.parametrize("threshold,direction", [(0.0, "up"), (1.0, "down")])
def test_constant_cost_moves_lambda_by_the_formula(threshold, direction, tiny_model_dir, tiny_rm_dir, constant_cost_dir,
                                                   tiny_data_dir, tmp_path):
    out = str(tmp_path / "safe")
    trainer = build_trainer(safe_argv(tiny_model_dir, tiny_rm_dir, constant_cost_dir, tiny_data_dir, out, "--max_steps", "3",
                                      "--threshold", str(threshold), "--lambda_update_delay_steps", "1"))
    m = trainer.passes.models
    before = {name: weights(getattr(m, name)) for name in ("cost", "cost_critic", "reward")}
    trainer.train()
    rows = [r for r in read_metrics(out) if "lagrange/lambda" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    lambdas = [r["lagrange/lambda"] for r in rows]
    np.testing.assert_allclose(lambdas, expected_lambdas(3, COST, threshold, 0.2, delay=1), rtol=1e-6)
    assert lambdas[0] == 1.0 and ((lambdas[2] > lambdas[1] > 1.0) if direction == "up" else (lambdas[2] < lambdas[1] < 1.0))
    for r in rows:
        assert r["objective/cost"] == pytest.approx(COST, abs=1e-5)
        assert r["lagrange/episode_cost"] == pytest.approx(COST, abs=1e-5)
        assert np.isfinite(r["loss/cost_value_avg"]) and np.isfinite(r["train/cost_critic_grad_norm"])
        assert 0.0 <= r["val/cost_clipfrac_avg"] <= 1.0
    after = {name: weights(getattr(m, name)) for name in ("cost", "cost_critic", "reward")}
    for name in ("cost", "reward"):
        for k in before[name]:
            np.testing.assert_array_equal(before[name][k], after[name][k], err_msg=f"{name}.{k} changed")
    moved = [k for k in before["cost_critic"] if not np.array_equal(before["cost_critic"][k], after["cost_critic"][k])]
    assert len(moved) == len(before["cost_critic"])
    reloaded = AutoModelForScore.from_pretrained(os.path.join(out, "cost_value"))
    np.testing.assert_array_equal(reloaded.score_head.weight.numpy(), after["cost_critic"]["score_head.weight"])
    state = json.load(open(os.path.join(out, "checkpoint-3", "trainer_state.json")))
    assert math.exp(state["lagrange"]["log_lambda"]) == pytest.approx(lambdas[-1], rel=1e-9)
    assert len(state["lagrange"]["window"]) == 24 and state["run"]["cost_model"] is True


def test_combined_advantage_feeds_the_actor(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, tmp_path):
    """With a cost model whose costs vary, the experience's advantage is (A_R - lambda A_C) / (1 + lambda)
    of its whitened reward and cost advantages."""
    trainer = build_trainer(safe_argv(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, str(tmp_path / "adv"),
                                      "--max_steps", "1", "--lambda_init", "2.0", "--lambda_lr", "0.0"))
    seen = {}
    stage = trainer.experience.completion
    original = stage.shape

    def spy(exp, kl_coeff):
        kl = original(exp, kl_coeff)
        seen["exp"] = exp
        return kl

    stage.shape = spy
    trainer.train_step()
    exp = seen["exp"]
    mask = exp.response_mask.numpy()
    costs, cost_advantages = exp.objectives["cost"].scores.numpy(), exp.objectives["cost"].advantages
    assert costs.std() > 0 and cost_advantages is not None
    whiten = lambda x: (x - x[mask > 0].mean()) / np.sqrt(x[mask > 0].var(ddof=1) + 1e-8) * mask  # noqa: E731
    assert np.allclose(whiten(cost_advantages.numpy()), cost_advantages.numpy(), atol=1e-4)
    # lambda 2 (lr 0): A = (A_R - 2 A_C) / 3, so 3 A + 2 A_C is the whitened reward advantage
    reward_adv = 3 * exp.advantages.numpy() + 2 * cost_advantages.numpy()
    assert abs(reward_adv[mask > 0].mean()) < 1e-4 and abs(reward_adv[mask > 0].std(ddof=1) - 1) < 1e-3


def stage_without_models(lambda_lr):
    """The advantage stage of PPO-Lagrangian with no models: the advantages are the token rewards
    themselves (returns = rewards + values), so the combined advantage is hand-computable."""
    settings = types.SimpleNamespace(clip_range_score=10.0, kl_estimator="k1", kl_clamp=None, rollout_n=1, gamma=1.0,
                                     gae_lambda=1.0, scale_reward_std=False, normalize_advantage=False)
    estimator = lambda rewards, mask, values=None, **_: (rewards * mask.astype(rewards.dtype), rewards + values)  # noqa: E731
    objectives = [ScoredObjective("reward", None), ScoredObjective("cost", None, kl_weight=-1.0)]
    combiner = LagrangianCombiner(LagrangeMultiplier(1.0, lambda_lr, threshold=0.0), Ranks())
    return AdvantageStage(None, objectives, combiner, estimator, kl_control=None, offload=None, reference_scope=(),
                          ranks=Ranks(), state=types.SimpleNamespace(step=0), settings=settings)


def test_multiplier_moves_before_the_actor_advantage_uses_it():
    """safe-rlhf's order: update lambda from the window (this step's costs included), then the
    actor's advantage uses the moved lambda. One response of two tokens, log-probs equal to the
    reference's (KL 0), score 1, cost 2: A_R = [0, 1], A_C = [0, 2]. lambda 1, lambda_lr 0.5,
    threshold 0, J_C = 2: log lambda' = 0 + 0.5 * 2 * 1 = 1, lambda' = e; the last token's
    advantage is (1 - 2e) / (1 + e) = -1.1931757 (the stale lambda 1 would give (1 - 2) / 2 = -0.5)."""
    step = stage_without_models(lambda_lr=0.5)
    logp = paddle.to_tensor([[-1.0, -2.0]], dtype="float64")
    exp = types.SimpleNamespace(
        response_mask=paddle.to_tensor([[1, 1]], dtype="int64"), old_logprobs=logp, ref_logprobs=logp.clone(),
        objectives={"reward": ObjectiveTrace(paddle.to_tensor([1.0], dtype="float64"), values=paddle.zeros([1, 2], dtype="float64")),
                    "cost": ObjectiveTrace(paddle.to_tensor([2.0], dtype="float64"), values=paddle.zeros([1, 2], dtype="float64"))},
    )
    step.shape(exp, kl_coeff=0.1)
    assert step.combiner.multiplier.value == pytest.approx(math.e, rel=1e-12)
    assert step.combined == {"lagrange/lambda": pytest.approx(math.e, rel=1e-12), "lagrange/episode_cost": 2.0}
    np.testing.assert_allclose(exp.advantages.numpy(), [[0.0, (1 - 2 * math.e) / (1 + math.e)]], rtol=1e-12, atol=1e-15)
    assert exp.advantages.numpy()[0, 1] == pytest.approx(-1.1931757, abs=1e-7)


def test_resume_repeats_the_multiplier_trajectory(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, tmp_path):
    """A run stopped after its step-2 checkpoint and resumed logs the same lambda, episode cost,
    cost and cost-critic loss at every step as the run that went straight through."""
    common = ["--max_steps", "4", "--save_steps", "2", "--overwrite_output_dir", "false", "--lambda_lr", "0.5",
              "--episode_cost_window_size", "12", "--threshold", "-0.1"]
    straight = str(tmp_path / "straight")
    build_trainer(safe_argv(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, straight, *common)).train()
    stopped = str(tmp_path / "stopped")
    trainer = build_trainer(safe_argv(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, stopped, *common))
    original = trainer.train_step

    def killed_after_checkpoint():
        if trainer.state.step == 3:
            raise KeyboardInterrupt("killed")
        return original()

    trainer.train_step = killed_after_checkpoint
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert os.path.isdir(os.path.join(stopped, "checkpoint-2", "cost_value"))
    build_trainer(safe_argv(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, stopped, *common)).train()
    keys = ("lagrange/lambda", "lagrange/episode_cost", "objective/cost", "loss/cost_value_avg", "objective/scores")
    a = [r for r in read_metrics(straight) if "lagrange/lambda" in r]
    b = [r for r in read_metrics(stopped) if "lagrange/lambda" in r]
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    assert len({r["lagrange/lambda"] for r in a}) == 4  # the multiplier moved every step
    for ra, rb in zip(a, b):
        for k in keys:
            np.testing.assert_allclose(ra[k], rb[k], rtol=1e-6, atol=1e-7, err_msg=f"step {ra['step']} {k}")


@pytest.mark.slow  # real SIGKILLs of subprocesses; the in-process stop above covers the resume logic by default
def test_kill_9_at_random_moments_repeats_the_multiplier_trajectory(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost,
                                                                    tiny_data_dir, tmp_path):
    """PPO-Lagrangian killed with SIGKILL mid-step, mid-save and mid-trace-write, rerun each time,
    ends with the uninterrupted run's weights and metrics: the same lambda at every step."""
    from tests.test_random_kills import assert_same_run, kill_plan, metrics_without_timings, run_killed_then_resumed, timed_attempt

    def argv(out):
        return safe_argv(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, out, "--max_steps", "5",
                         "--save_steps", "1", "--logging_steps", "1", "--overwrite_output_dir", "false",
                         "--save_total_limit", "2", "--episode_cost_window_size", "12", "--threshold", "-0.1")

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    proc, wall = timed_attempt("ppo", argv(straight))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert run_killed_then_resumed("ppo", argv(resumed), kill_plan(31, wall, (2, 14), (2, 8))) >= 3
    assert_same_run(straight, resumed, "policy")
    lambdas = [r["lagrange/lambda"] for r in metrics_without_timings(resumed) if "lagrange/lambda" in r]
    assert len(lambdas) == 5 and len(set(lambdas)) == 5  # the multiplier moved every step, identically


@pytest.mark.parametrize("extra,message", [
    (["--adv_estimator", "grpo", "--rollout_n", "2"], "adv_estimator grpo has none: use gae"),
    (["--lambda_init", "0"], "lambda_init must be > 0"),
    (["--lambda_init", "2", "--lambda_max", "1"], "lambda_max (1.0) must be >= lambda_init (2.0)"),
    (["--episode_cost_window_size", "0"], "episode_cost_window_size must be >= 1"),
])
def test_bad_lagrangian_settings_are_refused_by_name(extra, message, tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost,
                                                     tiny_data_dir, tmp_path):
    with pytest.raises(ArgumentError) as err:
        build_trainer(safe_argv(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, str(tmp_path / "bad"), *extra))
    assert message in str(err.value)


def test_lagrangian_settings_without_a_cost_model_are_refused(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    with pytest.raises(ArgumentError) as err:
        build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, str(tmp_path / "plain"), "--threshold", "0.3",
                               "--cost_critic_model_name_or_path", tiny_rm_dir))
    text = str(err.value)
    assert "threshold=0.3 is a PPO-Lagrangian setting; set cost_model_name_or_path" in text
    assert "cost_critic_model_name_or_path is set without cost_model_name_or_path" in text


def test_a_cost_model_needs_critics_and_any_parallel_layout_takes_it():
    """(One process resets the parallel degrees to 1 before any check, so the check is called
    directly.) Tensor and pipeline parallel runs of PPO-Lagrangian are compared with one process in
    tests/test_tensor_parallel.py and tests/test_pipeline_rl.py."""
    from types import SimpleNamespace

    from ppo.entry.ppo_argument_checks import lagrangian_problems

    model_args = SimpleNamespace(cost_model_name_or_path="cost", cost_critic_model_name_or_path=None)
    base = dict(adv_estimator="gae", adv_estimator_settings="", rollout_n=1, dynamic_sampling=False, use_critic=True)
    for degrees in ({}, {"tensor_parallel_degree": 2}, {"pipeline_parallel_degree": 2}):
        assert lagrangian_problems(model_args, SimpleNamespace(**base, **degrees)) == []
    (problem,) = lagrangian_problems(model_args, SimpleNamespace(**{**base, "adv_estimator": "grpo", "use_critic": False,
                                                                   "rollout_n": 4}))
    assert "needs cost and reward critics; adv_estimator grpo has none: use gae" in problem


def test_lora_actor_with_a_cost_model(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, tmp_path):
    """use_lora: the actor trains an adapter (the reference is the adapter off), the full-weight
    cost critic trains whole as the reward critic does, and the multiplier moves."""
    out = str(tmp_path / "lora")
    trainer = build_trainer(safe_argv(tiny_model_dir, tiny_rm_dir, tiny_rm_dir_cost, tiny_data_dir, out, "--max_steps", "2",
                                      "--use_lora", "true", "--lora_rank", "4", "--lora_alpha", "8"))
    assert trainer.passes.models.reference is None  # the LoRA actor with its adapter off
    trainer.train()
    rows = [r for r in read_metrics(out) if "lagrange/lambda" in r]
    assert len(rows) == 2 and rows[1]["lagrange/lambda"] != rows[0]["lagrange/lambda"]
    assert np.isfinite(rows[-1]["loss/cost_value_avg"])
    assert os.path.isfile(os.path.join(out, "policy", "lora_model_state.pdparams"))
    assert os.path.isfile(os.path.join(out, "cost_value", "model_state.pdparams"))
