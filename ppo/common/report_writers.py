"""`report_to` writers of the PPO/GRPO loop besides `metrics.jsonl`: VisualDL, Weights & Biases
and TensorBoard, each through its library's own writer, all with the same metric names.

- `visualdl`: `visualdl.LogWriter` under `logging_dir`;
- `wandb`: `wandb.init(dir=logging_dir, project=$WANDB_PROJECT or "paddle-align")` and
  `run.log(metrics, step=step)` (PaddleNLP's `WandbCallback` uses the same calls);
  `WANDB_MODE=offline` writes the run under `logging_dir/wandb/` without a network;
- `tensorboard`: TensorBoard's own `EventFileWriter` (the `tensorboard` package, no TensorFlow)
  writing scalar summaries under `logging_dir`.

The packages are optional: `missing_report_packages` names the pip package of every `report_to`
entry that is not installed, so a run stops before any model loads. SFT, RM and DPO report
through PaddleNLP's Trainer integrations instead (`visualdl`, `wandb`, and `tensorboard`, which
PaddleNLP writes with the `tensorboardX` package).
"""
import importlib.util
import math
import os
import time

LOOP_PACKAGES = {"visualdl": "visualdl", "wandb": "wandb", "tensorboard": "tensorboard"}
"""`report_to` name -> the pip package the PPO/GRPO loop's writer needs."""
TRAINER_PACKAGES = {"visualdl": "visualdl", "wandb": "wandb", "tensorboard": "tensorboardX"}
"""`report_to` name -> the pip package PaddleNLP's Trainer integration needs (SFT, RM, DPO)."""


def missing_report_packages(report_to, packages=LOOP_PACKAGES):
    """Problems (one string each) for the `report_to` names whose package is not installed."""
    problems = []
    for name in report_to:
        package = packages.get(name)
        if package and importlib.util.find_spec(package) is None:
            problems.append(f"report_to {name} needs the {package} package: pip install {package}")
    return problems


class VisualDLWriter:
    def __init__(self, logging_dir, run_name):
        from visualdl import LogWriter

        self.writer = LogWriter(logdir=logging_dir, display_name=run_name or "")

    def write(self, scalars, step):
        for name, value in scalars.items():
            self.writer.add_scalar(tag=name, value=value, step=step)

    def close(self):
        self.writer.close()


class WandbWriter:
    def __init__(self, logging_dir, run_name):
        import wandb

        os.makedirs(logging_dir, exist_ok=True)
        self.run = wandb.init(project=os.getenv("WANDB_PROJECT", "paddle-align"), name=run_name, dir=logging_dir,
                              reinit="finish_previous")

    def write(self, scalars, step):
        self.run.log(dict(scalars), step=step)

    def close(self):
        self.run.finish()


class TensorBoardWriter:
    def __init__(self, logging_dir, run_name):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(logging_dir)  # run_name (PaddleNLP: output_dir by default) is a path, not a file suffix

    def write(self, scalars, step):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=name, simple_value=value) for name, value in scalars.items()]
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))

    def close(self):
        self.writer.close()


WRITERS = {"visualdl": VisualDLWriter, "wandb": WandbWriter, "tensorboard": TensorBoardWriter}


class ReportWriters:
    """The writers of `report_to` (names outside `WRITERS`, e.g. `none`, write nothing)."""

    def __init__(self, report_to, logging_dir, run_name=None):
        problems = missing_report_packages(report_to)
        if problems:
            raise ImportError("; ".join(problems))
        self.writers = [WRITERS[name](logging_dir, run_name) for name in dict.fromkeys(report_to) if name in WRITERS]

    def write(self, record, step):
        """Every finite float of `record` (the metrics.jsonl row, `step` left out) as a scalar."""
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, float) and math.isfinite(v)}
        for writer in self.writers:
            writer.write(scalars, int(step))

    def close(self):
        for writer in self.writers:
            writer.close()
