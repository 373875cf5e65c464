"""PaddleNLP `Trainer` callbacks that write the run traces (metrics.jsonl, summary.json, VisualDL).

The Trainer's own log names (`loss`, `learning_rate`, `eval_loss`, ...) are
mapped to the toolkit's slash names; names that already hold a slash pass
through unchanged.
"""
import logging
import math
import os

from paddlenlp.trainer import TrainerCallback

from ..checkpoints.checkpoint import rotate_checkpoints
from ..common.divergence import DivergenceDetector
from ..common.tracking import RunTracker, interval_weighted_mean

logger = logging.getLogger("ppo")

TRAINER_NAME_MAP = {"learning_rate": "lr", "epoch": "epoch", "global_step": None, "train_runtime": "timing_s/train"}


def rename_trainer_logs(logs, loss_name):
    """Map Trainer log keys to slash names; `loss` becomes `loss_name`."""
    out = {}
    for key, value in logs.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key == "loss":
            out[loss_name] = value
        elif key in TRAINER_NAME_MAP:
            if TRAINER_NAME_MAP[key]:
                out[TRAINER_NAME_MAP[key]] = value
        elif "/" in key:
            out[key] = value
        elif key.startswith("eval_"):
            out["eval/" + key[len("eval_"):]] = value
        elif key.startswith("train_"):
            out["train/" + key[len("train_"):]] = value
        else:
            out[key] = value
    return out


class TrackerCallback(TrainerCallback):
    """Append every Trainer log to `metrics.jsonl` (main process only)."""

    def __init__(self, output_dir, loss_name="loss/train"):
        self.output_dir = output_dir
        self.loss_name = loss_name
        self.tracker = None
        self.resuming = False  # set by the caller when `train` resumes from a checkpoint

    def on_train_begin(self, args, state, control, **kwargs):
        if self.tracker is None:
            resume = self.resuming or bool(args.resume_from_checkpoint)
            self.tracker = RunTracker(self.output_dir, use_visualdl=False, enabled=state.is_world_process_zero, resume=resume)
            if resume:
                self.tracker.truncate_after(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.tracker is None:
            self.on_train_begin(args, state, control)
        logs = logs or {}
        if self.resuming and "train_loss" in logs and self.tracker.enabled:  # the Trainer averages the resumed part only
            whole_run = interval_weighted_mean(self.tracker.metrics_path, self.loss_name)
            logs = dict(logs, train_loss=whole_run) if whole_run is not None else logs
        metrics = rename_trainer_logs(logs, self.loss_name)
        if metrics:
            self.tracker.log(metrics, step=state.global_step)


class CheckpointRotationCallback(TrainerCallback):
    """Keep the newest `save_total_limit` checkpoints by age after every save (the PaddleNLP
    Trainer rotates only in some parallel layouts); the best model checkpoint is kept."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero and args.save_total_limit:
            newest = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            rotate_checkpoints(args.output_dir, args.save_total_limit, keep=[newest, state.best_model_checkpoint])


def gradient_norm(model):
    """Global L2 norm of `model`'s gradients (one host sync); None when it has none."""
    import paddle

    grads = [p.grad for p in model.parameters() if not p.stop_gradient and p.grad is not None]
    if not grads:
        return None
    return math.sqrt(float(paddle.add_n([paddle.sum(paddle.square(g.astype("float32"))) for g in grads])))


class DivergenceCallback(TrainerCallback):
    """Warn when the loss or the gradient norm diverges (see `ppo.common.divergence`); with
    `stop_on_divergence`, stop training there without saving the diverged weights.

    The gradient norm (before clipping) is measured before every optimiser step and
    checked at once; the loss is checked at every log. `diverged` holds the messages.
    """

    def __init__(self, loss_name, factor=10.0, window=10, stop=False):
        self.loss_name = loss_name
        self.detector = DivergenceDetector(factor, window)
        self.stop = stop
        self.diverged = []

    def _judge(self, step, metrics, control):
        messages = [m for m in self.detector.check(step, metrics).values() if m not in self.diverged]
        for message in messages:
            logger.warning(f"the run is diverging: {message}")
        self.diverged.extend(messages)
        if messages and self.stop:
            control.should_training_stop = True
            control.should_save = False

    def on_optimizer_begin(self, args, state, control, model=None, **kwargs):
        norm = gradient_norm(model) if model is not None else None
        if norm is not None:
            self._judge(state.global_step + 1, {"train/grad_norm": norm}, control)

    def on_step_end(self, args, state, control, **kwargs):
        if self.diverged and self.stop:  # after the Trainer's own flow decided to save this step
            control.should_training_stop = True
            control.should_save = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            self._judge(state.global_step, {self.loss_name: logs["loss"]}, control)


class StopOnSignalCallback(TrainerCallback):
    """Honour a SIGTERM / SIGINT (`ppo.common.run_guard.StopRequest`) at the end of the step it
    arrived in: the Trainer saves a checkpoint there and stops; `stopped_at` holds that step."""

    def __init__(self, request):
        self.request = request
        self.stopped_at = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.request.should_stop(args.world_size):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
