"""Atomic PPO checkpoints and resume.

`output_dir/checkpoint-<step>/` holds `policy/` and `value/` (PaddleNLP layout,
loadable with `from_pretrained`), each rank's optimiser and scheduler states,
and `trainer_state.json` (step, data position, normaliser state, metrics so far).
It is written under a temporary name and renamed when complete, so a run killed
mid-save leaves the previous checkpoint intact; only complete directories are
resumed from. `output_dir/policy` and `output_dir/value` are refreshed the same
way at every save and at the end.

A kill can still fall between two steps of a save; `clean_partial_saves` repairs
what it leaves (`tmp-*` copies, a `policy.old` whose replacement never arrived)
at the next start. `clear_previous_run` removes an earlier run's checkpoints
when a run starts afresh (`overwrite_output_dir`), so rotation and resume never
mix two runs. Rotation keeps the newest checkpoints by age, not by step number.
The PaddleNLP `Trainer` writes its checkpoints in place; `is_complete_trainer_checkpoint`
tells a finished one from one cut short.
"""
import glob
import json
import logging
import os
import pickle
import random
import re
import shutil

import numpy as np
import paddle
import paddle.distributed as dist

from .resume_check import check_ppo_checkpoint
from ..common.training_world import training_group, training_world_size
from ..common.validation import weights_problem
from ..models.loading import unwrap_parallel

logger = logging.getLogger("ppo.checkpoint")
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"
TMP_PREFIX = "tmp-"
OLD_SUFFIX = ".old"
RUN_FILES = ("samples.jsonl",)  # per-run traces besides metrics.jsonl (which RunTracker resets)


def barrier():
    if training_world_size() > 1:  # a split run's rollout ranks are not part of the checkpoint
        dist.barrier(group=training_group())


def is_main_process():
    return dist.get_rank() == 0


def list_checkpoints(output_dir):
    """Complete checkpoints in `output_dir`, oldest first, as `(step, path)`."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = CHECKPOINT_RE.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.isfile(os.path.join(path, STATE_FILE)):
            found.append((int(m.group(1)), path))
    return sorted(found)


def clean_partial_saves(output_dir):
    """Repair what a save killed midway leaves in `output_dir`; returns what was done.

    `tmp-*` directories are incomplete copies and are removed. `X.old` is the
    previous `X` during a replace: when `X` exists the replace finished and
    `X.old` is removed; otherwise `X.old` is renamed back to `X`.
    """
    done = []
    if not os.path.isdir(output_dir):
        return done
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if not os.path.isdir(path):
            continue
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(path)
            done.append(f"removed {name}")
        elif name.endswith(OLD_SUFFIX):
            final = path[: -len(OLD_SUFFIX)]
            if os.path.exists(final):
                shutil.rmtree(path)
                done.append(f"removed {name}")
            else:
                os.rename(path, final)
                done.append(f"restored {os.path.basename(final)} from {name}")
    if done:
        logger.warning(f"{output_dir}: repaired an interrupted save: {'; '.join(done)}")
    return done


def clear_previous_run(output_dir):
    """Remove an earlier run's `checkpoint-*` directories and per-run traces from `output_dir`
    (a fresh run with `overwrite_output_dir`); returns the removed names."""
    removed = []
    if not os.path.isdir(output_dir):
        return removed
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if os.path.isdir(path) and CHECKPOINT_RE.match(name):
            shutil.rmtree(path)
            removed.append(name)
        elif name in RUN_FILES and os.path.isfile(path):
            os.remove(path)
            removed.append(name)
    if removed:
        logger.warning(f"overwrite_output_dir: removed the previous run's {', '.join(removed)} from {output_dir}")
    return removed


def checkpoint_age_order(paths):
    """`paths` oldest first by the modification time of their state file (the directory's own
    time as a fall-back), the step number breaking ties."""

    def key(path):
        state = os.path.join(path, STATE_FILE)
        m = CHECKPOINT_RE.match(os.path.basename(path))
        return (os.path.getmtime(state if os.path.exists(state) else path), int(m.group(1)) if m else -1)

    return sorted(paths, key=key)


def rotate_checkpoints(output_dir, limit, keep=()):
    """Delete all but the newest `limit` `checkpoint-*` directories by age (never one in `keep`);
    returns the deleted paths. `limit` None or <= 0 keeps everything."""
    if not limit or limit <= 0:
        return []
    paths = [os.path.join(output_dir, n) for n in os.listdir(output_dir) if CHECKPOINT_RE.match(n)]
    keep = {os.path.abspath(p) for p in keep if p}
    doomed = [p for p in checkpoint_age_order(paths)[:-limit] if os.path.abspath(p) not in keep]
    for path in doomed:
        logger.info(f"deleting older checkpoint {path} (save_total_limit={limit})")
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def incomplete_reason(path, need_optimizer=True):
    """Why the PaddleNLP `Trainer` checkpoint `path` is not complete (None when it is).

    The Trainer writes the model, `trainer_state.json`, the RNG state, the optimizer
    and last the scheduler into `checkpoint-<step>/` in place; a kill leaves some of
    them missing or cut short (each is a pickle or safetensors file, checked by size
    and end marker only).
    """
    if not os.path.isfile(os.path.join(path, STATE_FILE)):
        return f"no {STATE_FILE}"
    if need_optimizer and not os.path.isfile(os.path.join(path, "scheduler.pdparams")):
        return "no scheduler.pdparams (the save stopped before its end)"
    for pattern in ("*.pdparams", "*.pdopt", "*.pth", "*.safetensors"):
        for file in glob.glob(os.path.join(path, pattern)):
            problem = weights_problem(file)
            if problem:
                return f"{os.path.basename(file)} {problem}"
    return None


def last_complete_trainer_checkpoint(output_dir, need_optimizer=True):
    """The newest complete `checkpoint-*` of a Trainer run in `output_dir` (None if there is
    none); incomplete newer ones are skipped with a warning naming what they lack."""
    if not os.path.isdir(output_dir):
        return None
    found = sorted(
        ((int(m.group(1)), os.path.join(output_dir, n)) for n in os.listdir(output_dir) if (m := CHECKPOINT_RE.match(n))),
        reverse=True,
    )
    for _, path in found:
        reason = incomplete_reason(path, need_optimizer)
        if reason is None:
            return path
        logger.warning(f"skipping incomplete checkpoint {path}: {reason}")
    return None


def prepare_output_dir(output_dir, fresh):
    """Start of a run (all ranks call it): repair interrupted saves and, for a `fresh` run,
    remove the previous run's checkpoints and traces."""
    if is_main_process():
        clean_partial_saves(output_dir)
        if fresh:
            clear_previous_run(output_dir)
    barrier()


def replace_dir_atomically(tmp_path, final_path):
    """Move `tmp_path` to `final_path`, replacing an existing directory."""
    old = final_path + OLD_SUFFIX
    if os.path.exists(old):
        shutil.rmtree(old)
    if os.path.exists(final_path):
        os.rename(final_path, old)
    os.rename(tmp_path, final_path)
    if os.path.exists(old):
        shutil.rmtree(old)


def save_checkpoint(output_dir, step, models, optimizers, schedulers, state, tokenizer, save_total_limit, model_io,
                    file_parts=()):
    """Write `checkpoint-<step>` atomically; every rank calls this (collective). `model_io`: the
    run's strategy, which writes each model (`saves_models`, `save_model`); `file_parts`: objects
    whose `save_files(directory, rank)` writes this rank's files of them (the best policy's weights)."""
    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp = os.path.join(output_dir, f"tmp-checkpoint-{step}")
    rank = dist.get_rank()
    if is_main_process():
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    barrier()
    if model_io.saves_models():
        for name, model in models.items():
            if model is not None:
                model_io.save_model(model, os.path.join(tmp, name), tokenizer)
    barrier()
    for name, opt in optimizers.items():
        if opt is not None:
            opt_state = rename_optimizer_state(opt.state_dict(), _param_names(models[name]))
            paddle.save(opt_state, os.path.join(tmp, f"{name}_optimizer.rank{rank}.pdopt"))
    with open(os.path.join(tmp, f"rng_state.rank{rank}.pkl"), "wb") as f:
        pickle.dump(random_states(), f)
    for part in file_parts:
        part.save_files(tmp, rank)
    barrier()
    if is_main_process():
        sched_states = {name: s.state_dict() for name, s in schedulers.items() if s is not None}
        with open(os.path.join(tmp, "schedulers.json"), "w") as f:
            json.dump(sched_states, f)
        with open(os.path.join(tmp, STATE_FILE), "w") as f:  # written last: marks completeness
            json.dump(state, f, indent=2)
        replace_dir_atomically(tmp, final)
        for name, model in models.items():  # refresh output_dir/policy, output_dir/value
            if model is not None:
                tmp_copy = os.path.join(output_dir, f"{TMP_PREFIX}{name}")
                if os.path.exists(tmp_copy):  # left by a killed save
                    shutil.rmtree(tmp_copy)
                shutil.copytree(os.path.join(final, name), tmp_copy)
                replace_dir_atomically(tmp_copy, os.path.join(output_dir, name))
        rotate_checkpoints(output_dir, save_total_limit, keep=[final])
    barrier()
    return final


def save_final_models(output_dir, models, tokenizer, model_io):
    """Write `output_dir/<name>` for each model (PaddleNLP layout) without a checkpoint: the end
    of a run with `save_strategy no`. Every rank calls this (collective); `model_io` as in
    `save_checkpoint`."""
    for name, model in models.items():
        if model is None:
            continue
        tmp = os.path.join(output_dir, f"{TMP_PREFIX}{name}")
        if is_main_process() and os.path.exists(tmp):  # left by a killed save
            shutil.rmtree(tmp)
        if model_io.saves_models():  # rank 0 and the ranks its merge gathers from
            model_io.save_model(model, tmp, tokenizer)
        barrier()
        if is_main_process():
            replace_dir_atomically(tmp, os.path.join(output_dir, name))
    barrier()


def random_states():
    """This process's random generators (Python, NumPy, Paddle's), as PaddleNLP's Trainer saves
    them in `rng_state.pth`: a resumed run then samples what the uninterrupted run would have."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "paddle": paddle.get_rng_state(),
            "cpu": paddle.framework.core.default_cpu_generator().get_state()}


def restore_random_states(file):
    """Restore what `random_states` saved into `file`; a checkpoint without it (written before
    they were saved) leaves the generators as they are, with a warning."""
    if not os.path.isfile(file):
        logger.warning(f"{file} not found: the random generators are not restored, so sampling differs from the "
                       "uninterrupted run's")
        return
    with open(file, "rb") as f:
        states = pickle.load(f)
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    paddle.set_rng_state(states["paddle"])
    paddle.framework.core.default_cpu_generator().set_state(states["cpu"])


def _param_names(model):
    """`{runtime parameter name: structured name}`; runtime names differ between processes."""
    inner = unwrap_parallel(model)
    return {p.name: n for n, p in inner.named_parameters()}


def rename_optimizer_state(state, mapping):
    """Rename accumulator keys `<param name>_<suffix>` through `mapping` (longest prefix wins).
    Keys of no parameter (the scheduler, step counters) pass unchanged."""
    prefixes = sorted(mapping, key=len, reverse=True)
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):  # e.g. master_weights: {param name: tensor}
            value = {mapping.get(k, k): v for k, v in value.items()}
        new_key = key
        for prefix in prefixes:
            if key == prefix or key.startswith(prefix + "_"):
                new_key = mapping[prefix] + key[len(prefix):]
                break
        out[new_key] = value
    return out


def load_model_weights(model, path, model_io):
    """Load `path`'s saved weights into `model` (full model or LoRA adapter) in place, through
    `model_io` (the run's strategy: it cuts them to this rank's part)."""
    candidates = ["lora_model_state.pdparams", "model_state.pdparams"]
    for name in candidates:
        file = os.path.join(path, name)
        if os.path.isfile(file):
            model_io.load_weights(model, paddle.load(file))
            return
    raise FileNotFoundError(f"{path}: no model weights ({' or '.join(candidates)})")


def load_checkpoint(path, models, optimizers, schedulers, run_facts, model_io, file_parts=()):
    """Restore weights, optimiser and scheduler states from `path`; returns the trainer state dict.
    Before anything loads, the checkpoint is compared with the run (model shapes, and the
    `run_facts` of `ppo.checkpoints.resume_check.ppo_run_facts`; `model_io`: the run's strategy,
    which loads each model's weights): a difference raises
    CheckpointMismatchError naming it. A checkpoint saved without optimiser states (its state
    has `"optimizer_states": false`, PaddleNLP's `ignore_save_lr_and_optim`) leaves the
    optimisers fresh. `file_parts` (as in `save_checkpoint`) read their files with
    `load_files(directory, rank)` once the caller has restored their state: `load_part_files`."""
    rank = dist.get_rank()
    with open(os.path.join(path, STATE_FILE)) as f:
        trainer_state = json.load(f)
    check_ppo_checkpoint(path, models, run_facts or {}, trainer_state)
    for name, model in models.items():
        if model is not None:
            load_model_weights(model, os.path.join(path, name), model_io)
    if not trainer_state.get("optimizer_states", True):
        optimizers = {}
        logger.warning(f"{path} has no optimizer states (ignore_save_lr_and_optim): AdamW moments start afresh")
    for name, opt in optimizers.items():
        if opt is not None:
            state = paddle.load(os.path.join(path, f"{name}_optimizer.rank{rank}.pdopt"))
            to_runtime = {v: k for k, v in _param_names(models[name]).items()}
            opt.set_state_dict(rename_optimizer_state(state, to_runtime))
    restore_random_states(os.path.join(path, f"rng_state.rank{rank}.pkl"))
    with open(os.path.join(path, "schedulers.json")) as f:
        sched_states = json.load(f)
    for name, sched in schedulers.items():
        if sched is not None and name in sched_states:
            sched.set_state_dict(sched_states[name])
    return trainer_state


def load_part_files(path, file_parts):
    """Each of `file_parts` reads this rank's files from the checkpoint `path`."""
    for part in file_parts:
        part.load_files(path, dist.get_rank())
