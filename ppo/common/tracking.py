"""Machine-readable run traces: `metrics.jsonl`, `summary.json` and VisualDL / W&B / TensorBoard logs.

Every training entry point logs through one `RunTracker`, on the main process
only. `metrics.jsonl` holds one JSON object per logged step; `summary.json`
holds the final value of every metric, the best value (minimum for names that
contain `loss`, maximum otherwise), wall time and whatever the caller adds.
"""
import json
import math
import os
import time

from .jsonl_trace import append_rows, read_rows, write_rows


def keep_rows_up_to(path, step):
    """Drop the rows of the JSON-lines file `path` whose `step` is after `step` (a resumed
    run logs them again); a file that does not exist is left alone. Returns the kept count."""
    if not os.path.exists(path):
        return 0
    kept = [row for row in read_rows(path) if row.get("step", 0) <= step]
    write_rows(path, kept)
    return len(kept)


def interval_weighted_mean(path, name):
    """Mean of `name` over all steps, from the JSON-lines file `path` whose rows each hold the
    average since the previous row (as Trainer logs do): sum(v_i * (step_i - step_{i-1})) / last step.
    None when no row has `name`."""
    total, prev = 0.0, 0
    for row in read_rows(path, repair=False):
        if name in row and row["step"] > prev:
            total += row[name] * (row["step"] - prev)
            prev = row["step"]
    return total / prev if prev else None


def is_lower_better(name):
    return "loss" in name


def to_float(value):
    """A python float from a number, numpy scalar or one-element paddle tensor."""
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


class RunTracker:
    """Append metrics to `output_dir/metrics.jsonl` and to the `report_to` dashboards under `logging_dir`."""

    def __init__(self, output_dir, logging_dir=None, use_visualdl=True, enabled=True, resume=False, run_name=None, report_to=None):
        """`report_to` (default: visualdl when `use_visualdl`): the dashboards each row also goes to
        (`ppo.common.report_writers`: visualdl, wandb, tensorboard)."""
        self.output_dir = output_dir
        self.run_name = run_name  # PaddleNLP's run_name: VisualDL's display name and summary.json "run_name"
        self.enabled = enabled
        self.start_time = time.time()
        self.final, self.best = {}, {}
        self.writer = None
        if not enabled:
            return
        os.makedirs(output_dir, exist_ok=True)
        self.metrics_path = os.path.join(output_dir, "metrics.jsonl")
        if resume and os.path.exists(self.metrics_path):
            self._reload()
        else:
            open(self.metrics_path, "w").close()
        from .report_writers import ReportWriters

        report_to = (["visualdl"] if use_visualdl else []) if report_to is None else report_to
        self.writer = ReportWriters(report_to, logging_dir or os.path.join(output_dir, "visualdl"), run_name)

    def _reload(self):
        """On resume, keep earlier lines (a torn last line is cut off) and recover final/best values."""
        for record in read_rows(self.metrics_path):
            self._remember({k: v for k, v in record.items() if k != "step"})

    def truncate_after(self, step):
        """Drop lines logged after `step` (a resumed run repeats them)."""
        if not self.enabled:
            return
        keep_rows_up_to(self.metrics_path, step)
        self.final, self.best = {}, {}
        self._reload()

    def _remember(self, metrics):
        for name, value in metrics.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                continue
            self.final[name] = value
            better = min if is_lower_better(name) else max
            self.best[name] = better(self.best.get(name, value), value)

    def log(self, metrics, step):
        """Record `metrics` (name -> number) for `step`; returns the written record."""
        record = {"step": int(step)}
        for name, value in metrics.items():
            record[name] = value if isinstance(value, (str, bool)) else to_float(value)
        if not self.enabled:
            return record
        append_rows(self.metrics_path, [record])
        self._remember({k: v for k, v in record.items() if k != "step"})
        if self.writer is not None:
            self.writer.write(record, step)
        return record

    def finish(self, **extra):
        """Write `summary.json` and close VisualDL; returns the summary dict."""
        summary = {"final": dict(self.final), "best": dict(self.best), "wall_time_s": time.time() - self.start_time}
        if self.run_name:
            summary["run_name"] = self.run_name
        summary.update(extra)
        if self.enabled:
            with open(os.path.join(self.output_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2, sort_keys=True)
            if self.writer is not None:
                self.writer.close()
        return summary
