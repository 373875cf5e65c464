"""What a run prints for a person: one line per logging step with the metrics of `metrics.jsonl`,
the evaluation table, and a closing summary naming where the model, checkpoint, metrics.jsonl and
VisualDL logs are; the progress bar names the algorithm (grpo, not ppo)."""
import json
import os
import re
import sys

from ppo.common.console_report import closing_summary, evaluation_table, number, output_paths, run_label, step_line
from tests import warm_python
from tests.test_grpo import grpo_argv
from tests.test_reward_server import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRPO_LINE_METRICS = ("objective/scores", "objective/kl", "loss/policy_avg", "loss/kl", "policy/entropy_avg",
                     "policy/clipfrac_avg", "lr", "response_length/mean")


def test_lines_are_the_logged_numbers_under_their_names():
    metrics = {"objective/scores": 0.625, "objective/kl": 0.00021, "lr": 1.5e-4, "loss/policy_avg": -0.0134, "other": 3.0}
    assert step_line(3, 130, metrics) == (
        "step 3/130 | objective/scores 0.625 | objective/kl 2.10e-04 | loss/policy_avg -0.0134 | lr 1.50e-04")
    assert evaluation_table(10, {"eval/score": 0.5, "eval/accuracy": 0.95}) == (
        "evaluation at step 10:\n  eval/accuracy  0.95\n  eval/score     0.5")
    assert [number(v) for v in (0, 1234567.0, -2.5e-5, 0.1234567)] == ["0", "1.235e+06", "-2.50e-05", "0.1235"]
    assert [run_label(e) for e in ("gae", "grpo", "rloo", "reinforce_pp")] == ["ppo", "grpo", "rloo", "reinforce_plus_plus"]
    assert run_label("gae", lagrangian=True) == "ppo-lagrangian"


def test_closing_summary_names_the_outputs_that_exist(tmp_path):
    out = tmp_path / "run"
    for sub in ("policy", "checkpoint-2", "checkpoint-10", "vdl"):
        (out / sub).mkdir(parents=True)
    for name in ("metrics.jsonl", "summary.json"):
        (out / name).write_text("")
    paths = output_paths(str(out), str(out / "vdl"), ["visualdl"], [("policy model", "policy"), ("value model", "value")])
    summary = {"final": {"eval/accuracy": 0.97, "objective/scores": 0.5, "timing_s/step": 0.4}, "steps": 10,
               "wall_time_s": 61.2, "best_policy": {"step": 8, "metric": "eval/accuracy", "value": 0.98}}
    assert closing_summary("grpo finished", summary, paths).splitlines() == [
        "grpo finished: 10 steps in 61 s",
        "  final:  eval/accuracy 0.97 | objective/scores 0.5",
        "  best:   step 8 (eval/accuracy 0.98), restored for the final save",
        f"  policy model:    {out}/policy",
        f"  last checkpoint: {out}/checkpoint-10",
        f"  metrics:         {out}/metrics.jsonl",
        f"  summary:         {out}/summary.json",
        f"  VisualDL logs:   {out}/vdl",
        f"  watch:           visualdl --logdir {out}/vdl",
    ]


def test_a_grpo_run_prints_a_line_per_logging_step_the_evaluation_and_where_it_wrote(tiny_model_dir, tiny_data_dir, tmp_path):
    out = str(tmp_path / "grpo")
    server = ServerProcess("--scorer", "reverse", "--threads", "4")
    try:
        argv = grpo_argv(tiny_model_dir, tiny_data_dir, out, server.url, "--max_steps", "4", "--logging_steps", "2",
                         "--evaluation_strategy", "steps", "--eval_steps", "2", "--disable_tqdm", "false",
                         "--report_to", "visualdl")
        done = warm_python.run([sys.executable, "ppo/run_ppo.py", *argv], cwd=ROOT, capture_output=True, text=True,
                               timeout=600, env=dict(os.environ, MKL_DEBUG_CPU_TYPE="5"))
    finally:
        server.cleanup()
    assert done.returncode == 0, done.stderr[-3000:]
    console = (done.stdout + done.stderr).replace("\r", "\n")
    steps = re.findall(r"step (\d+)/4 \| (.*)", console)
    assert [s for s, _ in steps] == ["2", "4"]  # logging_steps 2: steps 2 and 4
    logged = [r for r in map(json.loads, open(f"{out}/metrics.jsonl")) if "objective/scores" in r]
    for (step, line), row in zip(steps, logged):
        shown = dict(part.rsplit(" ", 1) for part in line.strip().split(" | "))
        assert int(step) == row["step"] and set(GRPO_LINE_METRICS) <= set(shown), line
        assert all(shown[name] == number(row[name]) for name in shown), (shown, row)
    for step in (0, 2, 4):
        assert re.search(rf"evaluation at step {step}:\n  eval/accuracy +[0-9.]+\n", console), console[-3000:]
    assert "grpo:" in console and "ppo:" not in console  # the progress bar's name
    closing = done.stdout[done.stdout.index("grpo finished: 4 steps"):].splitlines()
    assert f"  policy model:    {out}/policy" in closing and f"  metrics:         {out}/metrics.jsonl" in closing
    assert f"  VisualDL logs:   {out}/vdl" in closing and f"  summary:         {out}/summary.json" in closing
    assert "{'eval/accuracy'" not in done.stdout  # no bare dict at the end


def test_a_trainer_run_ends_with_where_it_wrote(tiny_model_dir, tiny_data_dir, tmp_path, capsys):
    from sft.run_sft import main as run_sft
    from tests.test_trainer_faults import sft_argv

    out = str(tmp_path / "sft")
    run_sft(sft_argv(tiny_model_dir, tiny_data_dir, out, "--max_steps", "2", "--save_steps", "2"))
    printed = capsys.readouterr().out
    closing = printed[printed.index("SFT finished: 2 steps"):].splitlines()
    assert closing[1].startswith("  final:  ") and "loss/sft " in closing[1]
    for line in (f"  model:           {out}", f"  last checkpoint: {out}/checkpoint-2", f"  metrics:         {out}/metrics.jsonl",
                 f"  VisualDL logs:   {out}/vdl"):
        assert line in closing, closing
