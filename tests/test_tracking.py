"""Run traces: metrics.jsonl lines, summary final/best values, readable VisualDL logs."""
import json
import os

import pytest

from ppo.common.jsonl_trace import TraceFileError
from ppo.common.tracking import RunTracker, interval_weighted_mean, keep_rows_up_to


def test_metrics_summary_and_visualdl(tmp_path):
    tracker = RunTracker(str(tmp_path), logging_dir=str(tmp_path / "vdl"))
    tracker.log({"loss/policy_avg": 2.0, "eval/accuracy": 0.5}, step=1)
    tracker.log({"loss/policy_avg": 1.0, "eval/accuracy": 0.25}, step=2)
    summary = tracker.finish(tokens_per_s=10.0)
    lines = [json.loads(ln) for ln in open(tmp_path / "metrics.jsonl")]
    assert lines == [{"step": 1, "loss/policy_avg": 2.0, "eval/accuracy": 0.5}, {"step": 2, "loss/policy_avg": 1.0, "eval/accuracy": 0.25}]
    on_disk = json.load(open(tmp_path / "summary.json"))
    assert on_disk["final"] == {"loss/policy_avg": 1.0, "eval/accuracy": 0.25}
    assert on_disk["best"] == {"loss/policy_avg": 1.0, "eval/accuracy": 0.5}
    assert on_disk["tokens_per_s"] == 10.0 and summary["wall_time_s"] >= 0
    from visualdl import LogReader

    files = [f for f in os.listdir(tmp_path / "vdl") if f.startswith("vdlrecords")]
    reader = LogReader(file_path=str(tmp_path / "vdl" / files[0]))
    values = [r.value for r in reader.get_data("scalar", "eval/accuracy")]
    assert values == [0.5, 0.25]


def test_resume_truncates_repeated_steps(tmp_path):
    t = RunTracker(str(tmp_path), use_visualdl=False)
    for s in range(1, 5):
        t.log({"objective/scores": float(s)}, step=s)
    t2 = RunTracker(str(tmp_path), use_visualdl=False, resume=True)
    t2.truncate_after(2)
    t2.log({"objective/scores": 9.0}, step=3)
    steps = [json.loads(ln)["step"] for ln in open(tmp_path / "metrics.jsonl")]
    assert steps == [1, 2, 3]
    assert t2.best["objective/scores"] == 9.0


def test_torn_last_line_is_cut_off_with_a_warning_naming_the_file(tmp_path, caplog):
    t = RunTracker(str(tmp_path), use_visualdl=False)
    for s in range(1, 4):
        t.log({"objective/scores": float(s)}, step=s)
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 4, "objective/sco')  # a kill mid-write
    t2 = RunTracker(str(tmp_path), use_visualdl=False, resume=True)
    assert str(path) in caplog.text and "cut short" in caplog.text
    assert t2.final["objective/scores"] == 3.0
    t2.truncate_after(3)
    t2.log({"objective/scores": 7.0}, step=4)
    rows = [json.loads(ln) for ln in open(path)]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["objective/scores"] == 7.0


def test_samples_trace_with_torn_last_line_is_repaired_by_keep_rows(tmp_path, caplog):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"step": 1, "prompt": "a"}\n{"step": 2, "prompt": "b"}\n{"step": 3, "pro')
    assert keep_rows_up_to(str(path), 2) == 2
    assert "samples.jsonl" in caplog.text
    assert [json.loads(ln)["step"] for ln in open(path)] == [1, 2]


def test_complete_last_row_missing_its_newline_is_kept_and_appends_stay_separate(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss/x": 1.0}\n{"step": 2, "loss/x": 0.5}')
    t = RunTracker(str(tmp_path), use_visualdl=False, resume=True)
    t.log({"loss/x": 0.25}, step=3)
    assert [json.loads(ln)["step"] for ln in open(path)] == [1, 2, 3]
    assert t.best["loss/x"] == 0.25


def test_damaged_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(TraceFileError, match=r"metrics\.jsonl: line 2 "):
        RunTracker(str(tmp_path), use_visualdl=False, resume=True)
    assert interval_weighted_mean(str(tmp_path / "missing.jsonl"), "loss/x") is None


def test_interval_weighted_mean_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 2, "loss/train": 1.0}\n{"step": 4, "loss/train": 3.0}\n{"step": 6, "loss/tr')
    assert interval_weighted_mean(str(path), "loss/train") == 2.0
