"""`scripts/evaluate_stages.py`: the same held-out evaluation for every stage's model, in parts
(`--stages`) joined with `--include` as the quickstart does, equal to one evaluation of all."""
import json
import os

import pytest

from scripts import evaluate_stages


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory, tiny_model_dir, tiny_rm_dir, two_layer_model_dir):
    """SFT and PPO's policy are one model, DPO another; GRPO never ran."""
    root = tmp_path_factory.mktemp("runs")
    os.makedirs(root / "ppo")
    os.symlink(tiny_model_dir, root / "sft")
    os.symlink(tiny_model_dir, root / "ppo" / "policy")
    os.symlink(two_layer_model_dir, root / "dpo")
    return root


def evaluate(runs_dir, tiny_rm_dir, tiny_data_dir, output, *flags):
    return evaluate_stages.main(["--runs_dir", str(runs_dir), "--test_data", os.path.join(tiny_data_dir, "test.jsonl"),
                                 "--reward_model", tiny_rm_dir, "--output", str(output), *flags])


def test_parts_joined_with_include_equal_one_evaluation_of_every_stage(runs_dir, tiny_rm_dir, tiny_data_dir, tmp_path):
    whole = evaluate(runs_dir, tiny_rm_dir, tiny_data_dir, tmp_path / "all.json")
    assert list(whole) == ["sft", "ppo", "dpo"]  # GRPO's policy is missing: skipped
    assert whole["sft"] == whole["ppo"] and whole["sft"] != whole["dpo"]  # the same model, another one
    part = evaluate(runs_dir, tiny_rm_dir, tiny_data_dir, tmp_path / "part.json", "--stages", "sft,grpo,dpo")
    assert list(part) == ["sft", "dpo"] and json.load(open(tmp_path / "part.json")) == part
    joined = evaluate(runs_dir, tiny_rm_dir, tiny_data_dir, tmp_path / "joined.json", "--stages", "ppo,online_dpo",
                      "--include", str(tmp_path / "part.json"))
    assert list(joined) == ["sft", "ppo", "dpo"] and joined == whole  # in the table's order
    assert json.load(open(tmp_path / "joined.json")) == json.load(open(tmp_path / "all.json"))


@pytest.mark.parametrize("flags, message", [
    (["--stages", "sft,rlhf"], "--stages: unknown ['rlhf']"),
    (["--include", "/no/such/evaluation.json"], "--include: /no/such/evaluation.json does not exist"),
])
def test_a_wrong_stage_or_include_is_one_clear_error(flags, message, runs_dir, tiny_rm_dir, tiny_data_dir, tmp_path,
                                                     capsys):
    with pytest.raises(SystemExit):
        evaluate(runs_dir, tiny_rm_dir, tiny_data_dir, tmp_path / "out.json", *flags)
    assert message in capsys.readouterr().err and not (tmp_path / "out.json").exists()
