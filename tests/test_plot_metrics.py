"""`scripts/plot_metrics.py`: every entry point's `metrics.jsonl` gives the panels its metrics
fill, and the drawn lines (the Figure's Line2D data and the `.lines.json` beside the PNG) are the
file's rows exactly; several runs share the panels; the quickstart's curves stage and its final
PPO figure write PNGs that match their runs. Synthetic traces in the shape each entry point writes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scripts import plot_metrics, quickstart
from tests.plot_checks import assert_figure_matches, assert_png_lines_match, expected_series, run_files_of

PPO_METRICS = ("objective/scores", "objective/kl", "objective/rlhf_reward", "objective/non_score_reward",
               "objective/entropy", "policy/approxkl_avg", "policy/clipfrac_avg", "policy/entropy_avg",
               "loss/policy_avg", "loss/value_avg", "response_length/mean", "timing_s/step", "lr", "episode")
EVAL_METRICS = ("eval/score", "eval/accuracy", "eval/accuracy_long", "eval/accuracy_short", "eval/response_length")


def write_rows(path, rows):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rl_run(path, steps=40, seed=0, eval_every=10):
    """A PPO/GRPO trace: one row per step, an evaluation row every `eval_every` steps (from step 0)."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps + 1):
        if step % eval_every == 0:
            rows.append({"step": step, **{m: float(rng.random()) for m in EVAL_METRICS}})
        if step:
            rows.append({"step": step, **{m: float(rng.normal()) for m in PPO_METRICS}})
    return write_rows(path, rows)


def trainer_run(path, train_metrics, eval_metrics, steps=12, seed=0):
    """An SFT/RM/DPO trace as the Trainer callback writes it: train rows, eval rows at the same
    steps, strings and a closing summary row (`train/loss`)."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, steps + 1):
        rows.append({"step": step, **{m: float(rng.normal()) for m in train_metrics}, "lr": 1e-3 / step,
                     "progress_or_epoch": step / steps})
        if step % 4 == 0:
            rows.append({"step": step, **{m: float(rng.random()) for m in eval_metrics}})
    rows.append({"step": steps, "train/loss": 0.5, "timing_s/train": 3.0, "note": "a string is not drawn"})
    return write_rows(path, rows)


def sft_run(path, seed=0):
    return trainer_run(path, ["loss/sft"], ["eval/loss", "eval/accuracy", "eval/accuracy_long", "eval/accuracy_short"],
                       seed=seed)


def rm_run(path, seed=0):
    return trainer_run(path, ["rm/loss"], ["rm/accuracy", "rm/margin", "rm/eval_loss"], seed=seed)


def dpo_run(path, seed=0):
    return trainer_run(path, ["loss/total", "loss/dpo", "loss/sft", "rewards/chosen", "rewards/rejected",
                              "rewards/margins", "rewards/accuracies", "logps/chosen"],
                       ["eval/loss", "eval/preference_accuracy", "eval/accuracy"], seed=seed)


RUNS = {
    "ppo": (rl_run, {"reward", "KL", "loss", "entropy", "clip fraction", "evaluation accuracy", "evaluation score",
                     "response length", "learning rate"}),
    "sft": (sft_run, {"loss", "evaluation accuracy", "evaluation loss", "learning rate"}),
    "rm": (rm_run, {"loss", "evaluation accuracy", "evaluation score", "evaluation loss", "learning rate"}),
    "dpo": (dpo_run, {"reward", "loss", "preference accuracy (training)", "evaluation accuracy", "evaluation loss",
                      "learning rate"}),
}


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_each_entry_point_gets_its_panels_with_exactly_its_rows(kind, tmp_path):
    make, panels = RUNS[kind]
    run = make(str(tmp_path / kind))
    fig = plot_metrics.plot_runs({kind: plot_metrics.read_metrics(run)}, str(tmp_path / "out.png"))
    titles = assert_figure_matches(fig, {kind: f"{run}/metrics.jsonl"})
    assert set(titles) == panels
    assert_png_lines_match(str(tmp_path / "out.png"), {kind: f"{run}/metrics.jsonl"})
    if kind == "ppo":  # the named metrics land in their panels; evaluation rows only where they were logged
        assert set(titles["KL"]) == {"objective/kl", "policy/approxkl_avg"}
        assert set(titles["entropy"]) == {"objective/entropy", "policy/entropy_avg"}
        evaluation = next(a for a in fig.axes if a.get_title() == "evaluation accuracy").get_lines()[0]
        assert list(evaluation.get_xdata()) == [0, 10, 20, 30, 40]


def test_the_command_line_writes_the_png_beside_the_run_and_compares_several(tmp_path, capsys):
    ppo, grpo = rl_run(str(tmp_path / "ppo"), seed=1), rl_run(str(tmp_path / "grpo"), steps=25, seed=2)
    (written,) = plot_metrics.main([ppo])
    assert written == os.path.join(ppo, "metrics.png")
    assert_png_lines_match(written, {"ppo": f"{ppo}/metrics.jsonl"})
    (both,) = plot_metrics.main([ppo, grpo, "--output", str(tmp_path / "cmp.png"), "--title", "PPO vs GRPO"])
    drawn = assert_png_lines_match(both, run_files_of(str(tmp_path), ["ppo", "grpo"]))
    kl = next(p for p in drawn["panels"] if p["title"] == "KL")
    assert {(line["run"], line["metric"]) for line in kl["lines"]} == {
        (r, m) for r in ("ppo", "grpo") for m in ("objective/kl", "policy/approxkl_avg")}
    assert [len(line["step"]) for line in kl["lines"]] == [40, 40, 25, 25]
    fig = plot_metrics.plot_runs({"ppo": plot_metrics.read_metrics(ppo), "grpo": plot_metrics.read_metrics(grpo)},
                                 str(tmp_path / "again.png"))
    assert_figure_matches(fig, run_files_of(str(tmp_path), ["ppo", "grpo"]))
    assert "cmp.lines.json" in capsys.readouterr().out


def test_runs_with_one_directory_name_are_told_apart_by_their_parents(tmp_path):
    a, b = rl_run(str(tmp_path / "seed42" / "ppo")), rl_run(str(tmp_path / "seed43" / "ppo"), seed=3)
    assert plot_metrics.run_labels([a, b]) == ["seed42/ppo", "seed43/ppo"]
    (written,) = plot_metrics.main([a, b])
    assert written == str(tmp_path / "metrics_comparison.png")
    assert_png_lines_match(written, {"seed42/ppo": f"{a}/metrics.jsonl", "seed43/ppo": f"{b}/metrics.jsonl"})


def test_chosen_metrics_one_panel_each_and_clear_errors(tmp_path, capsys):
    run = dpo_run(str(tmp_path / "dpo"))
    (written,) = plot_metrics.main([run, "--metrics", "rewards/margins,logps/chosen"])
    drawn = json.load(open(plot_metrics.sidecar_path(written)))
    assert [p["title"] for p in drawn["panels"]] == ["rewards/margins", "logps/chosen"]
    line = drawn["panels"][1]["lines"][0]
    assert (line["step"], line["value"]) == expected_series(f"{run}/metrics.jsonl", "logps/chosen")
    for argv, message in (([run, "--metrics", "objective/kl"], "no run logged ['objective/kl']"),
                          ([str(tmp_path / "missing")], "no metrics.jsonl"),
                          ([run, run], "two runs share a label")):
        with pytest.raises(SystemExit) as stop:
            plot_metrics.main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_torn_last_line_is_left_out_and_the_file_kept(tmp_path):
    run = sft_run(str(tmp_path / "sft"))
    path = f"{run}/metrics.jsonl"
    whole = open(path).read()
    with open(path, "a") as f:
        f.write('{"step": 13, "loss/sft": 0.')
    rows = plot_metrics.read_metrics(run)
    assert rows == [json.loads(line) for line in whole.splitlines()]
    assert open(path).read().endswith('"loss/sft": 0.')  # plotting never rewrites a run's trace


def test_the_quickstart_draws_every_stage_beside_its_table(tmp_path, capsys):
    """The `curves` stage's command (run as the scheduler runs it) and the final PPO figure."""
    root = str(tmp_path / "tiny")
    for name, make in (("sft", sft_run), ("rm", rm_run), ("grpo", rl_run), ("dpo", dpo_run), ("ppo", rl_run)):
        make(os.path.join(root, name), seed=len(name))
    (stage,) = [s for s in quickstart.pipeline_stages(root, None) if s.name == "curves"]
    assert stage.deps == ("sft", "rm", "grpo", "dpo")
    subprocess.run(stage.cmd, cwd=quickstart.ROOT, check=True, capture_output=True)
    quickstart.print_curves(root, root, ("sft", "rm", "ppo", "grpo", "dpo"))
    assert "curves/: sft.png, rm.png, ppo.png, grpo.png, dpo.png" in capsys.readouterr().out
    for name in ("sft", "rm", "grpo", "dpo", "ppo"):
        drawn = assert_png_lines_match(os.path.join(root, "curves", f"{name}.png"), run_files_of(root, [name]))
        assert drawn["runs"] == [name]


def test_help_names_the_options_without_importing_matplotlib():
    out = subprocess.run([sys.executable, "-c", "import sys; from scripts import plot_metrics\n"
                          "try:\n    plot_metrics.main(['--help'])\nexcept SystemExit:\n    pass\n"
                          "print('matplotlib' in sys.modules)"], cwd=quickstart.ROOT, capture_output=True, text=True)
    assert "--output_dir" in out.stdout and out.stdout.strip().endswith("False")
    installed = subprocess.run([sys.executable, "-m", "ppo.cli", "plot-metrics", "--help"], cwd="/", capture_output=True,
                               text=True, env=dict(os.environ, PYTHONPATH=quickstart.ROOT))  # paddle-align plot-metrics
    assert installed.returncode == 0 and "--output_dir" in installed.stdout
