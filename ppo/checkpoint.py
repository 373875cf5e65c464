"""Atomic PPO checkpoints and resume.

`output_dir/checkpoint-<step>/` holds `policy/` and `value/` (PaddleNLP layout,
loadable with `from_pretrained`), each rank's optimiser and scheduler states,
and `trainer_state.json` (step, data position, normaliser state, metrics so far).
It is written under a temporary name and renamed when complete, so a run killed
mid-save leaves the previous checkpoint intact; only complete directories are
resumed from. `output_dir/policy` and `output_dir/value` are refreshed the same
way at every save and at the end.
"""
import json
import os
import re
import shutil

import paddle
import paddle.distributed as dist

from .models.loading import unwrap_parallel

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"


def barrier():
    if dist.get_world_size() > 1:
        dist.barrier()


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


def replace_dir_atomically(tmp_path, final_path):
    """Move `tmp_path` to `final_path`, replacing an existing directory."""
    old = final_path + ".old"
    if os.path.exists(old):
        shutil.rmtree(old)
    if os.path.exists(final_path):
        os.rename(final_path, old)
    os.rename(tmp_path, final_path)
    if os.path.exists(old):
        shutil.rmtree(old)


def save_model_dir(model, path, tokenizer=None):
    """`save_pretrained` of the innermost model (LoRA adapters save as adapters)."""
    inner = unwrap_parallel(model)
    inner.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def save_checkpoint(output_dir, step, models, optimizers, schedulers, state, tokenizer, save_total_limit=None):
    """Write `checkpoint-<step>` atomically; every rank calls this (collective)."""
    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp = os.path.join(output_dir, f"tmp-checkpoint-{step}")
    rank = dist.get_rank()
    if is_main_process():
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
        for name, model in models.items():
            if model is not None:
                save_model_dir(model, os.path.join(tmp, name), tokenizer)
    barrier()
    for name, opt in optimizers.items():
        if opt is not None:
            opt_state = rename_optimizer_state(opt.state_dict(), _param_names(models[name]))
            paddle.save(opt_state, os.path.join(tmp, f"{name}_optimizer.rank{rank}.pdopt"))
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
                shutil.copytree(os.path.join(final, name), os.path.join(output_dir, f"tmp-{name}"))
                replace_dir_atomically(os.path.join(output_dir, f"tmp-{name}"), os.path.join(output_dir, name))
        if save_total_limit:
            for _, path in list_checkpoints(output_dir)[:-save_total_limit]:
                shutil.rmtree(path, ignore_errors=True)
    barrier()
    return final


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


def load_model_weights(model, path):
    """Load `path`'s saved weights into `model` (full model or LoRA adapter) in place."""
    inner = unwrap_parallel(model)
    candidates = ["lora_model_state.pdparams", "model_state.pdparams"]
    for name in candidates:
        file = os.path.join(path, name)
        if os.path.isfile(file):
            inner.set_state_dict(paddle.load(file))
            return
    raise FileNotFoundError(f"{path}: no model weights ({' or '.join(candidates)})")


def load_checkpoint(path, models, optimizers, schedulers):
    """Restore weights, optimiser and scheduler states from `path`; returns the trainer state dict."""
    rank = dist.get_rank()
    for name, model in models.items():
        if model is not None:
            load_model_weights(model, os.path.join(path, name))
    for name, opt in optimizers.items():
        if opt is not None:
            state = paddle.load(os.path.join(path, f"{name}_optimizer.rank{rank}.pdopt"))
            to_runtime = {v: k for k, v in _param_names(models[name]).items()}
            opt.set_state_dict(rename_optimizer_state(state, to_runtime))
    with open(os.path.join(path, "schedulers.json")) as f:
        sched_states = json.load(f)
    for name, sched in schedulers.items():
        if sched is not None and name in sched_states:
            sched.set_state_dict(sched_states[name])
    with open(os.path.join(path, STATE_FILE)) as f:
        return json.load(f)
