"""Best-policy selection in the PPO/GRPO loop (`load_best_model_at_end`, `metric_for_best_model`,
`greater_is_better`): the comparison, the host copy and its restore, the argument checks, and a
tiny GRPO run whose saved policy is the best evaluated one."""
import json
import os

import numpy as np
import paddle
import pytest

from ppo.run_ppo import build_trainer
from ppo.trainer.best_policy import BestPolicy, eval_metric_name, improves
from tests.rule_reward_helpers import rule_argv


def test_metric_names_and_comparison():
    assert eval_metric_name("accuracy") == eval_metric_name("eval_accuracy") == eval_metric_name("eval/accuracy") == "eval/accuracy"
    assert improves(0.5, None, True) and improves(0.5, None, False)
    assert improves(0.6, 0.5, True) and not improves(0.5, 0.5, True) and not improves(0.4, 0.5, True)
    assert improves(0.4, 0.5, False) and not improves(0.5, 0.5, False) and not improves(0.6, 0.5, False)


def test_keeps_the_best_weights_and_restores_them():
    paddle.seed(0)
    model = paddle.nn.Linear(3, 2)
    keeper = BestPolicy("eval/accuracy")
    assert keeper.restore(model) is None and keeper.summary() == {}
    trail = {}
    for step, acc in [(0, 0.2), (10, 0.7), (20, 0.7), (30, 0.4)]:
        with paddle.no_grad():
            model.weight.set_value(paddle.full([3, 2], float(step)))
        kept = keeper.consider(step, {"eval/accuracy": acc, "eval/score": 1.0}, model)
        trail[step] = kept
    assert trail == {0: True, 10: True, 20: False, 30: False}  # a tie keeps the earlier policy
    assert keeper.restore(model) == 10
    np.testing.assert_array_equal(model.weight.numpy(), np.full([3, 2], 10.0, dtype="float32"))
    assert keeper.summary() == {"best_policy": {"step": 10, "metric": "eval/accuracy", "value": 0.7}}
    # the copy is the weights' values at step 10, not a view of the live tensor
    with paddle.no_grad():
        model.weight.set_value(paddle.full([3, 2], 99.0))
    np.testing.assert_array_equal(keeper.weights["weight"], np.full([3, 2], 10.0, dtype="float32"))
    lower = BestPolicy("eval/response_length", greater_is_better=False)
    for step, length in [(0, 6.0), (5, 4.0), (10, 5.0)]:
        lower.consider(step, {"eval/response_length": length}, model)
    assert lower.step == 5
    with pytest.raises(KeyError, match="metric_for_best_model 'eval/accuracy' is not among"):
        BestPolicy("eval/accuracy").consider(0, {"eval/score": 1.0}, model)


def test_arguments_that_cannot_pick_a_policy_are_refused(tiny_model_dir, tiny_data_dir, tmp_path):
    argv = rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "o"), "--rule_reward_scorers", "reverse",
                     "--load_best_model_at_end", "true")
    with pytest.raises(ValueError) as info:  # no evaluations, PaddleNLP's default metric (loss)
        build_trainer(argv + ["--save_strategy", "no"])
    message = str(info.value)
    assert "load_best_model_at_end picks the best evaluated policy: set do_eval true" in message
    assert "metric_for_best_model 'loss': the PPO/GRPO evaluation reports eval/score, eval/accuracy" in message


def test_save_steps_off_the_evaluation_grid_is_paddlenlps_one_error(tiny_model_dir, tiny_data_dir, tmp_path):
    """PaddleNLP refuses save_steps that are not a multiple of eval_steps under load_best_model_at_end
    before it sets the parallel layout: its refusal and our other problems come as one error
    (the batch checks over data-parallel ranks were an AttributeError traceback)."""
    argv = rule_argv(tiny_model_dir, tiny_data_dir, str(tmp_path / "o"), "--rule_reward_scorers", "reverse",
                     "--load_best_model_at_end", "true", "--evaluation_strategy", "steps", "--eval_steps", "10",
                     "--save_steps", "25", "--metric_for_best_model", "accuracy", "--kl_estimator", "k9")
    with pytest.raises(ValueError) as info:
        build_trainer(argv)
    message = str(info.value)
    assert "PaddleNLP TrainingArguments refused the values" in message and "round multiple of the evaluation" in message
    assert "k9" in message  # our own checks still run and join the same error


def test_grpo_run_saves_the_best_evaluated_policy(tiny_model_dir, tiny_data_dir, tmp_path):
    from ppo.models.loading import load_causal_lm

    out = str(tmp_path / "best")
    argv = rule_argv(tiny_model_dir, tiny_data_dir, out, "--rule_reward_scorers", "test_rule_len",
                     "--max_steps", "4", "--learning_rate", "0.01", "--evaluation_strategy", "steps", "--eval_steps", "1",
                     "--save_steps", "4", "--load_best_model_at_end", "true", "--metric_for_best_model", "score")
    trainer = build_trainer(argv)
    summary = trainer.train()
    evals = [json.loads(ln) for ln in open(f"{out}/metrics.jsonl") if "eval/score" in ln]
    assert [r["step"] for r in evals] == [0, 1, 2, 3, 4]
    scores = [r["eval/score"] for r in evals]
    best = int(np.argmax(scores))  # the first of equal scores
    assert summary["best_policy"] == {"step": best, "metric": "eval/score", "value": scores[best]}
    assert json.load(open(os.path.join(out, "summary.json")))["best_policy"]["step"] == best
    saved = load_causal_lm(os.path.join(out, "policy")).state_dict()
    kept = trainer.best_policy.weights
    assert sorted(saved) == sorted(kept)
    for name, tensor in saved.items():
        np.testing.assert_array_equal(tensor.numpy(), kept[name], err_msg=name)
