"""No hidden hand-offs between the advantage stage and the updater: the update's first forward,
run ahead with `reuse_first_update_forward`, is a field of the experience (the passes keep
nothing) that the updater takes for its first optimiser step; where an objective's scores go
and which token rewards join them are asked of the scorer and of the registered terms
(ppo/trainer/reward_terms.py), not tested for in the stage."""
import numpy as np
import paddle

from ppo.trainer.env_reward import EnvironmentScorer
from ppo.trainer.loop import StepClock
from ppo.trainer.objectives import ScoredObjective
from ppo.trainer.reward_terms import (TOKEN_REWARD_TERMS, EndScore, placement_of, register_token_reward_term,
                                      with_token_reward_terms)
from ppo.trainer.scoring import ProcessRewardModelScorer, RuleScorer
from ppo.run_ppo import build_trainer
from tests.test_ppo_trainer import ppo_argv


class Accumulated(dict):
    def add(self, stats):
        self.update(stats)


def test_the_first_forward_rides_on_the_experience(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    argv = ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, str(tmp_path / "ppo"), "--max_steps", "1",
                    "--per_device_train_batch_size", "8", "--reuse_first_update_forward", "true",
                    "--use_rollout_logprobs", "false")
    trainer = build_trainer(argv)
    exp, _ = trainer.experience.make(StepClock())
    first = exp.first_forward
    assert sorted(first) == ["entropy", "logprobs", "values"] and list(first["logprobs"].shape) == [8, exp.response_ids.shape[1]]
    np.testing.assert_array_equal(first["logprobs"].numpy(), exp.old_logprobs.numpy())
    np.testing.assert_array_equal(first["values"].numpy(), exp.objectives["reward"].values.numpy())
    assert not first["logprobs"].stop_gradient  # the update's own forward, with gradients
    assert not hasattr(trainer.passes, "kept_forward")  # nothing parked in the passes
    assert exp.select(list(range(8))).first_forward is None  # a copy of rows does not carry it
    seen = []
    backward_step = trainer.passes.backward_step
    trainer.passes.backward_step = lambda e, plan, losses, f=None: seen.append(f) or backward_step(e, plan, losses, f)
    trainer.learner.learn(exp, Accumulated(), StepClock())
    assert seen[0] is first and all(f is None for f in seen[1:]) and exp.first_forward is None


class Trace:
    def __init__(self, steps=None, marks=None):
        self.step_rewards, self.step_mask = steps, marks


def test_the_scorer_places_its_scores():
    scores = paddle.to_tensor([1.0, 2.0])
    for scorer in (EnvironmentScorer(), RuleScorer.__new__(RuleScorer)):
        assert placement_of(scorer) is EndScore and EndScore.place(Trace(), scores)[1] is None
    prm = ProcessRewardModelScorer(None, "step", None)
    assert placement_of(prm) is prm
    steps = paddle.to_tensor([[0.2, 0.0, 0.7], [0.5, 0.0, 0.0]])
    marks = paddle.to_tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    end, token_rewards = prm.place(Trace(steps, marks), paddle.to_tensor([0.5, 0.25]))  # last steps 0.7, 0.5
    np.testing.assert_allclose(end.numpy(), [0.0, 0.0])
    np.testing.assert_allclose(token_rewards.numpy(), [[0.2, 0.0, 0.5], [0.25, 0.0, 0.0]], rtol=1e-6)
    assert prm.place(Trace(), scores)[1] is None  # last / min: the score at the last token


def test_the_environment_term_and_an_outside_term():
    env = paddle.to_tensor([[0.0, 1.0], [2.0, 0.0]])
    exp = type("Exp", (), {"env_rewards": env})()
    mask = paddle.to_tensor([[1.0, 1.0], [1.0, 0.0]])
    zero = paddle.zeros([2, 2])
    reward = ScoredObjective("reward", RuleScorer.__new__(RuleScorer))
    np.testing.assert_allclose(with_token_reward_terms(zero, exp, reward, True, mask).numpy(), [[0, 1], [2, 0]])
    np.testing.assert_allclose(with_token_reward_terms(zero, exp, reward, False, mask).numpy(), 0)  # a cost: none
    only_env = ScoredObjective("reward", EnvironmentScorer())  # its scores already are the environment's
    np.testing.assert_allclose(with_token_reward_terms(zero, exp, only_env, True, mask).numpy(), 0)

    def bonus(exp, objective, first):
        return paddle.full([2, 2], 0.5) if objective.name == "cost" else None

    register_token_reward_term(bonus)
    try:
        cost = ScoredObjective("cost", RuleScorer.__new__(RuleScorer))
        np.testing.assert_allclose(with_token_reward_terms(zero, exp, cost, False, mask).numpy(), [[0.5, 0.5], [0.5, 0]])
    finally:
        TOKEN_REWARD_TERMS.remove(bonus)
