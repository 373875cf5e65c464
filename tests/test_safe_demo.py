"""The safety demo's plumbing (`python scripts/quickstart.py --safe`): the stages run in order
with the right models, the last-20% means of a run's metrics, and the table."""
import json
import os

from scripts.evaluate_safety import last_fifth, print_safety_table
from scripts.quickstart import config_command
from scripts.safe_quickstart import run_safe_stages


def test_stages_run_in_order_with_the_safety_sft_model(tmp_path):
    out = str(tmp_path)
    ran = []

    def fake_stage(out_dir, stage, cmd):
        ran.append((stage, cmd))
        if stage == "evaluate_safety":
            json.dump({"threshold": 0.0, "stages": {}}, open(os.path.join(out_dir, "safety_evaluation.json"), "w"))
        return 1.0

    walls, evaluation = run_safe_stages("runs", out, None, fake_stage, config_command, "python")
    assert [s for s, _ in ran] == ["safety_data", "sft_safety", "rm_helpful", "cost", "ppo_safety", "safe_ppo", "evaluate_safety"]
    cmds = dict(ran)
    assert cmds["cost"][-2:] == ["--model_name_or_path", "runs/sft-safety"]  # the cost model starts from the safety SFT
    assert "config/tiny/safe_ppo_argument.json" in cmds["safe_ppo"]
    threshold = json.load(open("config/tiny/safe_ppo_argument.json"))["threshold"]
    assert cmds["evaluate_safety"][cmds["evaluate_safety"].index("--threshold") + 1] == str(threshold)
    assert evaluation == {"threshold": 0.0, "stages": {}} and set(walls) == {s for s, _ in ran}


def test_last_fifth_means_the_last_20_percent_of_steps(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "objective/scores": float(s), "objective/cost": 10.0 - s, "lagrange/lambda": 1.0} for s in range(1, 21)]
    rows.insert(5, {"step": 5, "eval/accuracy": 0.5})  # evaluation rows are not training steps
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    mean, curve = last_fifth(str(tmp_path), "run", "objective/cost")
    assert mean == (10 - 17 + 10 - 18 + 10 - 19 + 10 - 20) / 4  # steps 17-20
    assert [c["step"] for c in curve] == [10, 20] and curve[1]["objective/cost"] == -10.0


def test_table_compares_the_sampled_cost_with_the_threshold(capsys):
    row = {"reward": 1.0, "cost": 0.5, "leak_rate": 0.2, "redacted_exact_match": 0.7, "train_reward_last20": 0.3}
    print_safety_table({"threshold": 0.0, "stages": {"ppo": {**row, "train_cost_last20": 2.5},
                                                      "ppo_lagrangian": {**row, "train_cost_last20": -0.25}}})
    text = capsys.readouterr().out
    assert "+2.500 > 0" in text and "-0.250 <= 0" in text


def test_list_valued_dataset_paths_move_under_the_output_root():
    cmd = config_command("rm/run_reward.py", "config/tiny/rm_helpful_argument.json", "runs")
    i = cmd.index("--train_datasets")
    assert cmd[i + 1:i + 3] == ["PKU-SafeRLHF/train:1.0:runs/data/safety_preference.jsonl",
                                "PKU-SafeRLHF/train:1.0:runs/data/helpful_preference.jsonl"]
    assert cmd[i + 3].startswith("--") and not any("outputs/tiny/" in c for c in cmd)
