"""Resume checks: a checkpoint of another model or algorithm is refused naming the difference
before anything loads (PPO and the Trainer stages), and a Trainer checkpoint saved without
optimizer states (`ignore_save_lr_and_optim`) resumes with a fresh optimizer."""
import json
import os

import pytest

from ppo.checkpoints.resume_check import CheckpointMismatchError, check_ppo_checkpoint, fact_differences, saved_model_facts
from ppo.run_ppo import main as run_ppo
from sft.run_sft import main as run_sft
from tests.test_ppo_trainer import ppo_argv
from tests.test_trainer_faults import sft_argv


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """The tiny Llama with hidden size 64 instead of 32 (same tokenizer)."""
    from ppo.tiny.factory import build_tiny

    path = str(tmp_path_factory.mktemp("wide_model"))
    build_tiny(path, seed=11, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64)
    return path


def rows(out):
    return [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]


def test_fact_differences_name_each_shape_and_lora_difference(tiny_model_dir, wide_model_dir):
    narrow, wide = saved_model_facts(tiny_model_dir), saved_model_facts(wide_model_dir)
    assert narrow["config"]["hidden_size"] == 32 and narrow["lora"] is None
    assert fact_differences(narrow, wide, "policy/") == ["policy/: hidden_size is 32 in the checkpoint but 64 in this run"]
    lora = {"config": {}, "lora": {"r": 8, "target_modules": ["q_proj"]}}
    assert fact_differences(lora, {"config": {}, "lora": {"r": 4, "target_modules": ["q_proj"]}}, "m") == [
        "m: LoRA r is 8 in the checkpoint but 4 in this run"]
    assert "use_lora" in fact_differences(lora, narrow, "m")[0]


def test_ppo_run_facts_differences_are_refused(tmp_path):
    path = str(tmp_path / "checkpoint-2")
    os.makedirs(os.path.join(path, "value"))
    state = {"run": {"adv_estimator": "gae", "use_critic": True}}
    with pytest.raises(CheckpointMismatchError, match=r"adv_estimator is gae in the checkpoint but grpo in this run; "
                                                        r"use_critic is True in the checkpoint but False in this run"):
        check_ppo_checkpoint(path, {"policy": None, "value": None}, {"adv_estimator": "grpo", "use_critic": False}, state)
    with pytest.raises(CheckpointMismatchError, match="has a value/ model"):  # an older checkpoint without "run"
        check_ppo_checkpoint(path, {"value": None}, {"use_critic": False}, {})


def test_ppo_resume_with_another_hidden_size_is_refused_even_without_optimizer_states(
        tiny_model_dir, tiny_rm_dir, tiny_data_dir, wide_model_dir, tmp_path):
    out = str(tmp_path / "ppo")
    common = ("--save_steps", "1", "--overwrite_output_dir", "false", "--ignore_save_lr_and_optim", "true")
    run_ppo(ppo_argv(tiny_model_dir, tiny_rm_dir, tiny_data_dir, out, *common))
    saved = json.load(open(os.path.join(out, "checkpoint-2", "trainer_state.json")))
    assert saved["run"] == {"adv_estimator": "gae", "use_critic": True, "cost_model": False}
    with pytest.raises(CheckpointMismatchError, match=r"checkpoint-2: .*policy/: hidden_size is 32 in the checkpoint but 64"):
        run_ppo(ppo_argv(wide_model_dir, tiny_rm_dir, tiny_data_dir, out, "--max_steps", "3", *common))
    assert [r["step"] for r in rows(out)] == [1, 2]  # nothing trained on


def test_sft_resume_with_another_hidden_size_is_refused(tiny_model_dir, tiny_data_dir, wide_model_dir, tmp_path):
    out = str(tmp_path / "sft")
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "2"))
    with pytest.raises(CheckpointMismatchError, match=r"checkpoint-2: .*model: hidden_size is 32 in the checkpoint but 64"):
        run_sft(sft_argv(wide_model_dir, tiny_data_dir, out, "--max_steps", "4"))
    assert [r["step"] for r in rows(out) if "loss/sft" in r] == [1, 2]


def test_sft_checkpoint_without_optimizer_states_resumes_with_a_fresh_optimizer(tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    out, straight = str(tmp_path / "resumed"), str(tmp_path / "straight")
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, straight, "--max_steps", "4"))
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "4", "--ignore_save_lr_and_optim", "true"))
    assert not os.path.exists(os.path.join(out, "checkpoint-2", "optimizer.pdopt"))
    import shutil

    for step in (3, 4):  # back to checkpoint-2, as after a crash at step 3
        shutil.rmtree(os.path.join(out, f"checkpoint-{step}"), ignore_errors=True)
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "4", "--ignore_save_lr_and_optim", "true"))
    assert "no optimizer states" in caplog.text and "fresh optimizer" in caplog.text
    resumed = {r["step"]: r for r in rows(out) if "loss/sft" in r}
    expected = {r["step"]: r for r in rows(straight) if "loss/sft" in r}
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in (3, 4):  # the learning-rate schedule continues where checkpoint-2 left it
        assert resumed[step]["lr"] == pytest.approx(expected[step]["lr"], rel=1e-6)
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["global_step"] == 4


def test_rerunning_a_finished_sft_run_changes_nothing(tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    out = str(tmp_path / "sft")
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "2"))
    before = open(os.path.join(out, "metrics.jsonl")).read()
    weights = open(os.path.join(out, "model_state.pdparams"), "rb").read()
    summary = run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "2"))
    assert "holds a finished run (step 2 of max_steps=2): nothing to train" in caplog.text
    assert open(os.path.join(out, "metrics.jsonl")).read() == before  # no extra step, no repeated rows
    assert open(os.path.join(out, "model_state.pdparams"), "rb").read() == weights
    assert summary is None or summary["global_step"] == 2


def test_tiny_configs_resume_when_the_same_command_runs_again():
    import glob

    for path in glob.glob(os.path.join(os.path.dirname(__file__), "..", "config", "tiny", "*.json")):
        assert json.load(open(path)).get("overwrite_output_dir", False) is False, path
