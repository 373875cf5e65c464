"""The divergence guard: the pure detector, and learning_rate 1e3 in the PPO, GRPO, SFT and
DPO trainers (each stops with DivergenceError naming step and metric, keeping the last good
checkpoint, where it used to exit 0 with a destroyed model)."""
import json
import logging
import os

import numpy as np
import paddle
import pytest

from ppo.common.divergence import DivergenceDetector, DivergenceError
from tests.test_ppo_trainer import ppo_argv, read_metrics


def test_detector_fires_on_an_order_of_magnitude_jump_only():
    det = DivergenceDetector(factor=10.0, window=3, floor=1.0)
    assert det.check(1, {"loss/sft": 4.6}) == {}  # no history yet
    assert det.check(2, {"loss/sft": 5.0, "other": 1e9}) == {}  # unwatched names are ignored
    # median(4.6, 5.0) = 4.8: 47 < 48 passes
    assert det.check(3, {"loss/sft": 47.0}) == {}
    # median(4.6, 5.0, 47) = 5.0: 51 > 50 fires
    msg = det.check(4, {"loss/sft": 51.0})["loss/sft"]
    assert msg.startswith("step 4: loss/sft = 51, 10.2x its recent level 5") and "threshold 10x" in msg
    # the diverged value did not enter the history: the median is still 5.0
    assert det.check(5, {"loss/sft": 49.0}) == {}


def test_detector_floor_and_non_finite():
    det = DivergenceDetector(factor=10.0, window=5, floor=1.0)
    for step, kl in enumerate([0.0, 0.001, 0.02, 0.5, 9.0], start=1):  # near-zero start: floor 1 -> threshold 10
        assert det.check(step, {"objective/kl": kl}) == {}, kl
    assert "objective/kl = 74" in det.check(6, {"objective/kl": 74.0})["objective/kl"]
    assert "is inf" in det.check(7, {"objective/kl": float("inf")})["objective/kl"]
    det2 = DivergenceDetector()
    assert det2.check(1, {"train/grad_norm": float("nan")}) == {}  # nothing to compare with yet
    state = det.state_dict()
    det3 = DivergenceDetector(window=5)
    det3.set_state_dict(state)
    assert det3.check(8, {"objective/kl": 74.0}) and det3.state_dict() == state
    with pytest.raises(ValueError):
        DivergenceDetector(factor=1.0)


def test_gradient_norm_fires_on_the_second_jump_in_a_row():
    """A pre-clip gradient norm spiking once (then back) is not divergence; twice in a row is."""
    det = DivergenceDetector(factor=10.0, window=5, floor=1.0)
    for step, norm in enumerate([25.0, 18.0, 6.0, 5.5, 5.7], start=1):
        assert det.check(step, {"train/critic_grad_norm": norm, "loss/value_avg": 1.0}) == {}
    assert det.check(6, {"train/critic_grad_norm": 136.0}) == {}  # one spike: clipped, judged again next step
    assert det.check(7, {"train/critic_grad_norm": 6.0}) == {}  # back to its level
    assert det.check(8, {"train/critic_grad_norm": 136.0}) == {}
    msg = det.check(9, {"train/critic_grad_norm": 150.0})["train/critic_grad_norm"]
    assert msg.startswith("step 9: train/critic_grad_norm = 150") and msg.endswith("for the second step in a row")
    assert "is nan" in det.check(10, {"train/critic_grad_norm": float("nan")})["train/critic_grad_norm"]  # at once
    assert det.check(11, {"loss/value_avg": 1.0}) == {} and det.check(12, {"loss/value_avg": 50.0})  # losses: at once


def test_gradient_norm_jumps_within_one_step_count_once():
    """PPO's update epochs over one rollout batch all meet its rare tokens: their jumps are one
    spike; a jump at the next step fires."""
    det = DivergenceDetector(factor=10.0, window=5, floor=1.0)
    for step in range(1, 6):
        assert det.check(step, {"train/actor_grad_norm": 0.5}) == {}
    assert det.check(6, {"train/actor_grad_norm": 27.0}) == {}  # update epoch 1 of step 6
    assert det.check(6, {"train/actor_grad_norm": 25.0}) == {}  # epoch 2, the same batch
    assert det.check(7, {"train/actor_grad_norm": 0.4}) == {}  # back to its level
    assert det.check(8, {"train/actor_grad_norm": 30.0}) == {}
    msg = det.check(9, {"train/actor_grad_norm": 31.0})["train/actor_grad_norm"]
    assert msg.startswith("step 9: train/actor_grad_norm = 31, 31x its recent level 1")


def weights_of(path):
    return {k: v.numpy() for k, v in paddle.load(os.path.join(path, "model_state.pdparams")).items()}


LR_1E3 = ["--learning_rate", "1e3", "--critic_learning_rate", "1e3", "--lr_scheduler_type", "constant", "--warmup_steps", "0"]


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_ppo_and_grpo_with_learning_rate_1e3_stop_at_once(estimator, tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """Finding 6: the run used to go on to max_steps and exit 0 with a destroyed policy."""
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / estimator)
    extra = (["--adv_estimator", "grpo", "--rollout_n", "2", "--per_device_prompt_batch_size", "4", "--normalize_advantage", "false"]
             if estimator == "grpo" else [])
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "6", "--save_steps", "1",
                                     "--kl_coeff", "0.1", *LR_1E3, *extra))
    with pytest.raises(DivergenceError, match=r"stopped: step (\d+): \S+ = .*x its recent level") as err:
        trainer.train()
    step = int(err.value.args[0].split("step ")[1].split(":")[0])
    assert step <= 2, err.value
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["steps"] == step and summary["diverged"]
    assert read_metrics(out)[-1]["step"] == step  # the diverged step is logged
    assert not os.path.isdir(os.path.join(out, f"checkpoint-{step}"))


def test_ppo_stops_where_it_diverges_keeping_the_last_good_checkpoint(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    """Two good steps (checkpoints 1 and 2), then the learning rate jumps to 1e3."""
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "later")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "6", "--save_steps", "1",
                                     "--save_total_limit", "5", "--lr_scheduler_type", "constant", "--warmup_steps", "0"))
    original = trainer.train_step

    def lr_jumps_after_step_2():
        if trainer.state.step == 2:
            for sched in (t.scheduler for t in trainer.learner.trained):
                sched.base_lr = sched.last_lr = 1e3
        return original()

    trainer.train_step = lr_jumps_after_step_2
    with pytest.raises(DivergenceError, match=r"stopped: step 3: .*the last good checkpoint is .*checkpoint-2"):
        trainer.train()
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-1", "checkpoint-2"]
    kept = weights_of(os.path.join(out, "policy"))
    last_good = weights_of(os.path.join(out, "checkpoint-2", "policy"))
    for k in kept:
        np.testing.assert_array_equal(kept[k], last_good[k], err_msg=k)


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_ppo_guard_can_only_warn(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "warn")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "4", "--learning_rate", "1e3",
                                     "--critic_learning_rate", "1e3", "--lr_scheduler_type", "constant", "--warmup_steps", "0",
                                     "--kl_coeff", "0.1", "--stop_on_divergence", "false"))
    handler = Collect()
    logging.getLogger("ppo").addHandler(handler)
    try:
        summary = trainer.train()
    finally:
        logging.getLogger("ppo").removeHandler(handler)
    assert summary["steps"] == 4 and summary["diverged"][0].startswith("step 1: ")
    assert any(m.startswith("the run is diverging: step 1: ") for m in handler.messages), handler.messages


def test_normal_ppo_run_does_not_fire(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "calm")
    summary = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "4")).train()
    assert summary["steps"] == 4 and "diverged" not in summary
    assert all(np.isfinite(r["train/actor_grad_norm"]) and r["train/actor_grad_norm"] > 0
               for r in read_metrics(out) if "objective/scores" in r)


def sft_argv(model_dir, data_dir, out, *extra):
    return ["config/tiny/sft_argument.json", "--model_name_or_path", model_dir,
            "--train_datasets", f"Jsonfile:1.0:{data_dir}/sft.jsonl", "--eval_datasets", f"Jsonfile:1.0:{data_dir}/test.jsonl",
            "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "10", "--per_device_train_batch_size", "8",
            "--logging_steps", "1", "--save_steps", "1", "--save_total_limit", "20", "--eval_steps", "100", "--warmup_steps", "0",
            "--lr_scheduler_type", "constant", "--disable_tqdm", "true", "--do_eval", "false",
            "--eval_with_do_generation", "false", *extra]


def test_sft_stops_on_divergence_keeping_the_last_checkpoint(tiny_model_dir, tiny_data_dir, tmp_path):
    from sft.run_sft import main as run_sft

    out = str(tmp_path / "sft")
    with pytest.raises(DivergenceError, match=r"step (\d+): (loss/sft|train/grad_norm)") as err:
        run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--learning_rate", "1e3", "--stop_on_divergence", "true"))
    step = int(err.value.args[0].split("step ")[1].split(":")[0])
    assert step < 10
    names = os.listdir(out)
    assert f"checkpoint-{step}" not in names and f"checkpoint-{step - 1}" in names
    assert "model_state.pdparams" not in names  # the diverged model is not saved as the result
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["diverged"] and summary["global_step"] == step


def test_dpo_warns_by_default_and_stops_when_asked(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpo.run_dpo import main as run_dpo

    def argv(out, *extra):
        return ["config/tiny/dpo_argument.json", "--model_name_or_path", tiny_model_dir,
                "--train_datasets", f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl", "--eval_datasets", "",
                "--eval_generation_datasets", "", "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "8",
                "--per_device_train_batch_size", "8", "--logging_steps", "1", "--learning_rate", "1e3", "--warmup_steps", "0",
                "--lr_scheduler_type", "constant", "--disable_tqdm", "true", "--do_eval", "false", *extra]

    out = str(tmp_path / "dpo_warn")
    summary = run_dpo(argv(out))
    assert summary["global_step"] == 8 and summary["diverged"]  # default: warn, record, go on
    out = str(tmp_path / "dpo_stop")
    with pytest.raises(DivergenceError, match=r"step \d+: (loss/total|train/grad_norm)"):
        run_dpo(argv(out, "--stop_on_divergence", "true"))


class HugeRewardClient:
    """A reward server stand-in whose scores are finite in Python but overflow float32."""

    url = "http://fake"

    def score(self, src, tgt, response):
        return [1e39 if i == 1 else 0.5 for i in range(len(src))]


def test_reward_beyond_float32_is_an_error_not_inf_metrics(tiny_model_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    from ppo.run_ppo import build_trainer

    out = str(tmp_path / "huge")
    trainer = build_trainer(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "1"))
    from ppo.trainer.scoring import RewardServerScorer

    trainer.experience.scoring.objectives[0].scorer = RewardServerScorer(trainer.experience.rollout.tokenizer, HugeRewardClient())
    with pytest.raises(ValueError, match=r"step 1: the reward server http://fake gave 1 of 8 scores that are not finite in float32 \(e.g. 1e\+39 for item 1"):
        trainer.train()
    assert not [r for r in read_metrics(out) if "objective/scores" in r]  # no inf metrics were written


def test_reward_model_training_warns_on_divergence(tiny_model_dir, tiny_data_dir, tmp_path):
    from rm.run_reward import main as run_rm

    out = str(tmp_path / "rm")
    summary = run_rm(["config/tiny/rm_argument.json", "--model_name_or_path", tiny_model_dir,
                      "--train_datasets", f"PKU-SafeRLHF/train:1.0:{tiny_data_dir}/preference.jsonl", "--eval_datasets", "",
                      "--output_dir", out, "--logging_dir", f"{out}/vdl", "--max_steps", "6", "--per_device_train_batch_size", "8",
                      "--logging_steps", "1", "--learning_rate", "1e3", "--warmup_steps", "0", "--lr_scheduler_type", "constant",
                      "--disable_tqdm", "true", "--do_eval", "false", "--save_strategy", "no"])
    assert summary["global_step"] == 6
    assert summary["diverged"] and all(m.startswith("step ") for m in summary["diverged"])
    assert any(("rm/loss" in m or "train/grad_norm" in m) for m in summary["diverged"])
