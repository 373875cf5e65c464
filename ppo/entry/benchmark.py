"""PaddleNLP's `benchmark: true` for the `Trainer` entry points (SFT, the reward model, the DPO
family): train only, and time it.

PaddleNLP's `SFTConfig` / `DPOConfig` with `benchmark` turn evaluation, checkpoints and the final
save off, and its `llm/alignment` scripts log "[timelog]" lines with effective tokens per second
(`calculate_effective_tokens`). Here `BenchmarkCallback` keeps every evaluation and checkpoint
save off, counts the tokens of the batches the Trainer takes, and writes the timing report
`output_dir/benchmark.json` when training ends; `ppo.entry.run_setup.finish_trainer_run` saves
no model and runs no final evaluation in this mode.
"""
import json
import logging
import os
import time

import numpy as np
from paddlenlp.trainer import TrainerCallback

logger = logging.getLogger("ppo")

REPORT_FILE = "benchmark.json"


def batch_tokens(inputs, pad_token_id):
    """`(rows, real tokens, padded tokens)` of a collated batch: over every `*input_ids` tensor
    `[B, T]`, the tokens its `*attention_mask` marks (a 2-D mask; packed rows with a 4-D mask
    count the non-pad ids) and all `B * T` positions."""
    rows = real = padded = 0
    for key, ids in inputs.items():
        if not key.endswith("input_ids"):
            continue
        ids = np.asarray(ids)
        mask = inputs.get(key[: -len("input_ids")] + "attention_mask")
        mask = None if mask is None else np.asarray(mask)
        rows = max(rows, ids.shape[0])
        padded += ids.size
        real += int(mask.sum()) if mask is not None and mask.ndim == 2 else int((ids != pad_token_id).sum())
    return rows, real, padded


def timing_report(seconds, steps, rows, real, padded, step_seconds):
    """The report's numbers: totals, rates per second, and the optimiser steps' wall times (the
    first, which includes warm-up, apart from the rest)."""
    rate = (lambda x: x / seconds) if seconds > 0 else (lambda x: 0.0)
    later = step_seconds[1:]
    return {
        "train_runtime_s": seconds, "steps": steps, "samples": rows, "tokens": real, "padded_tokens": padded,
        "effective_token_ratio": real / padded if padded else 0.0,
        "steps_per_s": rate(steps), "samples_per_s": rate(rows), "tokens_per_s": rate(real),
        "padded_tokens_per_s": rate(padded),
        "step_time_s": {
            "first": step_seconds[0] if step_seconds else None,
            "mean_after_first": float(np.mean(later)) if later else None,
            "min_after_first": float(np.min(later)) if later else None,
            "max_after_first": float(np.max(later)) if later else None,
        },
    }


class BenchmarkCallback(TrainerCallback):
    """Turns evaluation and checkpoint saves off at every step and epoch end, counts the tokens
    of each batch the Trainer loads, and writes `output_dir/benchmark.json` at the end of training."""

    def __init__(self, output_dir, pad_token_id):
        self.path = os.path.join(output_dir, REPORT_FILE)
        self.pad_token_id = pad_token_id
        self.rows = self.real = self.padded = 0
        self.step_seconds, self.start, self.last, self.first_step = [], None, None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = self.last = time.perf_counter()
        self.first_step = state.global_step

    def on_load_data_end(self, args, state, control, inputs=None, **kwargs):
        if inputs is not None:  # None: a resumed stream's placeholder for a skipped step
            rows, real, padded = batch_tokens(inputs, self.pad_token_id)
            self.rows, self.real, self.padded = self.rows + rows, self.real + real, self.padded + padded

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_seconds.append(now - self.last)
        self.last = now
        control.should_save = control.should_evaluate = False

    def on_epoch_end(self, args, state, control, **kwargs):
        control.should_save = control.should_evaluate = False

    def on_train_end(self, args, state, control, **kwargs):
        report = timing_report(time.perf_counter() - self.start, state.global_step - self.first_step, self.rows,
                               self.real, self.padded, self.step_seconds)
        if args.should_save:
            with open(self.path, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=2)
        logger.info(f"[timelog] benchmark: {report['steps']} steps in {report['train_runtime_s']:.2f} s, "
                    f"{report['tokens_per_s']:.1f} tokens/s ({100 * report['effective_token_ratio']:.1f} % of the "
                    f"padded batches), {report['samples_per_s']:.2f} samples/s; report: {self.path}")
