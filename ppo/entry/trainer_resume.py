"""Resume of the PaddleNLP `Trainer`-based stages (SFT, RM, DPO) from checkpoints without
optimizer states.

A checkpoint saved with `ignore_save_lr_and_optim` holds the weights, `trainer_state.json` and
the RNG state but no `optimizer.pdopt` or `scheduler.pdparams`; PaddleNLP's Trainer then
refuses every resume ("optimizer-state-dict not found"). Here such a resume starts a fresh
optimizer (AdamW moments at zero) with a warning, and moves the learning-rate schedule on to the
checkpoint's step, so the rate continues where the saved run left it.

Before every optimiser step a parameter the optimiser holds moments for and that has no gradient
gets a zero gradient (`ppo.optimization.stepped`): a resumed run steps an expert that no token
reached as the uninterrupted run does.
"""
import json
import logging
import os

from paddlenlp.trainer import TrainerCallback

logger = logging.getLogger("ppo")

OPTIMIZER_FILE = "optimizer.pdopt"


def saved_global_step(checkpoint):
    """The `global_step` recorded in `checkpoint/trainer_state.json` (0 when absent)."""
    path = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return int(json.load(f).get("global_step", 0))


def optimizer_file(checkpoint, suffix=""):
    """Path of the Trainer's optimizer states in `checkpoint` (PaddleNLP's `_add_variant`)."""
    name = OPTIMIZER_FILE if not suffix else OPTIMIZER_FILE.replace(".pdopt", f".{suffix}.pdopt")
    return os.path.join(checkpoint, name)


def has_optimizer_states(checkpoint, args):
    """Whether `checkpoint` holds optimizer states this run can load (a sharded or unified
    checkpoint keeps them elsewhere and is left to PaddleNLP)."""
    if args.unified_checkpoint or args.should_load_sharding_stage1_model:
        return True
    return os.path.isfile(optimizer_file(checkpoint, args.optimizer_name_suffix or ""))


class SteppedGradientsCallback(TrainerCallback):
    """`zero_missing_gradients` before each of the Trainer's optimiser steps."""

    def on_optimizer_begin(self, args, state, control, optimizer=None, **kwargs):
        from ppo.optimization.stepped import zero_missing_gradients

        if optimizer is not None:
            zero_missing_gradients(optimizer)


class FreshOptimizerResumeMixin:
    """For PaddleNLP `Trainer` subclasses: resuming from a checkpoint without optimizer states
    (`ignore_save_lr_and_optim`) keeps the fresh optimizer, warns, and steps the learning-rate
    scheduler to the checkpoint's global step, instead of failing; a parameter stepped before
    is stepped at every step, also after a resume (`SteppedGradientsCallback`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(SteppedGradientsCallback())

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None or has_optimizer_states(checkpoint, self.args):
            return super()._load_optimizer_and_scheduler(checkpoint)
        step = saved_global_step(checkpoint)
        if self.lr_scheduler is not None and step > 0:
            self.lr_scheduler.step(step)
        logger.warning(
            f"{checkpoint} has no optimizer states (saved with ignore_save_lr_and_optim): resuming its weights at "
            f"step {step} with a fresh optimizer (AdamW moments start at zero); the learning rate continues at "
            f"{self.lr_scheduler.get_lr() if self.lr_scheduler is not None else 'its fixed value'}"
        )
