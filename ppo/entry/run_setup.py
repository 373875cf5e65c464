"""Train / save / evaluate / summarise for the `Trainer`-based entry points (SFT, RM, DPO)."""
import json
import logging
import os

from ..checkpoints.checkpoint import clear_previous_run, last_complete_trainer_checkpoint
from ..strategy import build_strategy
from ..common.console_report import closing_summary, output_paths
from ..common.divergence import DivergenceError
from ..checkpoints.resume_check import check_model_checkpoint
from ..common.tracking import interval_weighted_mean
from .benchmark import REPORT_FILE, BenchmarkCallback
from .trainer_resume import saved_global_step
from ..common.run_guard import RunInterrupted, interrupted_message, stop_requests
from .trainer_callbacks import (
    CheckpointRotationCallback, DivergenceCallback, StopOnSignalCallback, TrackerCallback, rename_trainer_logs,
)

logger = logging.getLogger("ppo")


def last_checkpoint(args):
    """The checkpoint to resume from: `resume_from_checkpoint` if set, else the newest complete
    `checkpoint-*` in `output_dir` (unless `overwrite_output_dir`), else None. A checkpoint
    cut short by a kill is skipped with a warning (see `ppo.checkpoints.checkpoint.incomplete_reason`)."""
    if args.resume_from_checkpoint:
        return args.resume_from_checkpoint
    if os.path.isdir(args.output_dir) and not args.overwrite_output_dir:
        return last_complete_trainer_checkpoint(args.output_dir, need_optimizer=not args.ignore_save_lr_and_optim)
    return None


def has_eval_data(trainer):
    return trainer.eval_dataset is not None or getattr(trainer, "eval_prompt_dataset", None) is not None


def _barrier():
    import paddle.distributed as dist

    if dist.get_world_size() > 1:
        dist.barrier()


def raise_interrupted(trainer, tracker_cb, request, step, output_dir):
    """After a run stopped on a signal (its checkpoint saved): write `summary.json`, raise RunInterrupted."""
    tracker_cb.tracker.finish(global_step=trainer.state.global_step, interrupted=request.signal_name)
    raise RunInterrupted(interrupted_message(request, step, os.path.join(output_dir, f"checkpoint-{step}")), request.signum)


def finished_summary(args, checkpoint):
    """The `summary.json` of a run in `output_dir` that already trained to `max_steps` (its newest
    checkpoint at that step, its final model and summary written); None otherwise."""
    path = os.path.join(args.output_dir, "summary.json")
    if checkpoint is None or args.max_steps <= 0 or saved_global_step(checkpoint) < args.max_steps or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    if summary.get("global_step", 0) < args.max_steps or "interrupted" in summary or summary.get("diverged"):
        return None
    return summary


def train_or_resume(trainer, args, tracker_cb, guard, checkpoint):
    """`trainer.train`, resuming from `checkpoint`; returns the train metrics. A checkpoint already
    at `max_steps` (a run that stopped before its final save) is loaded without training (the
    Trainer would train one step more). Raises RunInterrupted after a SIGTERM / SIGINT save and
    DivergenceError when the divergence guard stopped the run."""
    tracker_cb.resuming = checkpoint is not None
    if checkpoint is not None and 0 < args.max_steps <= saved_global_step(checkpoint):
        logger.warning(f"{checkpoint} is already at max_steps={args.max_steps}: loading it without training")
        trainer._load_from_checkpoint(checkpoint)
        trainer.state.global_step = saved_global_step(checkpoint)
        return {}
    with stop_requests() as request:  # SIGTERM / SIGINT: save at the end of the step, then stop
        stopper = StopOnSignalCallback(request)
        trainer.add_callback(stopper)
        result = trainer.train(resume_from_checkpoint=checkpoint)
    if stopper.stopped_at is not None:
        raise_interrupted(trainer, tracker_cb, request, stopper.stopped_at, args.output_dir)
    train_metrics = dict(result.metrics)
    if checkpoint is not None and tracker_cb.tracker.enabled:  # the Trainer averages the resumed part only
        whole_run = interval_weighted_mean(tracker_cb.tracker.metrics_path, tracker_cb.loss_name)
        if whole_run is not None:
            train_metrics["train_loss"] = whole_run
    if guard.diverged and args.stop_on_divergence:
        kept = last_complete_trainer_checkpoint(args.output_dir, need_optimizer=not args.ignore_save_lr_and_optim)
        tracker_cb.tracker.finish(
            train=rename_trainer_logs(train_metrics, tracker_cb.loss_name), global_step=trainer.state.global_step,
            diverged=guard.diverged,
        )
        where = f"the last good checkpoint is {kept}" if kept else "no checkpoint was saved before it"
        raise DivergenceError(f"stopped: {'; '.join(guard.diverged)}; {where} (stop_on_divergence=False lets the run go on)")
    return train_metrics


def finish_trainer_run(trainer, args, tokenizer):
    """Train (resuming when a complete checkpoint exists; a fresh run with `overwrite_output_dir`
    first removes the old run's checkpoints), save model and tokenizer, run a final evaluation
    when there is eval data, and write `summary.json`. Returns the summary. A run that already
    finished in `output_dir` is left as it is (its summary returned, nothing retrained).
    `benchmark` (PaddleNLP's name) trains from scratch only: no checkpoint, no model, no
    evaluation, and the timing report `benchmark.json` (`ppo.entry.benchmark`).

    When the divergence guard stopped the run (`stop_on_divergence`), nothing is saved over
    the last checkpoint: `summary.json` names the divergence and DivergenceError is raised."""
    tracker_cb = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, TrackerCallback))
    guard = DivergenceCallback(tracker_cb.loss_name, args.divergence_factor, args.divergence_window, args.stop_on_divergence)
    trainer.add_callback(guard)
    trainer.add_callback(CheckpointRotationCallback())
    if getattr(args, "benchmark", False):
        logger.info(f"benchmark: trains only (no evaluation, checkpoints or final model); the timing report goes to "
                    f"{os.path.join(args.output_dir, REPORT_FILE)}")
        trainer.add_callback(BenchmarkCallback(args.output_dir, getattr(tokenizer, "pad_token_id", None)))
    train_metrics = {}
    if not args.do_train:
        logger.warning("do_train is false: this run only evaluates (do_eval); nothing is trained or saved")
    if args.do_train:
        done, train_metrics = train_and_save(trainer, args, tokenizer, tracker_cb, guard)
        if done is not None:
            return done
    benchmark = getattr(args, "benchmark", False)
    eval_metrics = trainer.evaluate() if has_eval_data(trainer) and not benchmark else {}
    if tracker_cb.tracker is None:
        tracker_cb.on_train_begin(args, trainer.state, trainer.control)
    extra = {"diverged": guard.diverged} if guard.diverged else {}
    summary = tracker_cb.tracker.finish(
        final_eval=rename_trainer_logs(eval_metrics, "eval/loss"),
        train=rename_trainer_logs(train_metrics, "train/loss"),
        global_step=trainer.state.global_step,
        **extra,
    )
    if trainer.is_world_process_zero():
        print(trainer_closing_text(trainer, args, summary), flush=True)
    return summary


def train_and_save(trainer, args, tokenizer, tracker_cb, guard):
    """`(summary of a run already finished in output_dir or None, train metrics)`: resume or train,
    then save model, tokenizer and state (a benchmark run neither resumes nor saves)."""
    benchmark = getattr(args, "benchmark", False)
    checkpoint = None if benchmark else last_checkpoint(args)
    if checkpoint is not None:  # another model's checkpoint is refused before anything loads
        check_model_checkpoint(checkpoint, trainer.model)
    done = finished_summary(args, checkpoint)
    if done is not None:
        logger.warning(f"{args.output_dir} holds a finished run (step {done['global_step']} of max_steps="
                       f"{args.max_steps}): nothing to train; overwrite_output_dir true starts afresh")
        return done, {}
    if args.overwrite_output_dir and not args.resume_from_checkpoint and trainer.is_world_process_zero():
        clear_previous_run(args.output_dir)
    _barrier()
    train_metrics = train_or_resume(trainer, args, tracker_cb, guard, checkpoint)
    if benchmark:
        return None, train_metrics
    # one plain checkpoint (pipeline stages gathered, tensor-parallel slices merged) that a single process loads
    build_strategy(args).save_trainer_model(trainer, args.output_dir)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(args.output_dir)
    trainer.save_state()
    return None, train_metrics


def trainer_closing_text(trainer, args, summary):
    """The lines that end an SFT / reward-model / DPO run (`console_report.closing_summary`): what
    it reached and where its model (or adapter), checkpoint, metrics and VisualDL logs are."""
    name = type(trainer).__name__.replace("Trainer", "") or "training"
    model = "adapter (LoRA)" if os.path.isfile(os.path.join(args.output_dir, "lora_config.json")) else "model"
    models = [(model, "")] if args.do_train and not getattr(args, "benchmark", False) else [("timing report", REPORT_FILE)]
    paths = output_paths(args.output_dir, args.logging_dir, args.report_to, models)
    return closing_summary(f"{name} finished", summary, paths)
