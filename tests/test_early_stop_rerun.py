"""An early-stopped run is finished, and the best policy survives a resume.

Through `ppo/run_ppo.py` (a process per run): a tiny GRPO run early-stopped by its evaluations
(step 0's counted, as the best-policy record counts it) leaves `policy/` = the best evaluated
policy; running the same command again says the run is finished and changes no file. In
process: a run of 4 steps cut at step 2 and resumed keeps the best-policy record and weights
of its first part, so it ends with the uninterrupted run's best policy, summary and weights."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppo.run_ppo import build_trainer
from ppo.trainer.best_policy import BestPolicy, EvalEarlyStop
from tests.rule_reward_helpers import rule_argv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVALUATE = ("--evaluation_strategy", "steps", "--eval_steps", "1", "--load_best_model_at_end", "true",
            "--metric_for_best_model", "score", "--learning_rate", "0.01", "--save_total_limit", "10", "--rule_reward_scorers", "tests.rule_reward_helpers:_len_scorer")


def evaluations(out):
    return [json.loads(ln) for ln in open(f"{out}/metrics.jsonl") if "eval/score" in ln]


def weights(path):
    return {k: np.asarray(v) for k, v in paddle.load(os.path.join(path, "model_state.pdparams")).items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def file_hashes(out):
    """Every file of the run but the lock and the dashboards: name -> sha256."""
    found = {}
    for root, _, files in os.walk(out):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), out)
            if not rel.startswith(("vdl", "run.lock")):
                found[rel] = hashlib.sha256(open(os.path.join(root, f), "rb").read()).hexdigest()
    return found


def test_the_record_and_the_stop_are_checkpoint_state(tmp_path):
    model = paddle.nn.Linear(2, 2)
    keeper = BestPolicy("eval/score")
    keeper.consider(3, {"eval/score": 0.5}, model)
    keeper.save_files(str(tmp_path), 0)
    again = BestPolicy("eval/score")
    again.set_state_dict(json.loads(json.dumps(keeper.state_dict())))
    again.load_files(str(tmp_path), 0)
    assert (again.step, again.best) == (3, 0.5) and same_weights(again.weights, keeper.weights)
    assert not again.consider(5, {"eval/score": 0.4}, model) and again.step == 3  # never replaced by a worse one
    stop = EvalEarlyStop("eval/score", True, patience=1, threshold=0.0)
    assert [stop.observe(s, {"eval/score": v}) for s, v in ((0, 0.5), (1, 0.5))] == [False, True]  # step 0 counts
    resumed = EvalEarlyStop("eval/score", True, patience=1, threshold=0.0)
    resumed.set_state_dict(json.loads(json.dumps(stop.state_dict())))
    assert resumed.stopped == stop.stopped and resumed.stopped["step"] == 1


@pytest.mark.slow
def test_an_early_stopped_run_is_finished(tiny_model_dir, tiny_data_dir, tmp_path):
    """Patience 2, threshold 10 (no score beats its best by 10): the evaluations of steps 0, 1, 2
    give counts 0, 1, 2, so the run stops at step 2 of its 8."""
    out = str(tmp_path / "early")
    argv = rule_argv(tiny_model_dir, tiny_data_dir, out, *EVALUATE, "--max_steps", "8", "--save_steps", "1",
                     "--early_stopping", "true", "--early_stopping_patience", "2", "--early_stopping_threshold", "10")
    cmd = [sys.executable, "ppo/run_ppo.py", *argv]
    env = dict(os.environ, PYTHONPATH=REPO)
    first = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.load(open(f"{out}/summary.json"))
    assert summary["early_stopped"]["step"] == 2 and summary["steps"] == 2
    scores = [e["eval/score"] for e in evaluations(out)]
    assert [e["step"] for e in evaluations(out)] == [0, 1, 2]
    best = int(np.argmax(scores))  # the first of equal scores: step 0 may be the best
    assert summary["best_policy"] == {"step": best, "metric": "eval/score", "value": scores[best]}
    kept = weights(tiny_model_dir) if best == 0 else weights(f"{out}/checkpoint-{best}/policy")
    assert same_weights(weights(f"{out}/policy"), kept)
    before = file_hashes(out)
    second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{out} holds a finished run (early_stopping stopped it at step 2): nothing to train" in second.stderr
    assert file_hashes(out) == before  # policy/, summary.json, metrics.jsonl, the checkpoints: unchanged


def test_a_resumed_run_keeps_the_best_policy_of_its_first_part(tiny_model_dir, tiny_data_dir, tmp_path):
    """The reward asks for long answers (in characters) and the best policy is the one with the
    lowest score: the starting one, in the first part."""
    straight, cut = str(tmp_path / "straight"), str(tmp_path / "cut")
    run = lambda out, steps: build_trainer(rule_argv(  # noqa: E731
        tiny_model_dir, tiny_data_dir, out, *EVALUATE, "--greater_is_better",
        "false", "--max_steps", str(steps), "--save_steps", "1")).train()
    run(straight, 4)
    best = json.load(open(f"{straight}/summary.json"))["best_policy"]
    assert best["step"] <= 2  # the first part's: a resume that forgot it would pick among steps 3-4
    run(cut, 2)
    summary = run(cut, 4)
    assert summary["best_policy"] == best
    assert [e["eval/score"] for e in evaluations(cut)] == [e["eval/score"] for e in evaluations(straight)]
    assert same_weights(weights(f"{cut}/policy"), weights(f"{straight}/policy"))
    # the last checkpoint holds the last step's weights, output_dir/policy the best policy
    assert same_weights(weights(f"{cut}/checkpoint-4/policy"), weights(f"{straight}/checkpoint-4/policy"))
